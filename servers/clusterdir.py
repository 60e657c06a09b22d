"""A cluster's directory (servers/cluster.py): its ``run`` and ``logs`` made, and held by one
running cluster at a time (``DIR/run/lock``, an flock with the holder's pid in it)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .supervisor import ClusterError


def make_dirs(dir: Path) -> None:
    """``DIR/run`` and ``DIR/logs``; a ClusterError naming DIR if they cannot be made."""
    try:
        for sub in ("run", "logs"):
            (dir / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there, or a directory it may not write in
        raise ClusterError(f"cannot make the cluster's directory {dir}: {exc.strerror}") from exc


_HELD: set[int] = set()  # the directory locks this process holds


def hold(dir: Path) -> int:
    """An exclusive lock on ``DIR/run/lock`` (with this process's pid in it) for as long as
    the cluster runs: a second cluster in a directory in use would share the first one's
    metadata, blocks and L3 files and replace its client.toml, so it is refused before it
    touches anything.  The kernel drops the lock when this process dies, SIGKILL too."""
    fd = os.open(dir / "run" / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 20, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ClusterError(
            f"{dir} is in use by a running cluster (pid {holder}): stop it first (Ctrl-C or SIGTERM),"
            " or start this one in another directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD.add(fd)
    return fd


def release(fd: int) -> None:
    _HELD.discard(fd)
    fcntl.flock(fd, fcntl.LOCK_UN)  # the open file's lock: a forked child's copy of it too
    os.close(fd)


def _forget_held() -> None:
    """In a forked child: its copies of the locks are not its own (closing them leaves the
    parent's lock as it is), so a child that lives on never keeps a directory in use."""
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_held)
