"""L4 as a local directory: one file per immutable block, published atomically.

Layout::

    root/<first 2 hex digits of xxh3_64(block_id)>/<block_id>          a durable block
    root/<shard>/<block_id>.<store token>-<random>.tmp                   a write in progress

File names come only from validated block ids (32 lowercase hex digits), so nothing is
ever created outside ``root``.  A block appears under its final name only after its bytes
were fsynced (temp file, ``os.replace``, fsync of the directory), so a crash leaves at most
temp files; the next store to open ``root`` sweeps those.  Every disk access runs on the
store's own thread pool: the event loop never waits on a disk.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, Self, TypeVar

import xxhash

from .._ids import is_hex32
from ..errors import (
    BadRequest,
    BlobError,
    BlockNotFound,
    ClientClosed,
    CorruptData,
    PreconditionFailed,
    Unavailable,
)
from ..hedge import Attempt
from ..wire import BlockInfo
from .base import Buffer, block_time, validate_block_id

T = TypeVar("T")

_TMP_SUFFIX = ".tmp"
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")
# os.writev takes at most IOV_MAX buffers per call.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class LocalBlockStore:
    """A :class:`~blobsdk.sources.base.BlockStore` over one directory.

    ``threads`` bounds the concurrent disk operations (the store's own executor, shut down
    by :meth:`aclose`).  Opening a store starts a sweep of temp files left by a crash;
    ``async with`` waits for it.  Besides the protocol, it offers what the block server
    needs: :meth:`block_writer` (stream a block in pieces), :meth:`read_clipped` and
    :meth:`list_page`.
    """

    def __init__(self, root: str | os.PathLike[str], *, threads: int = 8) -> None:
        if threads < 1:
            raise ValueError(f"threads must be positive, got {threads}")
        self._root = Path(os.path.abspath(root))
        self._prefix = os.path.join(self._root, "")  # root and a separator, for _file_of
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="blobsdk-local")
        # Marks this store's temp files so the start-up sweep never removes them.
        self._token = os.urandom(4).hex()
        self._closed = False
        self._sweep = self._pool.submit(_sweep_temp_files, self._root, self._token, time.time())

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
        return Path(self._file_of(block_id))

    def _file_of(self, block_id: str) -> str:
        """:meth:`block_path` as a string, built without pathlib (it is on every read)."""
        block_id = validate_block_id(block_id)
        return f"{self._prefix}{xxhash.xxh3_64_hexdigest(block_id.encode())[:2]}{os.sep}{block_id}"

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        path = self.block_path(block_id)
        await self._run(_write_block_sync, path, parts, self._token)

    async def read_into(
        self, block_id: str, offset: int, out: memoryview, *, attempt: Attempt | None = None, grant: str = ""
    ) -> None:
        path = self._file_of(block_id)
        view = memoryview(out).cast("B")
        if _check_span(offset, view.nbytes) == 0:
            return
        await self._run(_read_into_sync, path, block_id, offset, view)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        path = self._file_of(block_id)
        if _check_span(offset, length) == 0:
            return b""
        return await self._run(_read_range_sync, path, block_id, offset, length)

    async def read_clipped(self, block_id: str, offset: int, length: int) -> tuple[bytes, int]:
        """The bytes of ``offset .. offset + length`` that lie inside the block (fewer, or
        none, where it ends first) and the block's size, in one disk operation: what a
        server answering a Range needs.  BlockNotFound if there is no such block."""
        path = self._file_of(block_id)
        _check_span(offset, length)
        return await self._run(_read_clipped_sync, path, block_id, offset, length)

    async def delete_block(self, block_id: str) -> None:
        await self._run(_delete_sync, self._file_of(block_id))

    async def list_blocks(self, start_after: str | None = None) -> AsyncIterator[BlockInfo]:
        """Every block (after ``start_after``), sorted by id, from one directory scan."""
        entries = await self._run(_scan_sync, self._root)
        for block_id, size in entries[_after(entries, start_after) :]:
            yield BlockInfo(block_id=block_id, size=size, created=block_time(block_id))

    async def list_page(self, start_after: str | None, limit: int) -> tuple[list[BlockInfo], str | None]:
        """Up to ``limit`` blocks after ``start_after`` and the ``start_after`` of the next
        page (None at the end).  Each page rescans the directory: O(blocks) per page."""
        entries = await self._run(_scan_sync, self._root)
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
        writer = BlockWriter(self, await self._open_temp(self.block_path(block_id)))
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

    async def __aenter__(self) -> Self:
        await self._wait(self._sweep)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _open_temp(self, path: Path) -> _TempFile:
        if self._closed:
            raise ClientClosed(f"block store {self.name} is closed")
        future = self._pool.submit(_TempFile, path, self._token)
        try:
            return await self._wait(future)
        except asyncio.CancelledError:  # the file may still appear: remove it when it does
            future.add_done_callback(_discard_created)
            raise

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise ClientClosed(f"block store {self.name} is closed")
        return await self._wait(self._pool.submit(fn, *args))

    async def _wait(self, future: concurrent.futures.Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except BlobError:  # BlockNotFound is also an OSError: keep it as it is
            raise
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
    """A temp file beside ``final``: publish() makes it the block, discard() removes it."""

    def __init__(self, final: Path, token: str) -> None:
        _make_shard_dir(final.parent)
        self.final = final
        self.path = final.with_name(f"{final.name}.{token}-{os.urandom(6).hex()}{_TMP_SUFFIX}")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.size = 0

    def write(self, parts: Sequence[Buffer]) -> None:
        self.size += _write_all(self.fd, parts)

    def publish(self) -> None:
        os.fsync(self.fd)
        self._close()
        if _already_stored(self.final, self.size):
            os.unlink(self.path)
            return
        os.replace(self.path, self.final)
        _fsync_dir(self.final.parent)  # the rename itself must survive a crash

    def discard(self) -> None:
        self._close()
        with suppress(FileNotFoundError):
            os.unlink(self.path)

    def _close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def _write_block_sync(final: Path, parts: Sequence[Buffer], token: str) -> None:
    if _already_stored(final, sum(memoryview(p).nbytes for p in parts)):
        return
    temp = _TempFile(final, token)
    try:
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


def _already_stored(final: Path, size: int) -> bool:
    """True if ``final`` holds a block of ``size`` bytes: blocks are immutable, so that is
    the same block.  A different size means two writers disagree about one id."""
    try:
        existing = os.stat(final).st_size
    except FileNotFoundError:
        return False
    if existing != size:
        raise PreconditionFailed(f"block {final.name} already exists with {existing} bytes, not {size}")
    return True


def _write_all(fd: int, parts: Sequence[Buffer]) -> int:
    """Write every part with os.writev (no joined copy); returns the bytes written."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
    total = sum(v.nbytes for v in views)
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        views = _skip(views, written)
    return total


