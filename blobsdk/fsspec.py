"""``blob://`` for fsspec: pandas, pyarrow, dask and every fsspec user read and write blobs.

``fsspec.filesystem("blob", local=DIR)`` is the embedded store (``Client.local(DIR)``);
``fsspec.filesystem("blob", config=PATH_OR_CONFIG)`` a cluster (a ``client.toml`` path or a
:class:`~blobsdk.ClientConfig`); with neither, :meth:`ClientConfig.from_env`.  ``local`` with a
``config`` tunes the embedded store (the config must name no servers).  Registered through the
``fsspec.specs`` entry point.  URL ``blob://bucket/key`` is blob path ``/bucket/key``; fsspec
names are ``bucket/key`` (as in s3fs).

Semantics, where fsspec leaves a choice:

- **Directories** are synthesised from ``/``, as in s3fs: a directory exists while some blob
  has its prefix.  ``mkdir``/``makedirs`` only check the name; ``info`` of a directory is
  ``{"type": "directory", "size": 0}``; ``rm`` of a directory needs ``recursive=True``
  (IsADirectoryError), and its directories vanish with their last blob.
- **Reads** of an open ``"rb"`` file are ranged ``get`` calls through fsspec's block cache
  (``"readahead"``), all of the version the file was opened at: after each one the blob's
  version and etag are checked (a plan-cache hit unless the cache has moved on), and a file
  replaced meanwhile raises :class:`~blobsdk.PreconditionFailed` rather than mixing two
  versions.  ``cat_file`` ranges are Python slices of the blob (negative ``start``/``end``
  count from the end).  Reads return ``bytes`` (fsspec's contract): one copy of the client's
  bytearray, so a whole 256 MiB ``cat_file`` ran at 0.5-0.65x ``client.get``.
- **Writes** are atomic.  A ``"wb"`` file spools what is written (in memory up to
  ``SPOOL_MEMORY_BYTES``, then in an anonymous temporary file) and ``put``s it on ``close``:
  nothing is visible before, and a failed put leaves the previous version.  An exception
  leaving ``with fs.open(p, "wb")`` discards the data, and so does garbage collection of a
  file never closed (a commit is a network write whose errors must reach the caller).
  fsspec's wrappers (text mode, ``compression=``, ``fsspec.open``'s OpenFile) close, and so
  commit, whatever happened: inside ``with fs.transaction:`` nothing commits before the
  transaction ends, and an exception discards it all.  ``"xb"`` fails at ``open`` if the
  path exists and commits create-only (``if_version=0``): either way ``FileExistsError``.
  There is no append (``"ab"``) and no ``open_async``.
- **Copies** have no server side: ``cp_file`` reads and puts, in memory up to
  ``SPOOL_MEMORY_BYTES``, else through a temporary file in ``RANGE_BYTES`` reads.
  ``get_file`` writes ``RANGE_BYTES`` at a time to a temporary file beside the target and
  renames it into place.  ``put_file`` maps a large local file rather than copying it.
- **Errors**: BlobNotFound is FileNotFoundError, InvalidPath ValueError, Unauthorized
  PermissionError; a create-only write that finds the path is FileExistsError.
- **Reserved**: ``bucket/.blobsdk/...`` holds blobsdk's own records (blobsdk/chunks/names.py): it
  can be read and listed; a write, copy to, or ``rm`` naming it is InvalidPath (at ``open``
  for a ``"wb"`` file), and a recursive ``rm`` of a directory above it skips it.

The client: one per filesystem instance (fsspec caches one instance per arguments), opened on
first use on the loop that uses it (fsspec's IO thread for blocking calls; the caller's loop
with ``asynchronous=True``), closed by ``fs.close()`` / ``await fs.aclose()`` or when the
instance is garbage-collected; the next use opens a new one.  Nothing is closed at interpreter
exit: every put was durable when it returned, and the OS closes the sockets.  After ``fork``
the child opens a fresh client on a fresh loop; the parent's client is kept, never used and
never closed, since its loop, threads and sockets belong to the parent.

Sizes, each one a size blobsdk already uses, measured ad hoc on the 2-core dev machine (a
256 MiB blob, embedded store, warm L1, best of 3): ``READ_BLOCK_BYTES`` = 4 MiB, one default
chunk per readahead block, read as fast as fsspec's 5 MiB default within the noise (2.3-4.3
GiB/s for both, sequential reads of 64 KiB to 4 MiB).  ``SPOOL_MEMORY_BYTES`` = 64 MiB, one
default block, bounds the memory of an open ``"wb"`` file: writing 256 MiB in 1 MiB pieces
ran at ~0.6x ``client.put`` of the same bytes held in memory and ~0.4x spilled, in two runs
of three (a file costs a copy; in the third, on a busier machine, both were ~1x).
``RANGE_BYTES`` = 32 MiB, 8 default chunks fetched in parallel by one get, bounds what one
``get_file``/``cp_file`` holds (fsspec runs up to ``batch_size`` at once).
``LOCAL_MMAP_BYTES`` = 4 MiB is the CLI's threshold.
"""

