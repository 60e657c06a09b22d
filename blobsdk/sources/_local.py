"""L4 as a local directory: one file per immutable block, published atomically.

Layout::

    root/FORMAT                                                       "blobsdk block-store format 1"
    root/<first 2 hex digits of xxh3_64(block_id)>/<block_id>          a durable block
    root/<shard>/<block_id>.<store token>-<random>.tmp                   a write in progress

File names come only from validated block ids (32 lowercase hex digits), and no entry inside
``root`` is followed if it is a symlink (blobsdk/runtime/rootdir.py): a read, write or delete that
meets one, or a file where a shard directory belongs, is refused (Unavailable naming the
entry); listings and sweeps skip such entries with a logged warning.  So nothing outside
``root`` is ever read, created or deleted.

A block appears under its final name only after its bytes were fsynced (temp file, rename,
fsync of the directory), so a crash leaves at most temp files.  A writer holds a lock on its
temp file until the rename; opening a store sweeps the temp files whose lock it can take
(their writer died), never a live writer's, in this process or another, however old.

Opening checks ``root/FORMAT``.  Format 1 opens.  A root without a marker gets one: at once
if it holds no shard directory, else (a store written before markers) once every block is
found where format 1 puts it.  Anything else -- a newer format, another kind of directory,
a FORMAT that is not a marker, a misplaced block in an unmarked root -- is
IncompatibleFormat, and nothing is touched: a block store never discards a block.  Every
disk access runs on the store's own thread pool: the event loop never waits on a disk.  The
reads themselves are in blobsdk/sources/_localread.py, ``read_spans`` among them: many spans
of one block (a restore's chunks) in one job, with one open.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
import os
import stat
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import xxhash

from ..chunks import Call, validate_block_id
from ..errors import (
    BadRequest,
    BlobError,
    ClientClosed,
    IncompatibleFormat,
    PreconditionFailed,
    Unavailable,
)
from ..runtime import (
    FORMAT_FILE,
    TMP_SUFFIX,
    AsyncResource,
    Executor,
    RootDir,
    UnsafeEntry,
    create_temp,
    kind_of,
    marker_text,
    refusal,
    remove_if_dead,
)
from ..wire import BlockInfo
from ._localread import IOV_MAX, read_clipped_sync, read_into_sync, read_range_sync, read_spans_sync, skip
from .base import Buffer, Span, SpanCheck, block_time

T = TypeVar("T")

_KIND = "block-store"
_FORMAT = 1  # the layout above; bump it (and read the old one, or refuse it) when it changes


log = logging.getLogger(__name__)


class LocalBlockStore(AsyncResource):
    """A :class:`~blobsdk.sources.base.BlockStore` over one directory.

    ``threads`` bounds the concurrent disk operations (the store's own executor, shut down
    by :meth:`aclose`).  Constructing a store starts opening it (the FORMAT check and the
    sweep of dead writers' temp files); ``async with`` and every operation wait for that,
    and raise what it raised (IncompatibleFormat, Unavailable).  Besides the protocol, it offers what the block server
    needs: :meth:`block_writer` (stream a block in pieces), :meth:`read_clipped` and
    :meth:`list_page`.
    """

    def __init__(self, root: str | os.PathLike[str], *, threads: int = 8) -> None:
        if threads < 1:
            raise ValueError(f"threads must be positive, got {threads}")
        self._root = Path(os.path.abspath(root))
        self._dir = RootDir(self._root, label=f"block store {self._root}", log=log)
        self._pool = Executor(threads, thread_name_prefix="blobsdk-local")
        self._token = os.urandom(4).hex()  # names this store's temp files (see _rootdir on NFS)
        self._closed = False
        self._opened = False
        self._opening = self._pool.submit(_open_store, self._dir, self._token)

    @property
    def name(self) -> str:
        return str(self._root)

    @property
    def root(self) -> Path:
        return self._root

    @property
    def replicas(self) -> tuple[LocalBlockStore]:
        return (self,)

    def block_path(self, block_id: str) -> Path:
        """Where a block lives (BadRequest for an invalid id)."""
        return Path(self._dir.entry_path(*_locate(block_id)))

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        await self._run(_write_block_sync, self._dir, *_locate(block_id), parts, self._token)

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        where = _locate(block_id)
        view = memoryview(out).cast("B")
        if _check_span(offset, view.nbytes) == 0:
            return
        await self._run(read_into_sync, self._dir, *where, offset, view, writes_into=True)

    async def read_spans(
        self, block_id: str, spans: Sequence[Span], *, check: SpanCheck | None = None, call: Call | None = None
    ) -> list[BlobError | None]:
        """See :class:`~blobsdk.sources.base.SpanReader`: one open, one preadv per run of
        nearby spans and the checks, in one job on the store's thread pool."""
        where = _locate(block_id)
        for span in spans:
            _check_span(span.offset, span.length)
        stop = threading.Event()
        if self._closed:
            raise ClientClosed(f"block store {self.name} is closed")
        await self.wait_open()
        future = self._pool.submit(read_spans_sync, self._dir, *where, spans, check, stop)
        try:
            return await self._wait(future)
        except asyncio.CancelledError:
            stop.set()  # the job stops at its next run; until it has, it may write into the windows
            await asyncio.wait([asyncio.wrap_future(future)])
            raise

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        where = _locate(block_id)
        if _check_span(offset, length) == 0:
            return b""
        return await self._run(read_range_sync, self._dir, *where, offset, length)

    async def read_clipped(self, block_id: str, offset: int, length: int) -> tuple[bytes, int]:
        """The bytes of ``offset .. offset + length`` that lie inside the block (fewer, or
        none, where it ends first) and the block's size, in one disk operation: what a
        server answering a Range needs.  BlockNotFound if there is no such block."""
        where = _locate(block_id)
        _check_span(offset, length)
        return await self._run(read_clipped_sync, self._dir, *where, offset, length)

    async def delete_block(self, block_id: str) -> None:
        """Remove the block (nothing if there is none); a symlink under its name is removed
        itself, never what it points to."""
        await self._run(_delete_sync, self._dir, *_locate(block_id))

    async def list_blocks(self, start_after: str | None = None) -> AsyncIterator[BlockInfo]:
        """Every block (after ``start_after``), sorted by id, from one directory scan."""
        entries = await self._run(_scan_sync, self._dir)
        for block_id, size in entries[_after(entries, start_after) :]:
            yield BlockInfo(block_id=block_id, size=size, created=block_time(block_id))

    async def list_page(self, start_after: str | None, limit: int) -> tuple[list[BlockInfo], str | None]:
        """Up to ``limit`` blocks after ``start_after`` and the ``start_after`` of the next
        page (None at the end).  Each page rescans the directory: O(blocks) per page."""
        entries = await self._run(_scan_sync, self._dir)
        first = _after(entries, start_after)
        page = entries[first : first + limit]
        infos = [BlockInfo(block_id=b, size=s, created=block_time(b)) for b, s in page]
        more = first + limit < len(entries)
        return infos, (page[-1][0] if more and page else None)

    @asynccontextmanager
    async def block_writer(self, block_id: str) -> AsyncIterator[BlockWriter]:
        """Stream one block in pieces: ``await w.write(parts)`` any number of times, then
        ``await w.commit()``.  Leaving the block without a commit (an error, a cancelled
        request) discards everything written: no block, no temp file."""
        writer = BlockWriter(self, await self._open_temp(*_locate(block_id)))
        try:
            yield writer
        finally:
            if not writer.committed:
                writer.abort()

    async def aclose(self) -> None:
        """Wait for running disk operations, then stop the thread pool.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)

    async def wait_open(self) -> None:
        """Wait until the store is open (FORMAT checked, dead writers' temp files swept);
        raises what opening raised, on every call."""
        if not self._opened:
            await self._wait(self._opening)
            self._opened = True

    async def _start(self) -> None:
        await self.wait_open()  # a failed one is closed (AsyncResource): the pool never outlives it

    async def _open_temp(self, shard: str, block_id: str) -> _TempFile:
        if self._closed:
            raise ClientClosed(f"block store {self.name} is closed")
        await self.wait_open()
        future = self._pool.submit(_TempFile, self._dir, shard, block_id, self._token)
        try:
            return await self._wait(future)
        except asyncio.CancelledError:  # the file may still appear: remove it when it does
            future.add_done_callback(_discard_created)
            raise

    async def _run(self, fn: Callable[..., T], *args: Any, writes_into: bool = False) -> T:
        """``fn(*args)`` on the store's thread pool.  ``writes_into``: the job writes into the
        caller's memory, so a cancelled caller returns only once it has ended (a cancelled
        ``read_into`` leaves nothing writing into ``out``: BlockReplica's contract)."""
        if self._closed:
            raise ClientClosed(f"block store {self.name} is closed")
        await self.wait_open()
        future = self._pool.submit(fn, *args)
        try:
            return await self._wait(future)
        except asyncio.CancelledError:
            if writes_into:
                await asyncio.wait([asyncio.wrap_future(future)])
            raise

    async def _wait(self, future: concurrent.futures.Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except BlobError:  # BlockNotFound is also an OSError: keep it as it is
            raise
        except UnsafeEntry as exc:
            raise Unavailable(f"block store {self.name}: refused {exc}") from exc
        except OSError as exc:
            raise Unavailable(f"{self.name}: {type(exc).__name__}: {exc}") from exc

    def _submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        return self._pool.submit(fn, *args)


class BlockWriter:
    """One block being streamed into a temp file (see :meth:`LocalBlockStore.block_writer`)."""

    def __init__(self, store: LocalBlockStore, temp: _TempFile) -> None:
        self._store = store
        self._temp = temp
        self._pending: concurrent.futures.Future[Any] | None = None
        self.committed = False

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._temp.size

    async def write(self, parts: Sequence[Buffer]) -> None:
        """Append ``parts``; they must stay unchanged until this returns."""
        self._pending = self._store._submit(self._temp.write, parts)
        await self._store._wait(self._pending)

    async def commit(self) -> None:
        """Make the block durable and visible (a no-op if it already exists with this size)."""
        self._pending = self._store._submit(self._temp.publish)
        await self._store._wait(self._pending)
        self.committed = True

    def abort(self) -> None:
        """Drop the temp file, after any disk operation still running on it (a cancelled
        ``write`` keeps running in its thread), without blocking the loop."""
        try:
            self._store._submit(_discard_after, self._pending, self._temp)
        except RuntimeError:  # the pool is already shut down: nothing else runs on the file
            self._temp.discard()


# --- blocking helpers, run on the store's thread pool -------------------------------------


class _TempFile:
    """A locked temp file beside block ``block_id`` in its shard: publish() makes it the
    block, discard() removes it.  The lock (the open fd) lives until one of them ends."""

    def __init__(self, root: RootDir, shard: str, block_id: str, token: str) -> None:
        self.dir_fd = root.open_shard(shard, create=True)
        try:
            self.fd, self.name = create_temp(self.dir_fd, block_id, token)
        except BaseException:
            os.close(self.dir_fd)
            raise
        self.final = block_id
        self.path = root.entry_path(shard, block_id)  # for messages
        self.size = 0

    def write(self, parts: Sequence[Buffer]) -> None:
        self.size += _write_all(self.fd, parts)

    def publish(self) -> None:
        os.fsync(self.fd)
        if _already_stored(self.dir_fd, self.final, self.path, self.size):
            os.unlink(self.name, dir_fd=self.dir_fd)
        else:
            os.replace(self.name, self.final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            os.fsync(self.dir_fd)  # the rename itself must survive a crash
        self._close()  # only now: until the rename, the lock says a writer is alive

    def discard(self) -> None:
        if self.fd >= 0:  # else published (or discarded) already
            with suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=self.dir_fd)
        self._close()

    def _close(self) -> None:
        for attr in ("fd", "dir_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                os.close(fd)


def _write_block_sync(root: RootDir, shard: str, block_id: str, parts: Sequence[Buffer], token: str) -> None:
    temp = _TempFile(root, shard, block_id, token)
    try:
        if _already_stored(temp.dir_fd, block_id, temp.path, sum(memoryview(p).nbytes for p in parts)):
            temp.discard()
            return
        temp.write(parts)
        temp.publish()
    except BaseException:
        temp.discard()
        raise


def _discard_after(pending: concurrent.futures.Future[Any] | None, temp: _TempFile) -> None:
    if pending is not None:
        concurrent.futures.wait([pending])
    temp.discard()


def _discard_created(future: concurrent.futures.Future[_TempFile]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().discard()


def _already_stored(dir_fd: int, block_id: str, path: str, size: int) -> bool:
    """True if the shard holds block ``block_id`` of ``size`` bytes: blocks are immutable,
    so that is the same block.  A different size means two writers disagree about one id;
    something else under its name (a symlink) is refused."""
    try:
        st = os.stat(block_id, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeEntry(refusal(path, kind_of(st.st_mode), "a regular file"))
    if st.st_size != size:
        raise PreconditionFailed(f"block {block_id} already exists with {st.st_size} bytes, not {size}")
    return True


def _write_all(fd: int, parts: Sequence[Buffer]) -> int:
    """Write every part with os.writev (no joined copy); returns the bytes written."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
    total = sum(v.nbytes for v in views)
    while views:
        written = os.writev(fd, views[:IOV_MAX])
        views = skip(views, written)
    return total


def _locate(block_id: str) -> tuple[str, str]:
    """``(shard, block_id)`` of a block, once its id is valid (BadRequest if not)."""
    block_id = validate_block_id(block_id)
    return _shard_of(block_id), block_id


def _shard_of(block_id: str) -> str:
    return xxhash.xxh3_64_hexdigest(block_id.encode())[:2]


def _delete_sync(root: RootDir, shard: str, block_id: str) -> None:
    # No directory fsync: a delete undone by a crash only leaves an orphan for the next GC.
    with suppress(FileNotFoundError), root.shard(shard) as dir_fd:
        os.unlink(block_id, dir_fd=dir_fd)  # unlink never follows: a symlink goes, not its target


def _scan_sync(root: RootDir) -> list[tuple[str, int]]:
    """(block_id, size) of every block, sorted; temp and foreign files are skipped, and
    entries that are not what the layout puts there are ignored with a warning."""
    found: list[tuple[str, int]] = []
    for shard, dir_fd in root.each_shard():
        for entry in root.files(shard, dir_fd):
            if not entry.name.endswith(TMP_SUFFIX):
                with suppress(FileNotFoundError):  # deleted while we scan
                    found.append((entry.name, entry.stat(follow_symlinks=False).st_size))
    found.sort()
    return found


# --- opening: the FORMAT marker and the sweep ----------------------------------------------


def _open_store(root: RootDir, token: str) -> None:
    """Check (or write) the FORMAT marker, then sweep dead writers' temp files."""
    os.makedirs(root.path, exist_ok=True)
    version = root.marked_version(_KIND)
    if version is None:
        _adopt(root, token)
    elif version != _FORMAT:
        raise IncompatibleFormat(
            f"block store {root.path} is in format {version}, this build of blobsdk reads format {_FORMAT}: "
            "refusing to open it (its blocks are left as they are)"
        )
    _sweep_temp_files(root, token)


def _adopt(root: RootDir, token: str) -> None:
    """Mark an unmarked root as format 1: an empty one at once, one written before markers
    existed once every block is found under the shard format 1 gives it."""
    if root.shards():
        misplaced = _misplaced_block(root)
        if misplaced is not None:
            raise IncompatibleFormat(
                f"block store {root.path} has no {FORMAT_FILE} and {misplaced} is not where format {_FORMAT} puts it: "
                "refusing to open it (its blocks are left as they are)"
            )
        log.info(
            "block store %s: no %s, every block where format %d puts it: marked as format %d",
            root.path,
            FORMAT_FILE,
            _FORMAT,
            _FORMAT,
        )
    root.mark(marker_text(_KIND, _FORMAT), token)


def _misplaced_block(root: RootDir) -> str | None:
    for shard, dir_fd in root.each_shard():
        for entry in root.files(shard, dir_fd):
            if not entry.name.endswith(TMP_SUFFIX) and _shard_of(entry.name) != shard:
                return root.entry_path(shard, entry.name)
    return None


def _sweep_temp_files(root: RootDir, token: str) -> None:
    """Remove the temp files of writers that died (their lock is free), never a live
    writer's: not this store's, nor one another store or process is writing."""
    for shard, dir_fd in root.each_shard():
        for entry in root.files(shard, dir_fd):
            if entry.name.endswith(TMP_SUFFIX) and f".{token}-" not in entry.name:
                remove_if_dead(dir_fd, entry.name)


def _check_span(offset: int, length: int) -> int:
    if offset < 0 or length < 0:
        raise BadRequest(f"offset and length must not be negative, got {offset} and {length}")
    return length


def _after(entries: list[tuple[str, int]], start_after: str | None) -> int:
    if start_after is None:
        return 0
    return bisect.bisect_right(entries, (start_after, float("inf")))
