"""SQLite metadata store: the embedded default :class:`~blobsdk.metadata.base.MetadataStore`
(a :class:`~blobsdk.metadata.backend.MetadataBackend`: the arguments come checked).

Layout: one row per path in ``plans``, gc's fences in ``fences`` (block id, time set), and
the reverse index ``block_refs`` (block id, path) of every live plan's blocks, kept in the
transaction of each commit and delete (an overwrite or delete decodes the plan it replaces
to drop its rows); :meth:`naming_page` is a range of its primary key.  A database of schema
2 gains the index at its first open by this build (one pass over its plans).
A live row holds the msgpack ReadPlan plus its BlobInfo
columns (so listing never decodes plans); a deleted path keeps a *tombstone* row whose only
non-NULL columns are ``path`` and ``version``, which keeps the version counter monotonic across
delete and re-create.  Lookups are primary-key lookups; listing is a primary-key range scan.

Durability: WAL journal with ``synchronous=FULL``, so the WAL is fsynced before a commit
returns; ``NORMAL`` would let a power loss drop an acknowledged commit (DESIGN §1 inv. 4).

Threading: sqlite3 calls block, so every one of them runs on one dedicated worker thread that
owns the connection; the event loop only waits on futures.  Calls run in submission order.
Cancelling a caller drops its call if it has not started; a commit already running still
completes (as with any remote store, a cancelled commit may or may not have happened).
"""

from __future__ import annotations

import asyncio
import builtins
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

import msgspec

from ..errors import BlobError, BlobNotFound, ClientClosed, Unavailable
from ..runtime import Executor
from ..wire import BlobInfo, CommitOp, ReadPlan, WriteKind
from .backend import MetadataBackend
from .base import block_collected, check_precondition, decode_stored, prefix_end

T = TypeVar("T")