from __future__ import annotations

import asyncio
import errno
import os
import weakref
from contextlib import aclosing, suppress
from datetime import datetime
from typing import Any, cast

from ._arguments import check_number, wrong
from ._extras import requires_extra
from ._numbers import integer
from .runtime import AsyncResource

with requires_extra("fsspec", __name__):
    from fsspec.asyn import AsyncFileSystem, _run_coros_in_chunks, get_loop, sync  # type: ignore[import-untyped]
    from fsspec.callbacks import DEFAULT_CALLBACK  # type: ignore[import-untyped]

from .chunks import is_reserved, refuse_reserved
from .client import Client
from .config import ClientConfig
from .errors import BlobNotFound, PreconditionFailed
from .integrations import (
    BlobFile,
    BlobWriteFile,
    ClientSlot,
    Entry,
    LocalFile,
    Pin,
    Spool,
    blob_path,
    client_factory,
    dir_entry,
    dir_prefix,
    file_entry,
    parents,
    read_local_file,
    writable_path,
)
from .runtime import Held
from .sources import Buffer
from .wire import BlobInfo

__all__ = ("BlobFile", "BlobFileSystem", "BlobWriteFile")

MiB = 1 << 20
SPOOL_MEMORY_BYTES = 64 * MiB
RANGE_BYTES = 32 * MiB
LOCAL_MMAP_BYTES = 4 * MiB
LIST_SKIP_AFTER = 1000  # ls: entries of one subdirectory read before jumping past it (a list page)
# A listing cursor past every path below a directory: a valid path is at most 1024 bytes, and
# U+10FFFF is the greatest code point (4 bytes in UTF-8), so no path below "D/" reaches it.
_PAST_EVERY_PATH = "\U0010ffff" * 256


