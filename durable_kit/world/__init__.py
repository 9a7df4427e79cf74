"""The outside world: the fakes a workflow calls (a model, fixture sources, a notifier, a payment service) and the ledger.

They never touch the journal. Each one counts what it receives in a call
ledger, the way a provider's bill counts requests whether or not the
caller remembered them. Each keeps a file of its own beside the journal
(``beside``), opened by ``connect_outside``.

Which workflow sent a request: every send made by the kit's effect helpers
passes the fault point ``before_send:<action>`` with its workflow's id, and
the harness's boundary hook remembers both on that thread until the next
fault point there (``after_send:<action>``, or the step's failure). The
destinations record them on every request and effect row (``workflow_id``,
``action``); a request sent outside the helpers records neither, and the
crash lab then reads the workflow from the request's key.
"""
import os
import sqlite3
from pathlib import Path

from ..core.store import BOUNDARY_HOOK


def sender() -> tuple[str | None, str | None]:
    """(workflow, action) of the send under way on this thread (the boundary hook's ``sender``); Nones outside one."""
    return BOUNDARY_HOOK["sender"]() or (None, None)  # without the harness's hook, no send is attributed


def data_dir() -> Path:
    """The fixture folder: ``$DURABLE_KIT_DATA`` or ``data/`` beside the package."""
    folder = Path(os.environ.get("DURABLE_KIT_DATA", Path(__file__).resolve().parents[2] / "data"))
    if not (folder / "filings.json").exists():
        raise FileNotFoundError(
            f"fixture data not found in {folder}: install durable_kit with 'pip install -e .' from a "
            "checkout of the workshop, or set DURABLE_KIT_DATA to its data/ folder."
        )
    return folder


def beside(db_path: str | Path, name: str) -> Path:
    """A file next to the journal for one part of the outside world: ``x.db`` -> ``x.<name>.db``."""
    db_path = Path(db_path)
    return db_path.with_name(f"{db_path.stem}.{name}.db")


def connect_outside(path: str | Path, schema: str) -> sqlite3.Connection:
    """A database that stands for the outside world (a provider's bill, a mail server), not the journal.

    Each statement commits on its own, durably (WAL, ``synchronous=FULL``), and
    never inside a journal transaction: what it received stays received.
    """
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=5)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.executescript(schema)
    return conn


def add_column(conn: sqlite3.Connection, table: str, column: str, declaration: str = "TEXT") -> None:
    """Give ``table`` the column if a file made before it existed lacks it (its old rows hold NULL)."""
    if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        except sqlite3.OperationalError as error:  # another process added it between the read and the write
            if "duplicate column" not in str(error):
                raise


class OutsideWorld:
    """A part of the outside world with a file of its own (``self.conn``, from ``connect_outside``).

    Its connection closes when the object is dropped, not at some later
    garbage collection: an sqlite3 connection sits in a reference cycle of its
    own (its statement cache), so a dropped one would hold its file open until
    a full collection, and a long-running worker would gather open files.
    """

    conn: sqlite3.Connection

    def close(self) -> None:
        """Close the connection (again is harmless)."""
        if getattr(self, "conn", None) is not None:
            self.conn.close()

    def __del__(self) -> None:
        try:
            self.close()
        except sqlite3.ProgrammingError:  # dropped on another thread: the connection closes when it is freed
            pass