def _skip(views: list[memoryview], nbytes: int) -> list[memoryview]:
    """The views left after ``nbytes`` of them were written (writev may write less)."""
    i = 0
    while i < len(views) and nbytes >= views[i].nbytes:
        nbytes -= views[i].nbytes
        i += 1
    rest = views[i:]
    if rest and nbytes:
        rest[0] = rest[0][nbytes:]
    return rest


def _make_shard_dir(shard: Path) -> None:
    try:
        shard.mkdir()
    except FileExistsError:
        return
    except FileNotFoundError:  # first write to a fresh root
        shard.parent.mkdir(parents=True, exist_ok=True)
        shard.mkdir(exist_ok=True)
    _fsync_dir(shard.parent)  # a new shard directory must survive a crash with its block


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_block(path: str, block_id: str) -> int:
    """An fd of the block; BlockNotFound if there is none."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BlockNotFound(f"block {block_id} not found") from None


@contextmanager
def _open_span(path: str, block_id: str, offset: int, length: int) -> Iterator[int]:
    """An fd of the block, once ``offset + length`` is known to lie inside it."""
    fd = _open_block(path, block_id)
    try:
        size = os.fstat(fd).st_size
        if offset + length > size:
            raise CorruptData(f"range {offset}+{length} is past the end of block {block_id} ({size} bytes)")
        yield fd
    finally:
        os.close(fd)


def _read_into_sync(path: str, block_id: str, offset: int, out: memoryview) -> None:
    with _open_span(path, block_id, offset, out.nbytes) as fd:
        _preadv_all(fd, block_id, offset, out)


def _read_range_sync(path: str, block_id: str, offset: int, length: int) -> bytes:
    with _open_span(path, block_id, offset, length) as fd:
        return _pread_exact(fd, block_id, offset, length)


def _read_clipped_sync(path: str, block_id: str, offset: int, length: int) -> tuple[bytes, int]:
    fd = _open_block(path, block_id)
    try:
        size = os.fstat(fd).st_size
        inside = min(length, size - offset)
        return (_pread_exact(fd, block_id, offset, inside) if inside > 0 else b""), size
    finally:
        os.close(fd)


def _pread_exact(fd: int, block_id: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``, which lie inside the block (it was fstat'ed)."""
    data = os.pread(fd, length, offset)  # one read, no extra copy: the common case
    if len(data) == length:
        return data
    buf = bytearray(length)  # a short read: fill the rest the careful way
    buf[: len(data)] = data
    _preadv_all(fd, block_id, offset + len(data), memoryview(buf)[len(data) :])
    return bytes(buf)


def _preadv_all(fd: int, block_id: str, offset: int, out: memoryview) -> None:
    done = 0
    while done < out.nbytes:
        n = os.preadv(fd, [out[done:]], offset + done)
        if n == 0:
            raise CorruptData(f"block {block_id} shrank while it was read")
        done += n


def _delete_sync(path: str) -> None:
    # No directory fsync: a delete undone by a crash only leaves an orphan for the next GC.
    with suppress(FileNotFoundError):
        os.unlink(path)


def _scan_sync(root: Path) -> list[tuple[str, int]]:
    """(block_id, size) of every block, sorted; temp and foreign files are skipped."""
    found: list[tuple[str, int]] = []
    for shard in _subdirs(root):
        with os.scandir(shard) as entries:
            for entry in entries:
                if is_hex32(entry.name):
                    with suppress(FileNotFoundError):  # deleted while we scan
                        found.append((entry.name, entry.stat().st_size))
    found.sort()
    return found


def _subdirs(root: Path) -> list[str]:
    try:
        with os.scandir(root) as entries:
            return [e.path for e in entries if _SHARD_NAME.fullmatch(e.name) and e.is_dir()]
    except FileNotFoundError:  # nothing written yet
        return []


def _sweep_temp_files(root: Path, token: str, opened_at: float) -> None:
    """Remove temp files of writers that died: not this store's, and older than its
    opening (a live writer elsewhere keeps touching its file)."""
    for shard in _subdirs(root):
        with os.scandir(shard) as entries:
            for entry in entries:
                if entry.name.endswith(_TMP_SUFFIX) and f".{token}-" not in entry.name:
                    with suppress(FileNotFoundError):
                        if entry.stat().st_mtime < opened_at:
                            os.unlink(entry.path)


def _check_span(offset: int, length: int) -> int:
    if offset < 0 or length < 0:
        raise BadRequest(f"offset and length must not be negative, got {offset} and {length}")
    return length


def _after(entries: list[tuple[str, int]], start_after: str | None) -> int:
    if start_after is None:
        return 0
    return bisect.bisect_right(entries, (start_after, float("inf")))
