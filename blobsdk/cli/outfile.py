"""Writing a blob to the local ``OUT`` of ``blobsdk get PATH OUT`` without changing what
``OUT`` is.

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


def write_out(out: Path, data: Buffer) -> None:
    """Write ``data`` to ``out``; see the module docstring."""
    target = Path(os.path.realpath(out))
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is None or stat.S_ISREG(mode):
        _replace(target, data, None if mode is None else stat.S_IMODE(mode) & 0o777)
    else:
        _write_through(target, data)


def _replace(target: Path, data: Buffer, mode: int | None) -> None:
    """Temp file + rename; ``mode`` the permission bits to keep (None: a new file's)."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_through(target: Path, data: Buffer) -> None:
    """Open what is there for writing (no create, no truncate: a FIFO or device) and write."""
    fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
