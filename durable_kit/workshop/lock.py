"""The lock (``constraints.txt``) for one Python and one kind of machine: what it pins there, and its wheels.

``constraints.txt`` is one universal lock for every Python from 3.10 and
every system, made by ``uv pip compile --universal``: a pin whose marker
names a Python version or a system applies only there. pip evaluates such
markers against the Python that runs it, even when told to download for
another (``--python-version``), so this module evaluates them itself and
hands pip the exact pins with ``--no-deps``.

Three sets, each a subset of the lock: ``light`` (the packages every
notebook of the 3-hour track needs: ``pip install -e .``), ``workshop``
(every notebook: ``.[workshop]``) and ``all`` (with the test tooling:
``.[workshop,test]``). A package belongs to a set when the project asks for
it there, or when a package of the set depends on it (the lock's ``# via``
lines).

``python -m durable_kit.workshop.lock --python 3.13 --system macos-arm64 --set workshop --download DIR``
fills a wheelhouse for that Python and system; ``--check`` downloads every
pinned wheel for each Python and system asked (into a temporary folder) and
prints one line each: the lock installs there, or what is missing;
``--installed`` names each package this environment has at another version
than the lock (the drift check prints it); ``--differences`` prints the
project's requirements whose pin depends on the Python version.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints.txt"
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
SETS = {"light": (), "workshop": ("workshop",), "all": ("workshop", "test")}
_MANYLINUX = [f"manylinux_2_{minor}" for minor in range(28, 16, -1)] + ["manylinux2014"]  # glibc 2.28 or newer
SYSTEMS = {  # name: (the markers pip sees on such a machine, the wheel platforms it accepts there)
    "linux-x86_64": ({"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
                     [f"{tag}_x86_64" for tag in _MANYLINUX]),
    "linux-aarch64": ({"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
                      [f"{tag}_aarch64" for tag in _MANYLINUX]),
    "macos-arm64": ({"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
                    ["macosx_12_0_arm64"]),  # pip accepts every older macOS and universal2 wheel too
    "macos-x86_64": ({"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "x86_64"},
                     ["macosx_12_0_x86_64"]),
}


@dataclass
class Pin:
    """One line of the lock: ``name==version ; marker``, and the packages it is there for (``# via``)."""

    name: str
    version: str
    marker: str | None
    via: set[str] = field(default_factory=set)


def normalized(name: str) -> str:
    """A distribution name as the lock and pip compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> list[Pin]:
    """Every pin of the lock, in order, each with the names it is needed by."""
    pins: list[Pin] = []
    via_block = False
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            requirement, _, marker = line.partition(";")
            name, _, version = requirement.strip().partition("==")
            pins.append(Pin(normalized(name), version.strip(), marker.strip() or None))
            via_block = False
        elif pins and line.strip().startswith("# via"):
            parent = line.strip()[len("# via"):].strip()
            via_block = not parent
            if parent:
                pins[-1].via.add(parent)
        elif pins and via_block and line.strip().startswith("#   "):
            pins[-1].via.add(line.strip()[1:].strip())
    return pins


def environment(python: str, system: str) -> dict[str, str]:
    """The marker variables pip would see running Python ``python`` (``3.X``, meaning 3.X.0, or ``3.X.Y``)."""
    markers, _ = SYSTEMS[system]
    full = python if python.count(".") == 2 else f"{python}.0"
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full, "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
            "platform_release": "", "platform_version": "", **markers}


def pyproject() -> dict:
    """pyproject.toml, read."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the test extra brings tomli
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def project_requirements(names: tuple[str, ...]) -> list[str]:
    """The requirements pyproject.toml gives the project with the extras ``names`` (each extra's own extras too)."""
    project = pyproject()["project"]
    found, wanted, seen = list(project["dependencies"]), list(names), set()
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            own = re.fullmatch(rf"{project['name']}\[(.+)\]", requirement.replace(" ", ""))
            if own:
                wanted.extend(own.group(1).split(","))
            else:
                found.append(requirement)
    return found


def pins_for(python: str, system: str, which: str = "all", path: Path = LOCK) -> list[Pin]:
    """The pins that apply to Python ``python`` on ``system``, limited to the set ``which``."""
    from packaging.markers import Marker
    from packaging.requirements import Requirement

    env = environment(python, system)
    applying = [pin for pin in read_lock(path) if pin.marker is None or Marker(pin.marker).evaluate(env)]
    roots = set()
    for text in project_requirements(SETS[which]):
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(env):
            roots.add(normalized(requirement.name))
    needed, grew = set(roots), True
    while grew:  # a pin is needed when anything needed depends on it
        grew = False
        for pin in applying:
            if pin.name not in needed and {normalized(p.split(" ")[0]) for p in pin.via} & needed:
                needed.add(pin.name)
                grew = True
    return [pin for pin in applying if pin.name in needed]


def differences(system: str = "linux-x86_64") -> dict[str, dict[str, str]]:
    """The project's own requirements whose pin depends on the Python version: ``{name: {python: version}}``."""
    from packaging.requirements import Requirement

    names = {normalized(Requirement(text).name) for text in project_requirements(SETS["all"])}
    table: dict[str, dict[str, str]] = {}
    for python in PYTHONS:
        for pin in pins_for(python, system, "all"):
            if pin.name in names:
                table.setdefault(pin.name, {})[python] = pin.version
    return {name: by_python for name, by_python in sorted(table.items()) if len(set(by_python.values())) > 1}


def differences_table(system: str = "linux-x86_64") -> str:
    """``differences`` as a Markdown table: one row per requirement, one column per Python."""
    rows = [f"| {name} | " + " | ".join(by_python.get(p, "-") for p in PYTHONS) + " |"
            for name, by_python in differences(system).items()]
    return "\n".join(["| package | " + " | ".join(PYTHONS) + " |", "|---" * (len(PYTHONS) + 1) + "|", *rows])


def this_system() -> str:
    """The name in ``SYSTEMS`` of the machine this runs on: macOS or else Linux, ARM or else x86-64."""
    import platform

    arm = platform.machine().lower() in ("arm64", "aarch64")
    if sys.platform == "darwin":
        return "macos-arm64" if arm else "macos-x86_64"
    return "linux-aarch64" if arm else "linux-x86_64"


def installed_differences(which: str = "all") -> list[str]:
    """Each package of the set whose version here is not the lock's: ``name: lock X, installed Y``."""
    from importlib.metadata import PackageNotFoundError, version

    import platform

    python, lines = platform.python_version(), []
    for pin in pins_for(python, this_system(), which):
        try:
            found = version(pin.name)
        except PackageNotFoundError:
            found = "not installed"
        if found != pin.version:
            lines.append(f"{pin.name}: lock {pin.version}, installed {found}")
    return lines


def download_command(python: str, system: str, pins: list[Pin], folder: Path) -> list[str]:
    """``pip download`` of exactly these pins' wheels for that Python and system, no source builds; and the build
    backend an offline ``pip install -e .`` needs (pyproject's ``[build-system]``, not pinned by the lock)."""
    _, platforms = SYSTEMS[system]
    return [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", *(f"--platform={p}" for p in platforms),
            "--dest", str(folder), *pyproject()["build-system"]["requires"],
            *(f"{pin.name}=={pin.version}" for pin in pins)]


def download(python: str, system: str, which: str, folder: Path) -> tuple[bool, str]:
    """Download the set's wheels into ``folder``; whether every one was found, and one line saying so."""
    pins = pins_for(python, system, which)
    done = subprocess.run(download_command(python, system, pins, folder), capture_output=True, text=True)
    if done.returncode != 0:
        missing = re.findall(r"No matching distribution found for (\S+)", done.stderr)
        why = ", ".join(missing) or done.stderr.strip().splitlines()[-1]
        return False, f"FAIL  Python {python} on {system}, {which}: no wheel for {why}"
    size = sum(f.stat().st_size for f in folder.iterdir())
    return True, (f"ok    Python {python} on {system}, {which}: {len(pins)} pinned packages and the build backend, "
                  f"{len(list(folder.iterdir()))} wheels, {size / 1e6:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_kit.workshop.lock", description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="append", choices=PYTHONS, help="a Python version (default: each)")
    parser.add_argument("--system", action="append", choices=list(SYSTEMS), help="a system (default: linux-x86_64)")
    parser.add_argument("--set", default="all", choices=list(SETS), help="which packages (default: all)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print the pins that apply, one a line")
    what.add_argument("--differences", action="store_true",
                      help="the project's requirements whose pin depends on the Python version, as a table")
    what.add_argument("--download", metavar="DIR", help="download their wheels into DIR (a wheelhouse)")
    what.add_argument("--check", action="store_true", help="download each into a temporary folder: all found?")
    what.add_argument("--installed", action="store_true",
                      help="compare this environment with the lock: each package of the set at another version "
                           "(exit code 1 if any)")
    args = parser.parse_args(argv)
    pythons, systems = args.python or list(PYTHONS), args.system or ["linux-x86_64"]
    if args.installed:
        moved = installed_differences(args.set)
        print("\n".join(moved) if moved else f"every package of the {args.set} set is at the lock's version")
        return 1 if moved else 0
    if args.differences:
        print(differences_table(systems[0]))
        return 0
    if args.list:
        for python in pythons:
            for system in systems:
                print("\n".join(f"{pin.name}=={pin.version}" for pin in pins_for(python, system, args.set)))
        return 0
    if args.download and (len(pythons) > 1 or len(systems) > 1):
        parser.error("--download fills one wheelhouse: give one --python and one --system")
    results = []
    for minor in pythons:
        for system in systems:
            # A lock may split inside a minor version (a release that needs 3.11.5, say): then both sides, which a
            # wheelhouse holds together.
            first, later = f"{minor}.0", f"{minor}.99"
            split = pins_for(first, system, args.set) != pins_for(later, system, args.set)
            for python in ((first, later) if split else (minor,)):
                results.append(fetch(python, system, args.set, args.download))
                print(results[-1][1], flush=True)
    return 0 if all(ok for ok, _ in results) else 1


def fetch(python: str, system: str, which: str, folder: str | None) -> tuple[bool, str]:
    """``download`` into ``folder``, or into a temporary folder removed afterwards."""
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        return download(python, system, which, Path(folder))
    with tempfile.TemporaryDirectory(prefix="lock-check-") as tmp:
        return download(python, system, which, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
