"""A root directory of shard directories that blobsdk owns: the local block store (L4) and
the disk cache (L2, and the L3 node) share these three rules, so they keep them alike.

**Nothing leaves the root through a symlink, nor by its name.**  The root itself is the
user's choice (it may be a symlink, or lie under one); inside it, a shard directory is opened
with ``O_NOFOLLOW`` and every file is opened, created, renamed and deleted relative to that
directory's fd, so a symlink (or a file where a directory belongs) is never followed.  A shard
is only ever two hex digits and a file name one name in its directory (never ``..``, a path or
a NUL), whatever a caller passes (a name from another party's index file, say): anything else
is refused with :class:`UnsafeEntry`.  An operation that
names such an entry (a read, a write, a delete) is refused with :class:`UnsafeEntry`, whose
message names the entry; a scan (listing, sweeping, indexing) ignores it and logs one
warning per entry (:meth:`RootDir.ignore`).  A file that is not a regular file (a FIFO, a
device) is refused the same way, so no open ever blocks on one.

**A temp file belongs to a live writer as long as its writer holds a lock on it.**  The
writer creates it and takes ``flock(LOCK_EX)`` before writing, and keeps the lock until the
file is renamed or removed; the kernel drops the lock when its process dies (also by
SIGKILL).  A sweep removes a temp file only once it obtains the lock itself, so a live
writer's file is never swept, however old or slow, and a dead one's always is: no clocks.
Between a writer's create and its lock a sweep could take the file; the writer sees its
name gone once it holds the lock, and starts again with a new name.  On NFS, Linux emulates
``flock`` with POSIX locks, which do not exclude within one process: each owner also skips
the temp files named with its own token.  A process forked during a write shares the lock
until it exits too: that temp file is swept once both are gone.

**A FORMAT file at the root names the layout:** ``blobsdk <kind> format <n>``, written
atomically (a locked temp file, fsynced, renamed, the root fsynced).  Each owner decides
what a missing, foreign or other-version marker means (see its module).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..chunks import is_hex32
from ..errors import IncompatibleFormat

TMP_SUFFIX = ".tmp"
FORMAT_FILE = "FORMAT"
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")
_MARKER = re.compile(r"blobsdk ([a-z][a-z-]{0,30}) format ([0-9]{1,9})\n")
_MARKER_MAX = 256  # bytes read of a FORMAT file: a longer one is not a marker
_MAX_WARNINGS = 1000  # distinct entries warned about per root; past that, silence

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # the root itself is the user's: followed
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never blocks the open
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_TRIES = 8  # a sweep takes a new temp file before its lock at most this often in a row


class UnsafeEntry(OSError):
    """An entry of a root that is a symlink, or not the kind of file the layout puts there:
    refused, never followed, opened, written or deleted through.  The message names it."""


def refusal(path: str, kind: str, expected: str) -> str:
    """The words for an entry that is ``kind`` where the layout wants ``expected``."""
    return f"{path}: it is {kind}, not {expected} (nothing is followed out of the root)"


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` is, in words."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a special file"


def is_shard_name(name: str) -> bool:
    return _SHARD_NAME.fullmatch(name) is not None


def misnamed(name: str, expected: str) -> str:
    """The words for a name the layout never gives ``expected`` (a path, a parent, a NUL)."""
    return f"{name!r}: not a name of {expected} (nothing is named outside the root)"


def check_file_name(name: str) -> str:
    """``name`` if it names a file in its directory, not elsewhere (a path, ``..``, a NUL);
    else UnsafeEntry.  Every open, create and delete below passes its name through this."""
    if not name or name in (".", "..") or os.sep in name or "\0" in name:
        raise UnsafeEntry(misnamed(name, "a file in its directory"))
    return name


class RootDir:
    """One root of ``<2 hex>/<name>`` shards; ``label`` starts its warnings (``"cache l2"``);
    ``durable``: fsync the root when a shard directory is made.

    Thread-safe: its methods run on the owner's disk threads."""

    def __init__(self, path: Path, *, label: str, log: logging.Logger, durable: bool = True) -> None:
        self.path = path
        self._durable = durable  # fsync the root after making a shard directory
        self._prefix = os.path.join(path, "")
        self._label = label
        self._log = log
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def entry_path(self, shard: str, name: str = "") -> str:
        return f"{self._prefix}{shard}{os.sep}{name}" if name else f"{self._prefix}{shard}"

    @contextmanager
    def shard(self, shard: str, *, create: bool = False) -> Iterator[int]:
        """An fd of the shard directory, closed after the block; FileNotFoundError if there
        is none (``create`` makes it), UnsafeEntry if it is a symlink or
        not a directory."""
        fd = self.open_shard(shard, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def open_shard(self, shard: str, *, create: bool = False) -> int:
        """:meth:`shard` as a plain fd that the caller closes; UnsafeEntry for a name that is
        not a shard's (two hex digits: never a path, never ``..``)."""
        path = self.entry_path(shard)
        if not is_shard_name(shard):
            raise UnsafeEntry(misnamed(path, "a shard directory"))
        if create:
            self._make_dir(path)
        try:
            return os.open(path, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            raise UnsafeEntry(refusal(path, _lkind(path), "a directory")) from None

    def shards(self) -> list[str]:
        """The names of the shard directories, sorted; entries with a shard's name that are
        not directories (a symlink to one included) are ignored with a warning.  Empty
        before the root exists."""
        try:
            with os.scandir(self.path) as entries:
                found = [e for e in entries if is_shard_name(e.name)]
        except FileNotFoundError:
            return []
        shards = []
        for entry in found:
            if entry.is_dir(follow_symlinks=False):
                shards.append(entry.name)
            else:
                self.ignore(refusal(self.entry_path(entry.name), _entry_kind(entry), "a directory"))
        return sorted(shards)

    def files(self, shard: str, dir_fd: int) -> Iterator[os.DirEntry[str]]:
        """The hex-named files and the temp files of one shard (open as ``dir_fd``); other
        names are not ours and skipped silently, and an entry with one of our names that
        is not a regular file (a symlink included) is ignored with a warning."""
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if not (entry.name.endswith(TMP_SUFFIX) or is_hex32(entry.name)):
                    continue
                try:
                    regular = entry.is_file(follow_symlinks=False)
                except OSError:  # removed while we scan
                    continue
                if regular:
                    yield entry
                else:
                    self.ignore(refusal(self.entry_path(shard, entry.name), _entry_kind(entry), "a regular file"))

    def each_shard(self) -> Iterator[tuple[str, int]]:
        """``(name, dir fd)`` of each shard directory in turn (the fd is closed when the
        next is asked for); one that turned into a symlink since the listing is ignored."""
        for shard in self.shards():
            try:
                fd = self.open_shard(shard)
            except FileNotFoundError:
                continue
            except UnsafeEntry as exc:
                self.ignore(str(exc))
                continue
            try:
                yield shard, fd
            finally:
                os.close(fd)

    def marked_version(self, kind: str) -> int | None:
        """The format version ``root/FORMAT`` names; None if there is none.
        IncompatibleFormat if it is not a marker, or another kind's; UnsafeEntry if it is
        a symlink or not a regular file."""
        text = read_marker(self.path)
        if text is None:
            return None
        refused = marker_refusal(self.path, text, kind)
        found = parse_marker(text)
        if refused is not None or found is None:
            raise IncompatibleFormat(f"{self._label}: {refused}")
        return found[1]

    def clear(self) -> int:
        """Remove the regular files of every shard directory (a temp file only once its
        writer is dead); how many were removed.  Nothing outside a shard is touched."""
        removed = 0
        for _, dir_fd in self.each_shard():
            with os.scandir(dir_fd) as entries:
                names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
            for name in names:
                removed += remove_if_dead(dir_fd, name) if name.endswith(TMP_SUFFIX) else unlink_at(dir_fd, name)
        return removed

    def mark(self, text: str, token: str) -> None:
        """Write ``text`` as the FORMAT marker; on a root this process may not write (a
        read-only mount) log a warning and go on without it: the caller checked the format."""
        try:
            write_marker(self.path, text, token)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            self._log.warning("%s: cannot write %s (%s): opened without it", self._label, FORMAT_FILE, exc.strerror)

    def ignore(self, message: str) -> None:
        """Log ``ignored <message>`` once per message (it names the entry)."""
        with self._lock:
            if message in self._warned or len(self._warned) >= _MAX_WARNINGS:
                return
            self._warned.add(message)
        self._log.warning("%s: ignored %s", self._label, message)

    def _make_dir(self, path: str) -> None:
        try:
            os.mkdir(path)  # never follows: an existing symlink is EEXIST, refused at the open
        except FileExistsError:
            return
        if self._durable:
            fsync_dir(self.path)  # a new shard directory must survive a crash with its first file


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(dir_fd: int, name: str, path: str) -> int:
    """An fd (read-only) of the regular file ``name`` in ``dir_fd`` (``path`` names it in
    errors); FileNotFoundError if absent, UnsafeEntry if a symlink or not a regular file."""
    try:
        fd = os.open(check_file_name(name), _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise UnsafeEntry(refusal(path, "a symlink", "a regular file")) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeEntry(refusal(path, kind_of(mode), "a regular file"))
    return fd


def still_named(dir_fd: int, name: str, fd: int) -> bool:
    """Whether ``name`` in ``dir_fd`` is still the file open as ``fd``."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def create_temp(dir_fd: int, final: str, token: str) -> tuple[int, str]:
    """A new temp file for ``final`` in ``dir_fd``, open for writing and locked: ``(fd,
    name)``.  Keep the fd open until the file is renamed or removed (that is the lock)."""
    check_file_name(final)
    for _ in range(_CREATE_TRIES):
        name = f"{final}.{token}-{os.urandom(6).hex()}{TMP_SUFFIX}"
        fd = os.open(name, _CREATE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a sweep looks at it
            if still_named(dir_fd, name, fd):
                return fd, name
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # a sweep took it before we locked it: the next name
    raise OSError(errno.EAGAIN, f"temp files for {final} were swept {_CREATE_TRIES} times before they were locked")


def remove_if_dead(dir_fd: int, name: str) -> bool:
    """Remove temp file ``name`` if no live writer holds its lock; True if removed."""
    try:
        fd = os.open(check_file_name(name), _READ_FLAGS, dir_fd=dir_fd)
    except OSError:  # gone, a symlink, not ours to read: nothing to prove, nothing removed
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live writer holds it
        if not still_named(dir_fd, name, fd):  # renamed to its block meanwhile: done, not dead
            return False
        try:
            os.unlink(name, dir_fd=dir_fd)  # under our lock: its writer cannot be using it
        except PermissionError:  # a directory we may not write: left for one that may
            return False
        return True
    finally:
        os.close(fd)


def unlink_if_same(dir_fd: int, name: str, fd: int) -> None:
    """Delete ``name`` unless another process replaced it with a new file meanwhile."""
    with suppress(OSError):
        if still_named(dir_fd, name, fd):
            os.unlink(name, dir_fd=dir_fd)


# --- the FORMAT marker -----------------------------------------------------------------


def marker_text(kind: str, version: int) -> str:
    return f"blobsdk {kind} format {version}\n"


def parse_marker(text: str) -> tuple[str, int] | None:
    """``(kind, version)`` of a marker's text; None if it is not a marker."""
    found = _MARKER.fullmatch(text)
    return (found[1], int(found[2])) if found else None


def read_marker(root: Path) -> str | None:
    """The text of ``root/FORMAT`` (None if there is none); UnsafeEntry if it is a symlink
    or not a regular file.  Undecodable bytes become U+FFFD: never a marker."""
    data = read_root_file(root, FORMAT_FILE, _MARKER_MAX + 1)
    return None if data is None else data.decode("utf-8", "replace")


def read_root_file(root: Path | str, name: str, limit: int = -1) -> bytes | None:
    """The bytes of ``root/name`` (at most ``limit``; -1: all), None if there is none;
    UnsafeEntry if it is a symlink or not a regular file.  The root itself is followed."""
    dir_fd = os.open(root, _ROOT_FLAGS)
    try:
        fd = open_regular(dir_fd, name, os.path.join(root, name))
    except FileNotFoundError:
        return None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as src:
        return src.read(limit)


def write_marker(root: Path, text: str, token: str) -> None:
    """Write ``root/FORMAT`` atomically and durably (also over an existing one)."""
    write_root_file(root, FORMAT_FILE, [text.encode()], token, durable=True)


def write_root_file(root: Path | str, name: str, parts: list[bytes], token: str, *, durable: bool) -> None:
    """Write ``root/name`` atomically (a locked temp file renamed over it), sweeping the temp
    files of earlier writes of it that died; ``durable``: fsync the file and the root too."""
    dir_fd = os.open(root, _ROOT_FLAGS)
    try:
        for found, temp in _files_at(dir_fd):
            if temp and found.startswith(f"{name}."):
                remove_if_dead(dir_fd, found)  # a write that died
        fd, temp_name = create_temp(dir_fd, name, token)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                out.writelines(parts)
            if durable:
                os.fsync(fd)
            os.replace(temp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(temp_name, dir_fd=dir_fd)
            raise
        finally:
            os.close(fd)
        if durable:
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def unlink_at(dir_fd: int, name: str) -> bool:
    """Unlink ``name`` in the directory ``dir_fd``; False if it was gone already."""
    try:
        os.unlink(check_file_name(name), dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _files_at(dir_fd: int) -> list[tuple[str, bool]]:
    with os.scandir(dir_fd) as entries:
        return [(e.name, e.name.endswith(TMP_SUFFIX)) for e in entries if e.is_file(follow_symlinks=False)]


def _lkind(path: str) -> str:
    try:
        return kind_of(os.lstat(path).st_mode)
    except OSError:
        return "gone"


def _entry_kind(entry: os.DirEntry[str]) -> str:
    try:
        return "a symlink" if entry.is_symlink() else kind_of(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return "gone"


def marker_refusal(root: Path, text: str, kind: str) -> str | None:
    """Why FORMAT ``text`` rules ``root`` out as a ``kind`` (not a marker, or another
    kind's); None if it is a marker of ``kind``, in a version its owner judges."""
    found = parse_marker(text)
    where = os.path.join(root, FORMAT_FILE)
    if found is None:
        return f"{where} is not a blobsdk format marker: refusing to open {root} as a {kind}"
    if found[0] != kind:
        return f"{where} says {root} holds a blobsdk {found[0]}, not a {kind}: refusing to open it"
    return None
