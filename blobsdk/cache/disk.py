"""The on-disk chunk cache (the SDK's L2 and the L3 flash node): one file per chunk.

Layout::

    root/<key[:2]>/<key>                        one entry: header, then the payload
    root/<key[:2]>/<key>.<token>-<random>.tmp   a fill in progress

Names come only from validated keys, so nothing is ever created outside ``root``.  A file
starts with a header (magic, version, tenant length, payload length, xxh3-64 of the payload,
xxh3-64 of the header and key, tenant); every read checks both checksums and the size, so a
torn, truncated, bit-flipped or misnamed file is deleted, counted as ``corrupt`` and read
as a miss, never returned.

Fills are all or nothing without fsync: a temp file in the shard directory, renamed over
the final name.  A crash may lose entries (fine for a cache) but never exposes a partial
one, and the checksums catch whatever it tore.  Temp files of dead writers are swept at open.

``open`` rebuilds the index from every file's header (one small read each, shards scanned in
parallel): it names the tenant that quotas need and catches truncation early; payloads are
verified on each read.  LRU order is seeded from atimes (reads refresh them, at most once a
minute), TTL and hold from mtimes (the fill); pins are not persisted.  Then the cache is
trimmed to its capacity.  Processes may share a directory and delete or replace files under
each other: the worst case is a miss (a vanished file drops our index entry), never wrong
bytes; files another process adds are seen at the next open.  All disk access runs on the
cache's own thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, Self, TypeVar

import xxhash

from .._forksafe import Executor
from .._ids import is_hex32
from ..errors import ClientClosed, Unavailable
from .base import DEFAULT_TENANT, Buffer, validate_key
from .policy import Entry, Index, PolicyChain, Victims, validate_tenant

T = TypeVar("T")

_MAGIC = b"BSDC"
_VERSION = 1
# magic, version, pad, tenant length, payload length, payload xxh3-64, header xxh3-64
_HEAD = struct.Struct("<4sBxHQQQ")
_HEAD_READ = _HEAD.size + 255  # the fixed part and the longest tenant name in one read
_TMP_SUFFIX = ".tmp"
_TEMP_GRACE = 60.0  # a younger temp file may belong to a live writer in another process
_ATIME_REFRESH = 60.0  # seconds; bounds the inode writes that persisting the LRU costs
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")


class _Damaged(Exception):
    """A file that fails its header or checksum checks (it has been deleted)."""


class _Header(NamedTuple):
    """What a file's header says about its payload: owner, length, xxh3-64, start."""

    tenant: str
    length: int
    checksum: int
    offset: int


@dataclass(slots=True)
class _Fill:
    """A put being written: indexed (concurrent puts count its bytes), not yet readable
    nor evictable (pinned to infinity); ``pin_until`` is the pin it gets once written."""

    entry: Entry
    pin_until: float


