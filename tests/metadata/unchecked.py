"""Plant a plan in a SQLite metadata file without any validation: how a plan written by an
older or buggy writer (or a corrupted database) looks to a reader."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec

from blobsdk.metadata import SqliteMetadataStore
from blobsdk.testing.plans import put
from blobsdk.wire import ReadPlan


async def plant_plan(db: Path, path: str, plan: ReadPlan) -> None:
    """Commit a valid plan at ``path`` in ``db``, then overwrite its stored bytes with ``plan``."""
    async with SqliteMetadataStore(db) as store:
        await put(store, path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE plans SET plan = ? WHERE path = ?", (msgspec.msgpack.encode(plan), path))
    conn.close()


def move_plan(db: Path, path: str, to: str) -> None:
    """Move the live plan at ``path`` to ``to`` in ``db``, unchecked: what an older build, which
    let a user write anywhere (under ``/{bucket}/.blobsdk/`` too), would have left."""
    with sqlite3.connect(db) as conn:
        (blob,) = conn.execute("SELECT plan FROM plans WHERE path = ?", (path,)).fetchone()
        plan = msgspec.structs.replace(msgspec.msgpack.decode(blob, type=ReadPlan), path=to)
        conn.execute("UPDATE plans SET path = ?, plan = ? WHERE path = ?", (to, msgspec.msgpack.encode(plan), path))
        conn.execute("UPDATE block_refs SET path = ? WHERE path = ?", (to, path))
    conn.close()