# 2: fences (a build without them would commit fenced blocks: refused); 3: block_refs (a
# build without it would commit plans that repair cannot find: refused).
SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    path TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,  -- last assigned version; tombstones keep it
    size INTEGER,
    etag TEXT,                 -- NULL exactly for tombstones
    created REAL,
    chunks INTEGER,
    plan BLOB                  -- msgpack ReadPlan; last, so listing never reads its overflow pages
)
"""
_FENCES_SCHEMA = "CREATE TABLE IF NOT EXISTS fences (block_id TEXT PRIMARY KEY NOT NULL, at REAL NOT NULL) WITHOUT ROWID"
_REFS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS block_refs (block_id TEXT NOT NULL, path TEXT NOT NULL, "
    "PRIMARY KEY (block_id, path)) WITHOUT ROWID"
)
# Tombstones have NULL etag; testing a small column keeps scans off the plan blobs.
_LIVE = "etag IS NOT NULL"
_INFO_COLUMNS = "path, version, size, etag, created, chunks"
_UPSERT = "REPLACE INTO plans (path, version, size, etag, created, chunks, plan) VALUES (?, ?, ?, ?, ?, ?, ?)"
_TOMBSTONE = "UPDATE plans SET size = NULL, etag = NULL, created = NULL, chunks = NULL, plan = NULL WHERE path = ?"
_IN_CHUNK = 500  # stays well under SQLITE_MAX_VARIABLE_NUMBER on old builds

_plan_decoder = msgspec.msgpack.Decoder(ReadPlan)
_encoder = msgspec.msgpack.Encoder()


class SqliteMetadataStore(MetadataBackend):
    """MetadataStore over one SQLite file (``":memory:"`` works too, without durability).

    The connection opens lazily on first use, or eagerly with ``await store.open()`` or
    ``async with SqliteMetadataStore(path) as store`` (so a bad path fails early).
    ``aclose()`` closes the connection and stops the worker thread; any later call raises
    ClientClosed.  ``busy_timeout`` bounds the wait for another process's write lock before
    a call fails with Unavailable.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> None:
        self.path = os.fspath(path)
        self.busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # touched only on the worker thread (see _connect_once)
        self._closed = False

    def __repr__(self) -> str:
        return f"SqliteMetadataStore({self.path!r})"

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self) -> Self:
        """Connect and create the schema now rather than on first use (idempotent)."""
        await self._run(_noop)
        return self

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            # Queued behind every call already submitted, so those finish first.
            await asyncio.wrap_future(executor.submit(self._disconnect))
        finally:
            executor.shutdown(wait=False)

    # --- the backend's work (MetadataBackend has checked the arguments) -------------------

    async def _get_plan(self, path: str) -> ReadPlan | None:
        return await self._run(_select_plan, path)

    async def _get_plans(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        found = await self._run(_select_plans, builtins.list(dict.fromkeys(paths)))
        return [found.get(path) for path in paths]

    async def _commit_many(self, ops: builtins.list[CommitOp]) -> builtins.list[ReadPlan]:
        """All ops in one transaction; ops naming the same path apply in order."""
        return await self._run(_commit_ops, ops)

    async def _delete(self, path: str, if_version: int | None, kind: WriteKind) -> BlobInfo:
        return await self._run(_delete, path, if_version)

    async def _list_page(self, prefix: str, start_after: str | None, limit: int) -> tuple[builtins.list[BlobInfo], str | None]:
        return await self._run(_list_page, prefix, start_after, limit)

    async def _scan_page(self, start_after: str | None, limit: int) -> tuple[builtins.list[ReadPlan], str | None]:
        return await self._run(_scan_page, start_after, limit)

    async def _naming_page(
        self, block_ids: builtins.list[str], after: tuple[str, str], limit: int
    ) -> tuple[builtins.list[ReadPlan], str | None]:
        return await self._run(_naming_page, block_ids, after, limit)

    async def _fence(self, block_ids: builtins.list[str]) -> None:
        await self._run(_fence, block_ids)

    async def _unfence(self, block_ids: builtins.list[str]) -> None:
        await self._run(_unfence, block_ids)

    async def _prune_fences(self, older_than: float) -> int:
        return await self._run(_prune_fences, older_than)

    # --- the worker thread -----------------------------------------------------------------

    def _worker(self) -> ThreadPoolExecutor:
        if self._closed:
            raise ClientClosed(f"{self!r} is closed")
        if self._executor is None:
            self._executor = Executor(max_workers=1, thread_name_prefix="blobsdk-sqlite")
        return self._executor

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._worker().submit(self._call, fn, *args))

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(self._connection(), *args)
        except sqlite3.OperationalError as exc:  # locked, busy, I/O error, cannot open
            raise Unavailable(f"metadata database {self.path!r}: {exc}") from exc
        except sqlite3.Error as exc:
            raise BlobError(f"metadata database {self.path!r}: {type(exc).__name__}: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = _connect(self.path, self.busy_timeout)
        return self._conn

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# --- SQL, run on the worker thread ---------------------------------------------------------


def _connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A connection in WAL mode with the schema in place.  Processes opening a new database
    at once (a distributed save's ranks, a DataLoader's workers) contend for the switch to
    WAL, and SQLite answers that switch "database is locked" at once, without waiting out
    ``timeout`` as it does for writes: 4 of 240 opens failed so, 8 at a time.  So a locked
    open is tried again, until ``busy_timeout`` has passed."""
    deadline = time.monotonic() + busy_timeout
    pause = 0.005
    while True:
        try:
            return _connect_once(path, busy_timeout)
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # on the store's own thread
        pause = min(pause * 2, 0.1)


def _connect_once(path: str, busy_timeout: float) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, sqlite3 must not.  One thread at
    # a time uses it: the store's worker, or at interpreter exit, when Python has stopped that
    # worker, the thread that closes the store (blobsdk/runtime/forksafe.py's Executor).
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        _atomic(conn, lambda: _create_schema(conn))
    except BaseException:
        conn.close()
        raise
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise BlobError(f"metadata schema version {found} is newer than this blobsdk's {SCHEMA_VERSION}")
    conn.execute(_SCHEMA)
    conn.execute(_FENCES_SCHEMA)
    if found < 3:
        conn.execute(_REFS_SCHEMA)
        for path, blob in conn.execute(f"SELECT path, plan FROM plans WHERE {_LIVE}").fetchall():
            _add_refs(conn, path, _decoded(path, blob).block_ids())
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _atomic(conn: sqlite3.Connection, work: Callable[[], T], begin: str = "BEGIN IMMEDIATE") -> T:
    """Run ``work`` in one transaction.  IMMEDIATE takes the write lock up front, so the
    version read and the write that depends on it cannot interleave with another writer."""
    conn.execute(begin)
    try:
        result = work()
        conn.execute("COMMIT")
        return result
    except BaseException:
        if conn.in_transaction:  # SQLite already rolled back after some errors
            conn.execute("ROLLBACK")
        raise


def _noop(conn: sqlite3.Connection) -> None:
    return None


def _select_plan(conn: sqlite3.Connection, path: str) -> ReadPlan | None:
    row = conn.execute(f"SELECT plan FROM plans WHERE path = ? AND {_LIVE}", (path,)).fetchone()
    return None if row is None else _decoded(path, row[0])


def _select_plans(conn: sqlite3.Connection, paths: list[str]) -> dict[str, ReadPlan]:
    # Several chunks read in one transaction see one snapshot, like a single query would.
    return _atomic(conn, lambda: _plans_in(conn, paths), "BEGIN") if len(paths) > _IN_CHUNK else _plans_in(conn, paths)


def _plans_in(conn: sqlite3.Connection, paths: list[str]) -> dict[str, ReadPlan]:
    found: dict[str, ReadPlan] = {}
    for i in range(0, len(paths), _IN_CHUNK):
        chunk = paths[i : i + _IN_CHUNK]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(f"SELECT path, plan FROM plans WHERE path IN ({marks}) AND {_LIVE}", chunk)
        found.update((path, _decoded(path, blob)) for path, blob in rows)
    return found


def _commit_ops(conn: sqlite3.Connection, ops: list[CommitOp]) -> list[ReadPlan]:
    now = time.time()

    def work() -> list[ReadPlan]:
        _check_fences(conn, ops)
        return [_commit_one(conn, op, now) for op in ops]

    return _atomic(conn, work)


def _check_fences(conn: sqlite3.Connection, ops: list[CommitOp]) -> None:
    """BlockCollected if an op names a fenced block (inside the commit's transaction)."""
    named = list({b for op in ops for b in op.plan.block_ids()})
    for i in range(0, len(named), _IN_CHUNK):
        chunk = named[i : i + _IN_CHUNK]
        row = conn.execute(
            f"SELECT block_id FROM fences WHERE block_id IN ({','.join('?' * len(chunk))}) LIMIT 1", chunk
        ).fetchone()
        if row is not None:
            raise block_collected(next(op.path for op in ops if row[0] in op.plan.block_ids()), row[0])


def _fence(conn: sqlite3.Connection, block_ids: list[str]) -> None:
    now = time.time()
    _atomic(
        conn, lambda: conn.executemany("INSERT OR IGNORE INTO fences (block_id, at) VALUES (?, ?)", [(b, now) for b in block_ids])
    )


def _unfence(conn: sqlite3.Connection, block_ids: list[str]) -> None:
    _atomic(conn, lambda: conn.executemany("DELETE FROM fences WHERE block_id = ?", [(b,) for b in block_ids]))


def _prune_fences(conn: sqlite3.Connection, older_than: float) -> int:
    return _atomic(conn, lambda: conn.execute("DELETE FROM fences WHERE at < ?", (time.time() - older_than,)).rowcount)


def _commit_one(conn: sqlite3.Connection, op: CommitOp, now: float) -> ReadPlan:
    row = conn.execute("SELECT version, etag IS NOT NULL, plan FROM plans WHERE path = ?", (op.path,)).fetchone()
    last, live = (0, None) if row is None else (row[0], row[0] if row[1] else None)
    check_precondition(op.path, op.if_version, live)
    plan = msgspec.structs.replace(op.plan, version=last + 1, created=now)
    values = (plan.path, plan.version, plan.size, plan.etag, plan.created, len(plan.chunks), _encoder.encode(plan))
    conn.execute(_UPSERT, values)
    old = set() if live is None else _decoded(op.path, row[2]).block_ids()
    new = plan.block_ids()
    _drop_refs(conn, op.path, old - new)
    _add_refs(conn, op.path, new - old)
    return plan


def _add_refs(conn: sqlite3.Connection, path: str, block_ids: set[str]) -> None:
    conn.executemany("INSERT OR IGNORE INTO block_refs (block_id, path) VALUES (?, ?)", [(b, path) for b in block_ids])


def _drop_refs(conn: sqlite3.Connection, path: str, block_ids: set[str]) -> None:
    conn.executemany("DELETE FROM block_refs WHERE block_id = ? AND path = ?", [(b, path) for b in block_ids])


def _delete(conn: sqlite3.Connection, path: str, if_version: int | None) -> BlobInfo:
    def work() -> BlobInfo:
        row = conn.execute(f"SELECT {_INFO_COLUMNS}, plan FROM plans WHERE path = ? AND {_LIVE}", (path,)).fetchone()
        if row is None:
            raise BlobNotFound(f"no blob at {path!r}")
        info = _info(row[:-1])
        check_precondition(path, if_version, info.version)
        conn.execute(_TOMBSTONE, (path,))
        _drop_refs(conn, path, _decoded(path, row[-1]).block_ids())
        return info

    return _atomic(conn, work)


def _list_page(conn: sqlite3.Connection, prefix: str, start_after: str | None, limit: int) -> tuple[list[BlobInfo], str | None]:
    # A range on the primary key, not LIKE: '%' and '_' are legal in paths.
    if start_after is not None and start_after >= prefix:
        op, lower = ">", start_after
    else:
        op, lower = ">=", prefix
    sql = f"SELECT {_INFO_COLUMNS} FROM plans WHERE path {op} ? AND path < ? AND {_LIVE} ORDER BY path LIMIT ?"
    rows = conn.execute(sql, (lower, prefix_end(prefix), limit + 1)).fetchall()
    items = [_info(row) for row in rows[:limit]]
    return items, (items[-1].path if len(rows) > limit else None)


def _scan_page(conn: sqlite3.Connection, start_after: str | None, limit: int) -> tuple[list[ReadPlan], str | None]:
    sql = f"SELECT path, plan FROM plans WHERE path > ? AND {_LIVE} ORDER BY path LIMIT ?"
    # Every path starts with '/', so '' sorts before all of them.
    rows = conn.execute(sql, (start_after or "", limit + 1)).fetchall()
    plans = [_decoded(path, blob) for path, blob in rows[:limit]]
    return plans, (plans[-1].path if len(rows) > limit else None)


def _naming_page(
    conn: sqlite3.Connection, block_ids: list[str], after: tuple[str, str], limit: int
) -> tuple[list[ReadPlan], str | None]:
    """One primary-key range per block id from the cursor's on: O(ids + references)."""

    def work() -> tuple[list[ReadPlan], str | None]:
        refs: list[tuple[str, str]] = []
        for block_id in sorted(b for b in block_ids if b >= after[0]):
            since = after[1] if block_id == after[0] else ""
            rows = conn.execute(
                "SELECT path FROM block_refs WHERE block_id = ? AND path > ? ORDER BY path LIMIT ?",
                (block_id, since, limit + 1 - len(refs)),
            )
            refs += [(block_id, path) for (path,) in rows]
            if len(refs) > limit:
                break
        paths = list(dict.fromkeys(path for _, path in refs[:limit]))
        found = _plans_in(conn, paths)
        cursor = "/".join(refs[limit - 1]) if len(refs) > limit else None
        return [found[p] for p in paths if p in found], cursor

    return _atomic(conn, work, "BEGIN")  # the references and their plans from one snapshot


def _decoded(path: str, blob: Any) -> ReadPlan:
    return decode_stored(path, lambda: _plan_decoder.decode(blob))


def _info(row: tuple[Any, ...]) -> BlobInfo:
    path, version, size, etag, created, chunks = row
    return BlobInfo(path=path, version=version, size=size, etag=etag, created=created, chunks=chunks)
