"""Writing a blob to the local ``OUT`` of ``blobsdk get PATH OUT`` without changing what
``OUT`` is, and failing before the blob is read when ``OUT`` cannot be made.

- a regular file, or nothing: written to a temp file in the same directory and renamed over
  it, so a reader never sees half a file.  A new file gets the mode ``open(OUT, "w")`` would
  give it (0666 less the umask: the temp file is created with 0666 and the kernel applies
  the umask); a file replaced keeps its permission bits.
- a symlink: the same, at the file it points to (resolved through every link); the link
  itself is never replaced.  A dangling link gets its target created, as ``open`` would.
- anything else (a FIFO, a character or block device such as /dev/null or a tty): written
  through, opened for writing as it is, never replaced nor truncated.  A directory or a
  socket is the OSError that opening it for writing raises (``blobsdk get PATH DIR`` does
  not come here with a directory: it writes ``DIR/<last segment of PATH>``, as ``cp`` does).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ..sources import Buffer


class OutFile:
    """Where ``blobsdk get PATH OUT`` writes: made before the blob is read, so an ``OUT`` that
    cannot be created (its directory missing or not writable) fails at once, not after a
    long read, and with ``OUT``'s name, not the temp file's.  Then exactly one of
    :meth:`commit` (the bytes written, OUT replaced or written through) or :meth:`discard`
    (OUT as it was)."""

    def __init__(self, out: Path) -> None:
        self.target = Path(os.path.realpath(out))
        try:
            mode: int | None = os.stat(self.target).st_mode
        except FileNotFoundError:
            mode = None
        self._through = mode is not None and not stat.S_ISREG(mode)
        self._keep_mode = None if mode is None else stat.S_IMODE(mode) & 0o777
        self._tmp: Path | None = None
        self._fd: int | None = None
        if not self._through:
            self._tmp = self.target.with_name(f".{self.target.name}.{secrets.token_hex(6)}.partial")
            try:
                self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except OSError as exc:
                raise type(exc)(exc.errno, exc.strerror, str(self.target)) from None

    def commit(self, data: Buffer) -> None:
        """Write ``data``: to the temp file renamed over OUT (keeping a replaced file's
        permission bits), or through what OUT is (a FIFO or device; see the module docstring)."""
        if self._through:
            _write_through(self.target, data)
            return
        assert self._fd is not None and self._tmp is not None
        fd, self._fd = self._fd, None
        try:
            with os.fdopen(fd, "wb") as f:
                if self._keep_mode is not None:
                    os.fchmod(f.fileno(), self._keep_mode)
                f.write(data)
            os.replace(self._tmp, self.target)
        except BaseException:
            self._tmp.unlink(missing_ok=True)
            raise

    def discard(self) -> None:
        """Nothing is written: the temp file goes, OUT stays as it was."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def _write_through(target: Path, data: Buffer) -> None:
    """Open what is there for writing (no create, no truncate: a FIFO or device) and write."""
    fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
