"""The world outside the workflow: a fake model and fixture sources.

They never touch the journal. Each one counts what it receives in a call
ledger, the way a provider's bill counts requests whether or not the
caller remembered them.
"""
import os
from pathlib import Path


def data_dir() -> Path:
    """The fixture folder: ``$DURABLE_KIT_DATA`` or ``data/`` beside the package."""
    folder = Path(os.environ.get("DURABLE_KIT_DATA", Path(__file__).resolve().parents[2] / "data"))
    if not (folder / "filings.json").exists():
        raise FileNotFoundError(
            f"fixture data not found in {folder}: install durable_kit with 'pip install -e .' from a "
            "checkout of the workshop, or set DURABLE_KIT_DATA to its data/ folder."
        )
    return folder
