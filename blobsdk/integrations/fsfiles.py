"""The files of ``blob://`` (blobsdk/fsspec.py): a blob open for reading, one being
written, the spool that holds what is written, and a local file written beside its target and
renamed into place.  The semantics are described in blobsdk/fsspec.py."""

from __future__ import annotations

import io
import mmap
import os
import secrets
import stat
import tempfile
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from .._arguments import check_bytes_like
from .._extras import requires_extra

with requires_extra("fsspec", "blobsdk.fsspec"):
    from fsspec.asyn import sync  # type: ignore[import-untyped]
    from fsspec.spec import AbstractBufferedFile  # type: ignore[import-untyped]

from ..sources import Buffer
from ..wire import BlobInfo

if TYPE_CHECKING:
    import asyncio

    from _typeshed import ReadableBuffer

MiB = 1 << 20
READ_BLOCK_BYTES = 4 * MiB  # see blobsdk/fsspec.py's module docstring
Entry = dict[str, Any]
Pin = tuple[int, str]  # (version, etag) of the blob version a read must come from


class FileSystem(Protocol):
    """What a file of ``blob://`` uses of its filesystem (blobsdk/fsspec.py's BlobFileSystem,
    which opens the files and so sits above them)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    async def _read_pinned(self, blob: str, start: int, end: int, pin: Pin) -> bytes: ...

    async def _write_blob(self, blob: str, data: Buffer, *, create: bool = False) -> BlobInfo: ...

    def unstrip_protocol(self, name: str) -> str: ...


class BlobFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec is untyped
    """A blob open for reading: seekable, read through fsspec's block cache with ranged
    gets, every one of them from the version the file was opened at."""

    DEFAULT_BLOCK_SIZE = READ_BLOCK_BYTES

    def __init__(self, fs: FileSystem, name: str, info: Entry, **kwargs: Any) -> None:
        super().__init__(fs, name, mode="rb", size=info["size"], **kwargs)
        self.details = info
        self._blob = "/" + name
        self._pin: Pin = (info["version"], info["etag"])

    def _fetch_range(self, start: int, end: int) -> bytes:
        return cast(bytes, sync(self.fs.loop, self.fs._read_pinned, self._blob, start, end, self._pin))


class BlobWriteFile(io.RawIOBase):
    """A blob being written: the bytes are spooled and put as one new version by
    :meth:`commit`, which ``close`` calls (``autocommit``; in ``fs.transaction`` the
    transaction does).  Leaving a ``with`` block by an exception discards them."""

    def __init__(self, fs: FileSystem, name: str, *, create: bool, autocommit: bool, spool_bytes: int) -> None:
        super().__init__()
        self.fs = fs
        self.path = name
        self.mode = "xb" if create else "wb"
        self.autocommit = autocommit
        self.committed: BlobInfo | None = None  # what commit wrote
        self._create = create
        self._spool: Spool | None = Spool(spool_bytes)
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        check_bytes_like("write: data", data)
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self._spool is None:
            raise ValueError(f"{self.path!r} was discarded: nothing more can be written")
        written = self._spool.write(data)
        self._size += written
        return written

    def tell(self) -> int:
        return self._size

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.autocommit:
                self.commit()
        finally:
            super().close()

    def commit(self) -> None:
        """Put what was written as the blob's new version (once; a no-op if discarded)."""
        spool, self._spool = self._spool, None
        if spool is None:
            return
        try:
            blob = "/" + self.path
            self.committed = sync(self.fs.loop, self.fs._write_blob, blob, spool.view(), create=self._create)
        finally:
            spool.close()

    def discard(self) -> None:
        """Drop what was written; the blob keeps its previous version."""
        spool, self._spool = self._spool, None
        if spool is not None:
            spool.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.discard()
        self.close()

    def __del__(self) -> None:
        self.discard()  # never commit from a finalizer

    def __repr__(self) -> str:
        return f"<BlobWriteFile {self.fs.unstrip_protocol(self.path)} mode={self.mode!r}>"


class Spool:
    """Bytes written so far: in memory up to ``memory_bytes``, then in an anonymous
    temporary file (``tempfile``'s directory, so ``TMPDIR``)."""

    def __init__(self, memory_bytes: int) -> None:
        self._limit = memory_bytes
        self._memory = bytearray()
        self._file: IO[bytes] | None = None
        self.size = 0

    def write(self, data: ReadableBuffer) -> int:
        n = memoryview(data).nbytes
        if self._file is None and self.size + n > self._limit:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115  # closed by close()
            self._file.write(self._memory)
            self._memory = bytearray()
        if self._file is None:
            self._memory += data
        else:
            self._file.write(data)
        self.size += n
        return n

    def view(self) -> Buffer:
        """Everything written: the memory itself, or a map of the file (the view keeps the
        map, so it outlives :meth:`close`)."""
        if self._file is None:
            return self._memory
        self._file.flush()
        return memoryview(mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._memory = bytearray()


class LocalFile:
    """A local file written under a temporary name beside it and renamed into place by
    :meth:`commit` (blocking: run on a thread).  The temporary file is created as ``open``
    would create the file, so the result has the usual permissions."""

    def __init__(self, path: str) -> None:
        parent, base = os.path.split(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._path = path
        self._tmp = os.path.join(parent, f".{base}.{secrets.token_hex(6)}.partial")
        self._file = open(self._tmp, "xb")  # noqa: SIM115  # closed by commit or abort

    def write(self, data: Buffer) -> None:
        self._file.write(data)

    def commit(self) -> None:
        self._file.close()
        os.replace(self._tmp, self._path)

    def abort(self) -> None:
        self._file.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


def read_local_file(path: str, mmap_bytes: int) -> Buffer:
    """A local file's bytes: a regular file of ``mmap_bytes`` or more is mapped, not copied (the view keeps the
    map); anything else is read to its end."""
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size < mmap_bytes:
            return f.read()
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