class BlobFileSystem(AsyncFileSystem, AsyncResource):  # type: ignore[misc]  # fsspec is untyped
    """The ``blob://`` filesystem (see the module docstring)."""

    protocol = "blob"
    root_marker = ""

    def __init__(
        self,
        *,
        local: str | os.PathLike[str] | None = None,
        config: str | os.PathLike[str] | ClientConfig | None = None,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(asynchronous=asynchronous, loop=loop, batch_size=batch_size)
        self._io_loop: Held[asyncio.AbstractEventLoop] = Held()  # a synchronous instance's, per process
        if not asynchronous:
            self._io_loop.put(self._loop)
        make = client_factory(local, config)
        make()  # bad arguments fail here, not at the first call
        self._slot = ClientSlot(make)
        weakref.finalize(self, self._slot.close_soon).atexit = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """fsspec's IO loop; a forked child gets its own (fsspec resets it on fork)."""
        if self.asynchronous:
            return cast("asyncio.AbstractEventLoop | None", self._loop)
        return self._io_loop.get_or_make(get_loop)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """``blob://bucket/key``, ``/bucket/key`` and ``bucket/key`` are all ``bucket/key``."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        if not isinstance(path, str | os.PathLike):
            raise wrong("path", "a str (blob://bucket/key or bucket/key)", path)
        return super()._strip_protocol(path).lstrip("/")

    # --- the client's lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Close the client (blocking); the next call opens a new one.  Not on the thread of
        the loop it runs on (``asynchronous=True``): ``await fs.aclose()`` there."""
        self._slot.close_blocking()

    async def aclose(self) -> None:
        """Close the client from any event loop."""
        await self._slot.aclose()

    def __enter__(self) -> BlobFileSystem:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _client(self) -> Client:
        return await self._slot.get()

    # --- metadata ------------------------------------------------------------------------------

    async def _info(self, path: str, **kwargs: Any) -> Entry:
        name = _name(path)
        if not name:
            return dir_entry("")
        client = await self._client()
        try:
            return file_entry(await _stat_blob(client, name))
        except BlobNotFound:
            pass
        if await self._dir_exists(client, name):
            return dir_entry(name)
        raise FileNotFoundError(errno.ENOENT, "no blob or directory", name)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Entry] | list[str]:
        name = _name(path)
        client = await self._client()
        entries = await self._children(client, name)
        if not entries and name:
            try:
                entries = [file_entry(await _stat_blob(client, name))]
            except BlobNotFound:
                raise FileNotFoundError(errno.ENOENT, "no blob or directory", name) from None
        entries.sort(key=lambda e: str(e["name"]))
        return entries if detail else [e["name"] for e in entries]

    async def _children(self, client: Client, name: str) -> list[Entry]:
        """The blobs directly below ``name`` and one entry per subdirectory.  A subdirectory
        read for a whole list page is jumped past with a new listing, so ``ls`` of a tree
        costs a page per directory, not the whole tree."""
        prefix = dir_prefix(name)
        entries: list[Entry] = []
        cursor: str | None = None
        while True:
            async with aclosing(client.list(prefix, start_after=cursor)) as infos:
                cursor = None
                subdir, skipped = "", 0
                async for info in infos:
                    head, sep, _ = info.path[len(prefix) :].partition("/")
                    if not sep:
                        entries.append(file_entry(info))
                    elif head != subdir:
                        subdir, skipped = head, 0
                        entries.append(dir_entry(prefix[1:] + head))
                    else:
                        skipped += 1
                        if skipped >= LIST_SKIP_AFTER:
                            cursor = f"{prefix}{head}/{_PAST_EVERY_PATH}"
                            break
            if cursor is None:
                return entries

    async def _dir_exists(self, client: Client, name: str) -> bool:
        async with aclosing(client.list(dir_prefix(name))) as infos:
            async for _ in infos:
                return True
        return False

    async def _find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        prefix: str = "",
        **kwargs: Any,
    ) -> list[str] | dict[str, Entry]:
        """One flat listing (``prefix``: of names below ``path`` that start with it), with
        the directories it implies."""
        check_number("find: maxdepth", maxdepth, integer(optional=True))
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        name = _name(path)
        client = await self._client()
        base = dir_prefix(name)
        found: dict[str, Entry] = {}
        async for info in client.list(base + prefix):
            parts = info.path[len(base) :].split("/")
            if maxdepth is None or len(parts) <= maxdepth:
                found[info.path[1:]] = file_entry(info)
            if withdirs:
                above = len(parts) - 1 if maxdepth is None else min(len(parts) - 1, maxdepth)
                for i in range(1, above + 1):
                    found.setdefault(base[1:] + "/".join(parts[:i]), dir_entry(base[1:] + "/".join(parts[:i])))
                if name:
                    found.setdefault(name, dir_entry(name))
        if not found and name and not prefix:
            with suppress(BlobNotFound):
                found[name] = file_entry(await _stat_blob(client, name))
        names = sorted(found)
        return {n: found[n] for n in names} if detail else names

    async def _du(self, path: str, total: bool = True, maxdepth: int | None = None, **kwargs: Any) -> int | dict[str, int]:
        found = cast("dict[str, Entry]", await self._find(path, maxdepth=maxdepth, detail=True, **kwargs))
        sizes = {n: int(e["size"]) for n, e in found.items()}
        return sum(sizes.values()) if total else sizes

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories exist through the blobs below them: only the name is checked."""
        dir_prefix(_name(path))

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        dir_prefix(_name(path))

    def modified(self, path: str) -> datetime:
        """When the live version of a blob was written."""
        entry = self.info(path)
        if entry["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "a directory has no modification time", entry["name"])
        return cast(datetime, entry["mtime"])

    # --- reads ---------------------------------------------------------------------------------

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """``blob[start:end]``: negative bounds count from the end, as in Python slices."""
        _check_bound("start", start)
        _check_bound("end", end)
        blob = blob_path(_name(path))
        client = await self._client()
        offset = start or 0
        if offset >= 0 and (end is None or end >= 0):
            return bytes(await client.get(blob, offset, None if end is None else max(0, end - offset)))
        info = await client.stat(blob)
        first, stop, _ = slice(start, end).indices(info.size)
        return await self._read_pinned(blob, first, stop, (info.version, info.etag))

    async def _read_pinned(self, blob: str, start: int, end: int, pin: Pin) -> bytes:
        """Bytes ``[start, end)`` of the version ``pin`` names; PreconditionFailed if the blob
        has another version by the time they are read."""
        client = await self._client()
        data = await client.get(blob, start, max(0, end - start))
        now = await client.stat(blob)
        if (now.version, now.etag) != pin:
            raise PreconditionFailed(f"{blob!r} changed while open: version {pin[0]} when opened, now {now.version}")
        return bytes(data)

    async def _get_file(self, rpath: str, lpath: str, callback: Any = DEFAULT_CALLBACK, **kwargs: Any) -> None:
        """Download to ``lpath`` atomically (a temporary file beside it, renamed into place);
        a directory becomes a local directory."""
        name = _name(rpath)
        client = await self._client()
        try:
            info = await _stat_blob(client, name)
        except BlobNotFound:
            if not await self._dir_exists(client, name):
                raise
            await asyncio.to_thread(os.makedirs, lpath, exist_ok=True)
            return
        callback.set_size(info.size)
        out = await asyncio.to_thread(LocalFile, os.fspath(lpath))
        try:
            for offset in range(0, info.size, RANGE_BYTES):
                data = await self._read_pinned(info.path, offset, offset + RANGE_BYTES, (info.version, info.etag))
                await asyncio.to_thread(out.write, data)
                callback.relative_update(len(data))
            await asyncio.to_thread(out.commit)
        except BaseException:
            await asyncio.to_thread(out.abort)
            raise

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> BlobFile | BlobWriteFile:
        name = _name(path)
        check_number("open: block_size", block_size, integer(1, optional=True))
        if mode == "rb":
            kwargs.pop("size", None)  # fsspec's reopen (unpickling) passes it; the size comes with the version
            info = sync(self.loop, self._stat_entry, name)
            return BlobFile(self, name, info, block_size=block_size, autocommit=autocommit, cache_options=cache_options, **kwargs)
        if mode not in ("wb", "xb"):
            raise NotImplementedError(f"mode {mode!r} is not supported: blobs are read ('rb') or written whole ('wb', 'xb')")
        if kwargs:
            raise TypeError(f"unexpected options for writing {name!r}: {', '.join(sorted(kwargs))}")
        writable_path(name)
        if mode == "xb" and self.exists(name):
            raise FileExistsError(errno.EEXIST, "already exists", name)
        return BlobWriteFile(self, name, create=mode == "xb", autocommit=autocommit, spool_bytes=SPOOL_MEMORY_BYTES)

    async def _stat_entry(self, name: str) -> Entry:
        client = await self._client()
        return file_entry(await _stat_blob(client, name))

    # --- writes --------------------------------------------------------------------------------

    async def _write_blob(self, blob: str, data: Buffer, *, create: bool = False) -> BlobInfo:
        """``put``; ``create``: only if the path has no blob (else FileExistsError)."""
        client = await self._client()
        try:
            return await client.put(blob, data, if_version=0 if create else None)
        except PreconditionFailed as exc:
            if not create:
                raise
            raise FileExistsError(errno.EEXIST, "already exists", blob[1:]) from exc

    async def _pipe_file(self, path: str, value: Buffer, mode: str = "overwrite", **kwargs: Any) -> None:
        await self._write_blob(writable_path(_name(path)), value, create=_is_create(mode))

    async def _put_file(
        self, lpath: str, rpath: str, callback: Any = DEFAULT_CALLBACK, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        """Upload a local file (a directory uploads nothing: directories are implied)."""
        create = _is_create(mode)
        blob = writable_path(_name(rpath))
        if await asyncio.to_thread(os.path.isdir, lpath):
            return
        data = await asyncio.to_thread(read_local_file, os.fspath(lpath), LOCAL_MMAP_BYTES)
        size = memoryview(data).nbytes
        callback.set_size(size)
        await self._write_blob(blob, data, create=create)
        callback.relative_update(size)

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Read and put (there is no server-side copy), holding at most RANGE_BYTES of a
        large blob in memory."""
        source, target = blob_path(_name(path1)), writable_path(_name(path2))
        client = await self._client()
        info = await client.stat(source)
        if info.size <= SPOOL_MEMORY_BYTES:
            await self._write_blob(target, await client.get(source))  # one get reads one version
            return
        spool = Spool(memory_bytes=0)
        try:
            for offset in range(0, info.size, RANGE_BYTES):
                data = await self._read_pinned(source, offset, offset + RANGE_BYTES, (info.version, info.etag))
                await asyncio.to_thread(spool.write, data)
            await self._write_blob(target, await asyncio.to_thread(spool.view))
        finally:
            spool.close()

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        client = await self._client()
        name = _name(path)
        if "/" not in name:  # a bucket: a directory, never a blob (as in _stat_blob)
            raise BlobNotFound(f"a bucket is not a blob: {name!r}")
        await client.delete(writable_path(name))

    async def _rm(
        self,
        path: str | list[str],
        recursive: bool = False,
        maxdepth: int | None = None,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Delete the blobs ``path`` expands to; a directory goes with its last blob, and
        without ``recursive`` naming one is IsADirectoryError.  A reserved path (blobsdk's own
        records, blobsdk/chunks/names.py) named is InvalidPath; one met in a directory is skipped."""
        if not isinstance(path, str | os.PathLike | list | tuple):
            raise wrong("rm: path", "a str or a list of them", path)
        for named in [path] if isinstance(path, str | os.PathLike) else path:
            if (name := _name(named)).count("/") >= 1:
                refuse_reserved("/" + name)
        names = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        blobs = [n for n in names if n and not is_reserved("/" + n)]  # the root is never a blob
        results = await _run_coros_in_chunks(
            [self._rm_file(n) for n in blobs], batch_size=batch_size or self.batch_size, nofiles=True, return_exceptions=True
        )
        listed_dirs = {parent for n in names for parent in parents(n)}
        client = await self._client()
        for name, result in zip(blobs, results, strict=True):
            if result is None or (isinstance(result, BlobNotFound) and name in listed_dirs):
                continue  # deleted, or a directory whose blobs were listed and deleted here
            if not isinstance(result, BlobNotFound) or not await self._dir_exists(client, name):
                raise result
            if not recursive:
                raise IsADirectoryError(errno.EISDIR, "is a directory: pass recursive=True", name)


def _name(path: object) -> str:
    return cast(str, BlobFileSystem._strip_protocol(path))


async def _stat_blob(client: Client, name: str) -> BlobInfo:
    """The blob at ``name``; a bucket's name (no ``/``) is never one: BlobNotFound, so that
    it is looked up as a directory."""
    if "/" not in name:
        raise BlobNotFound(f"a bucket is not a blob: {name!r}")
    return await client.stat(blob_path(name))


def _check_bound(what: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise TypeError(f"{what} must be an int or None, not {type(value).__name__}")


def _is_create(mode: str) -> bool:
    if mode not in ("overwrite", "create"):
        raise ValueError(f"mode must be 'overwrite' or 'create', not {mode!r}")
    return mode == "create"