class DiskCache:
    """A :class:`~blobsdk.cache.base.ChunkCache` over one directory (module docstring).

    ``capacity_bytes`` counts payload bytes (a file adds 32 bytes plus the tenant name);
    ``min_free_ratio`` of the file system is kept free (``os.statvfs`` on each put).
    ``threads`` bounds concurrent disk operations.  Use ``async with`` (or :meth:`open`
    and :meth:`aclose`).  ``put`` never raises for a disk problem: it returns False and
    counts ``errors``; the caller must not change ``data`` until ``put`` returns.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        capacity_bytes: int,
        min_free_ratio: float = 0.05,
        ttl_seconds: float | None = None,
        hold_seconds: float = 0.0,
        quotas: Mapping[str, int] | None = None,
        threads: int = 4,
        name: str = "disk",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes < 0 or not 0 <= min_free_ratio < 1 or threads < 1:
            raise ValueError(f"bad DiskCache settings: {capacity_bytes=} {min_free_ratio=} {threads=}")
        self._root = Path(os.path.abspath(root))
        self._capacity = capacity_bytes
        self._min_free = min_free_ratio
        self._name = name
        self._clock = clock
        self._chain = PolicyChain(ttl_seconds=ttl_seconds, hold_seconds=hold_seconds, quotas=quotas)
        self._index = Index(per_tenant_lru=bool(quotas))
        self._fills: dict[str, _Fill] = {}
        self._pool = Executor(threads, thread_name_prefix=f"blobsdk-{name}")
        self._token = os.urandom(4).hex()  # marks our temp files: a sweep never takes them
        self._state = "new"
        self._counts = dict.fromkeys(("hits", "misses", "puts", "corrupt", "errors"), 0)

    @property
    def name(self) -> str:
        return self._name

    @property
    def root(self) -> Path:
        return self._root

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._index.used

    async def open(self) -> Self:
        """Create ``root`` if needed, sweep stale temp files and rebuild the index."""
        if self._state != "new":
            return self
        try:
            await self._io(self._root.mkdir, parents=True, exist_ok=True)
            shards = await self._io(_shard_dirs, self._root)
            scan = partial(_scan_shard, token=self._token, times=_FileTimes(self._clock()))
            self._load(await asyncio.gather(*(self._io(scan, shard) for shard in shards)))
            for _, victim in self._chain.trim(self._index, self._capacity, self._clock()):
                await self._io(_unlink, self._path(victim.key))
        except OSError as exc:
            raise Unavailable(f"cache {self._name} cannot open {self._root}: {exc}") from exc
        self._state = "open"
        return self

    async def get(self, key: str, *, checksum: int | None = None) -> bytearray | None:
        """The payload for ``key`` (a new bytearray the caller owns), read and verified on
        the executor, or None.  With ``checksum`` (an xxh3-64 the caller expects) a copy
        whose recorded checksum differs counts as corrupt too: one hash checks both."""
        entry = await self._readable(validate_key(key))
        if entry is None:
            self._counts["misses"] += 1
            return None
        try:
            data = await self._io(self._read_sync, self._path(key), key, checksum)
        except _Damaged:
            self._lost(entry, "corrupt")
            return None
        except FileNotFoundError:  # deleted or evicted by another process sharing root
            self._lost(entry)
            return None
        except OSError:
            self._lost(entry, "errors")
            return None
        if self._index.get(key) is entry:
            self._index.touch(entry, self._clock())
        self._counts["hits"] += 1
        return data

    async def put(self, key: str, data: Buffer, *, tenant: str = DEFAULT_TENANT, pin_seconds: float = 0.0) -> bool:
        """Store a copy of ``data``: True once it is readable, False if it could not be
        admitted or written (then ``key`` is gone).  QuotaExceeded: see ChunkCache."""
        key, tenant = validate_key(key), validate_tenant(tenant)
        view = memoryview(data).cast("B")
        self._fills.pop(key, None)
        if self._index.remove(key) is not None:  # a put that fails must leave no older bytes
            await self._unlink_quietly(self._path(key))
        now = self._clock()
        entry = Entry(key, view.nbytes, now, now, tenant, math.inf)  # unevictable until written
        victims = await self._make_room(entry, now)
        if victims is None:
            return False
        doomed = [self._path(e.key) for _, e in victims]
        return await self._fill(entry, now + pin_seconds if pin_seconds > 0 else 0.0, view, doomed)

    def pin(self, key: str, seconds: float) -> bool:
        """Protect a present entry from eviction for ``seconds`` more; False if absent."""
        entry = self._index.get(validate_key(key))
        if entry is None:
            return False
        fill = self._fills.get(key)
        holder = fill if fill is not None and fill.entry is entry else entry
        holder.pin_until = max(holder.pin_until, self._clock() + seconds)
        return True

    def tenant_usage(self) -> dict[str, int]:
        """Bytes stored (or being stored) per tenant."""
        return dict(self._index.tenant_bytes)

    async def delete(self, key: str) -> bool:
        """Remove ``key`` (also a file another process put there); True if there was one."""
        key = validate_key(key)
        entry = self._index.remove(key)
        self._fills.pop(key, None)
        unlinked = await self._unlink_quietly(self._path(key))
        return entry is not None or unlinked

    def contains(self, key: str) -> bool:
        return validate_key(key) in self._index and key not in self._fills

    def stats(self) -> dict[str, int | float]:
        return {
            **self._counts,
            "bytes": self._index.used,
            "entries": len(self._index),
            "capacity_bytes": self._capacity,
            **self._chain.stats(),
        }

    async def aclose(self) -> None:
        """Wait for running disk operations, then stop the thread pool.  Idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)

    async def __aenter__(self) -> Self:
        try:
            return await self.open()
        except BaseException:  # the pool must not outlive a failed open
            await self.aclose()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- internals, on the event loop -------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._root / key[:2] / key  # key is validated: hex only

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._state == "closed":
            raise ClientClosed(f"cache {self._name} is closed")
        return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))

    def _load(self, scans: Sequence[tuple[list[Entry], int]]) -> None:
        for _, damaged in scans:
            self._counts["corrupt"] += damaged
        self._index.load(entry for found, _ in scans for entry in found)

    async def _readable(self, key: str) -> Entry | None:
        """The entry to read for ``key``: None if absent, being written or expired."""
        if self._state != "open":
            raise ClientClosed(f"cache {self._name} is {self._state}: use async with")
        entry = self._index.get(key)
        if entry is None or key in self._fills:
            return None
        if self._chain.expired(entry, self._clock()):
            self._chain.expire(self._index, entry)
            await self._unlink_quietly(self._path(key))
            return None
        return entry

    def _lost(self, entry: Entry, cause: str | None = None) -> None:
        """Forget an entry whose file is gone or bad (counted as ``cause``): a miss."""
        if cause:
            self._counts[cause] += 1
        if self._index.get(entry.key) is entry:
            self._index.remove(entry.key)
        self._counts["misses"] += 1

    async def _make_room(self, entry: Entry, now: float) -> Victims | None:
        if self._state != "open":
            raise ClientClosed(f"cache {self._name} is {self._state}: use async with")
        deficit = await self._space_deficit(entry.size) if entry.size <= self._capacity else 0
        if deficit is None:
            return None
        return self._chain.admit(self._index, entry, self._capacity, now, deficit)

    async def _space_deficit(self, incoming: int) -> int | None:
        """Bytes to evict to keep ``min_free_ratio`` free after this put and the fills in
        flight; None if the file system cannot be asked."""
        if self._min_free <= 0:
            return 0
        in_flight = sum(f.entry.size for f in self._fills.values())
        try:
            return await self._io(_space_deficit, self._root, incoming + in_flight, self._min_free)
        except OSError:
            self._counts["errors"] += 1
            return None

    async def _fill(self, entry: Entry, pin_until: float, view: memoryview, doomed: list[Path]) -> bool:
        fill = _Fill(entry, pin_until)
        self._index.add(entry)
        self._fills[entry.key] = fill
        job = asyncio.wrap_future(self._pool.submit(self._store_sync, entry.key, entry.tenant, view, doomed))
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(partial(self._settle, fill))  # the write still finishes
            raise
        except Exception:  # noqa: BLE001 - _settle reads the outcome from the job
            pass
        return self._settle(fill, job)

    def _settle(self, fill: _Fill, job: asyncio.Future[None]) -> bool:
        """Publish or drop a finished fill in the index; True if its file was written."""
        entry, key = fill.entry, fill.entry.key
        if self._fills.get(key) is fill:
            del self._fills[key]
        ours = self._index.get(key) is entry
        exc = job.exception()
        if exc is None:
            entry.pin_until = fill.pin_until
            self._counts["puts"] += 1
            if not ours and key not in self._index and self._state != "closed":
                self._pool.submit(_unlink, self._path(key))  # deleted while written: no orphan file
            return True
        if ours:
            self._index.remove(key)
        if not isinstance(exc, OSError):
            raise exc
        self._counts["errors"] += 1
        return False

    async def _unlink_quietly(self, path: Path) -> bool:
        try:
            return await self._io(_unlink, path)
        except OSError:
            self._counts["errors"] += 1
            return False

    # --- on the executor; methods so that tests can inject faults -----------------------

    def _store_sync(self, key: str, tenant: str, payload: memoryview, doomed: list[Path]) -> None:
        for path in doomed:  # first, so the space they held is free for this file
            with suppress(OSError):  # an undeletable victim must not fail this put
                _unlink(path)
        final = self._path(key)
        header = _encode_header(key, tenant, payload)
        final.parent.mkdir(exist_ok=True)
        temp = final.with_name(f"{key}.{self._token}-{os.urandom(4).hex()}{_TMP_SUFFIX}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                self._write_parts(fd, [header, payload])
            finally:
                os.close(fd)
            os.replace(temp, final)  # no fsync: a crash may lose the entry, never tear it
        except BaseException:
            _unlink(temp)
            raise

    def _write_parts(self, fd: int, parts: list[Buffer]) -> None:
        for part in parts:
            view = memoryview(part).cast("B")
            while view:  # a write may be short
                view = view[os.write(fd, view) :]

    def _read_sync(self, path: Path, key: str, checksum: int | None) -> bytearray:
        return _with_file(path, key, lambda fd, key: self._read_file(fd, key, checksum))

    def _read_file(self, fd: int, key: str, checksum: int | None) -> bytearray:
        st, head = _read_header(fd, key)
        if checksum is not None and head.checksum != checksum:
            raise _Damaged(f"{key}: holds other bytes than the caller expects")
        payload = bytearray(head.length)
        filled = os.preadv(fd, [payload], head.offset)  # straight into the buffer: no extra copy
        if filled != head.length or xxhash.xxh3_64_intdigest(payload) != head.checksum:
            raise _Damaged(f"{key}: payload checksum mismatch")
        _refresh_atime(fd, st)
        return payload


# --- blocking helpers --------------------------------------------------------------------


def _header_check(fixed: bytes, tenant: bytes, key: str) -> int:
    """Checksum of the header; the key is included, so a misnamed file is caught too."""
    return xxhash.xxh3_64_intdigest(fixed + tenant + key.encode())


def _encode_header(key: str, tenant: str, payload: memoryview) -> bytes:
    name = tenant.encode()
    fields = (_MAGIC, _VERSION, len(name), payload.nbytes, xxhash.xxh3_64_intdigest(payload))
    fixed = _HEAD.pack(*fields, 0)[:-8]
    return fixed + _header_check(fixed, name, key).to_bytes(8, "little") + name


def _decode_header(head: bytes, key: str) -> _Header:
    if len(head) < _HEAD.size:
        raise _Damaged(f"{key}: shorter than a header")
    magic, version, name_len, length, checksum, check = _HEAD.unpack_from(head)
    name = head[_HEAD.size : _HEAD.size + name_len]
    if magic != _MAGIC or version != _VERSION or len(name) != name_len:
        raise _Damaged(f"{key}: not a cache file of version {_VERSION}")
    if _header_check(head[: _HEAD.size - 8], name, key) != check:
        raise _Damaged(f"{key}: header checksum mismatch")
    return _Header(name.decode("utf-8", "replace"), length, checksum, _HEAD.size + name_len)


def _read_header(fd: int, key: str) -> tuple[os.stat_result, _Header]:
    """The file's stat and header, once they agree on its size (else _Damaged)."""
    st = os.fstat(fd)
    head = _decode_header(os.pread(fd, _HEAD_READ, 0), key)
    if head.offset + head.length != st.st_size:
        raise _Damaged(f"{key}: {st.st_size} bytes, header says {head.offset + head.length}")
    return st, head


def _with_file(path: Path | str, key: str, fn: Callable[[int, str], T]) -> T:
    """``fn(fd, key)`` on the open file; a file it finds damaged is deleted."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # once open, an unlink cannot hurt us
    try:
        return fn(fd, key)
    except _Damaged:
        _unlink_if_same(path, fd)
        raise
    finally:
        os.close(fd)


def _refresh_atime(fd: int, st: os.stat_result) -> None:
    """Record a read in the atime (next start-up's LRU seed; works under noatime too)."""
    if time.time() - st.st_atime < _ATIME_REFRESH:
        return
    with suppress(OSError):  # e.g. a file of another user: the LRU seed is only a hint
        os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _unlink_if_same(path: Path | str, fd: int) -> None:
    """Delete ``path`` unless another process replaced it with a new file meanwhile."""
    with suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)


def _space_deficit(root: Path, incoming: int, min_free_ratio: float) -> int:
    st = os.statvfs(root)
    want_free = min_free_ratio * st.f_blocks * st.f_frsize
    free_after = st.f_bavail * st.f_frsize - incoming
    return max(0, math.ceil(want_free - free_after))


def _shard_dirs(root: Path) -> list[str]:
    with os.scandir(root) as entries:  # nothing but shard directories is ours to scan
        return [e.path for e in entries if _SHARD_NAME.fullmatch(e.name) and e.is_dir()]


class _FileTimes:
    """Maps file times (wall clock) to the engine's clock by their age."""

    def __init__(self, now: float) -> None:
        self.now, self.wall = now, time.time()

    def __call__(self, file_time: float) -> float:
        return self.now - max(0.0, self.wall - file_time)


def _scan_shard(shard: str, *, token: str, times: _FileTimes) -> tuple[list[Entry], int]:
    """The entries of one shard directory and how many damaged files were deleted; sweeps
    other writers' temp files older than :data:`_TEMP_GRACE`."""
    found: list[Entry] = []
    damaged = 0
    with os.scandir(shard) as entries:
        for dirent in entries:
            if is_hex32(dirent.name) and dirent.name.startswith(os.path.basename(shard)):
                try:
                    found.append(_with_file(dirent.path, dirent.name, partial(_inspect, times=times)))
                except _Damaged:
                    damaged += 1
                except FileNotFoundError:  # deleted while we scan
                    pass
            elif dirent.name.endswith(_TMP_SUFFIX) and f".{token}-" not in dirent.name:
                _sweep(dirent, times.wall - _TEMP_GRACE)
    return found, damaged


def _inspect(fd: int, key: str, *, times: _FileTimes) -> Entry:
    """The entry of one file: LRU seeded from its atime, age from its mtime (the fill);
    its payload is verified when it is read."""
    st, head = _read_header(fd, key)
    return Entry(key, head.length, times(st.st_mtime), times(max(st.st_atime, st.st_mtime)), head.tenant)


def _sweep(dirent: os.DirEntry[str], before: float) -> None:
    with suppress(FileNotFoundError):
        if dirent.stat().st_mtime < before:
            os.unlink(dirent.path)
