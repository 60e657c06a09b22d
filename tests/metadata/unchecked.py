"""Plant a plan in a SQLite metadata file without any validation: how a plan written by an
older or buggy writer (or a corrupted database) looks to a reader."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec

from blobsdk.metadata.sqlite import SqliteMetadataStore
from blobsdk.wire import ReadPlan

from .conformance import put


async def plant_plan(db: Path, path: str, plan: ReadPlan) -> None:
    """Commit a valid plan at ``path`` in ``db``, then overwrite its stored bytes with ``plan``."""
    async with SqliteMetadataStore(db) as store:
        await put(store, path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE plans SET plan = ? WHERE path = ?", (msgspec.msgpack.encode(plan), path))
    conn.close()
