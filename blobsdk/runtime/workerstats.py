"""DataLoader workers' tier counters, seen from the main process: ``dataset.worker_stats()``.

Each DataLoader worker has its own client (torch.py), whose ``stats()`` the training loop
cannot call.  So a dataset, when it is built in the main process, creates one small file in
shared memory (``/dev/shm`` when there is one, else the temp directory), and each worker writes
its client's additive counters into its own fixed slot of it: ``slot = worker id``, at offset
``id * SLOT.size`` (the file grows as far as the highest id writes).  The file is named by its
path, so a forked, forkserver'd or spawned copy of the dataset opens it again (once per
process), and it is removed when the dataset closes, is collected, or its process exits.

**A slot** is a ``struct``: an xxh3-64 checksum of the rest, the writer's pid, a bit mask of the
tiers its client has, then ``hits, misses, bytes, corrupt, errors`` of each tier of
``TIER_NAMES``, little-endian 64-bit.  It is written with one ``pwrite`` and read with one
``pread``; a reader that sees a torn slot (checksum mismatch) reads again.  Latency quantiles
are left out: quantiles of several workers do not add up (read each worker's with its own
``client.stats()`` if needed).

**When.** A worker publishes at most every ``PUBLISH_EVERY`` seconds while it reads, and the
iterable dataset also when it hands out the last sample of its epoch (before that sample
reaches the main process, so ``worker_stats()`` after an epoch has all its reads); the
map-style dataset after each batch.  A publish never waits on anything but that ``pwrite``,
and a failing one (the dataset closed) turns publishing off in that worker.

**Across epochs.** Counters are cumulative: a worker process that takes over a slot (the next
epoch's, unless ``persistent_workers``) first reads what the slot holds and adds its own
counters to it.  One DataLoader iterates a dataset at a time: two at once would share slots.
Reads a worker makes after its last publish (the next epoch's readahead of a worker that then
exits) are not seen.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import time
import weakref
from collections.abc import Callable

import xxhash

from ..stats import TIER_NAMES

COUNTERS = ("hits", "misses", "bytes", "corrupt", "errors")
SLOT = struct.Struct(f"<QqQ{len(TIER_NAMES) * len(COUNTERS)}Q")  # checksum, pid, enabled mask, counters
PUBLISH_EVERY = 0.5  # seconds between a worker's publishes while it reads
_READ_TRIES = 8  # reads of a torn slot before it is skipped

TierCounters = dict[str, int | bool]
Stats = dict[str, TierCounters]  # tier -> counters (and "enabled")


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _remove(path: str, pid: int) -> None:
    """Remove the file, in the process that created it only (a forked copy's finalizer runs
    in the child too)."""
    if os.getpid() == pid:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class WorkerStats:
    """The shared slots of one dataset (see the module docstring).  Built in the main process;
    its copies in workers publish, the main process reads."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="blobsdk-workerstats-", dir=_shm_dir())
        os.close(fd)
        self._creator = os.getpid()
        self._finalizer: Callable[[], object] = weakref.finalize(self, _remove, self.path, self._creator)
        self._writer: _Writer | None = None  # this process's, when it is a worker

    def publish(self, worker: int, stats: dict[str, dict[str, int | float]], *, force: bool = False) -> None:
        """Write ``stats`` (a client's ``stats()``) to slot ``worker``: now if ``force``,
        else if ``PUBLISH_EVERY`` seconds have passed since this process's last publish."""
        writer = self._writer
        if writer is None or writer.pid != os.getpid() or writer.worker != worker:
            writer = self._writer = _Writer.open(self.path, worker)
        writer.write(stats, force=force)

    def due(self) -> bool:
        """Whether a publish now would write (cheap: call it before building the stats)."""
        writer = self._writer
        return writer is None or writer.pid != os.getpid() or writer.due()

    def read(self) -> dict[int, Stats]:
        """Each worker's published counters, by worker id (an empty dict once closed)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        out: dict[int, Stats] = {}
        for worker in range(len(data) // SLOT.size):
            raw = data[worker * SLOT.size : (worker + 1) * SLOT.size]
            slot = _decode(raw) if any(raw) else None
            if slot is None and any(raw):
                slot = _read_slot(self.path, worker)  # torn: a write was under way
            if slot is not None:
                out[worker] = slot[1]
        return out

    def close(self) -> None:
        """Remove the file (in the process that created it, from the object it built, not
        from a pickled copy)."""
        self._finalizer()

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "_creator": self._creator, "_writer": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._finalizer = _never  # a pickled copy (a spawned worker's) does not own the file


def _never() -> None:
    pass


class _Writer:
    """One worker process's open slot: its fd, the counters it found there (a previous
    worker's of the same id) and when it last wrote."""

    def __init__(self, fd: int | None, worker: int, base: list[int]) -> None:
        self.pid = os.getpid()
        self.fd = fd  # None: publishing is off in this process
        self.worker = worker
        self.base = base
        self.last = -PUBLISH_EVERY
        self._closer = None if fd is None else weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, path: str, worker: int) -> _Writer:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return cls(None, worker, [])
        found = _read_slot(path, worker)
        return cls(fd, worker, [] if found is None or found[0] == os.getpid() else _counters(found[1]))

    def due(self) -> bool:
        return self.fd is not None and time.monotonic() - self.last >= PUBLISH_EVERY

    def write(self, stats: dict[str, dict[str, int | float]], *, force: bool) -> None:
        if self.fd is None or not (force or self.due()):
            return
        counters = [int(stats[tier][name]) for tier in TIER_NAMES for name in COUNTERS]
        if self.base:
            counters = [a + b for a, b in zip(counters, self.base, strict=True)]
        mask = sum(1 << i for i, tier in enumerate(TIER_NAMES) if stats[tier].get("enabled"))
        body = SLOT.pack(0, self.pid, mask, *counters)[8:]
        try:
            os.pwrite(self.fd, struct.pack("<Q", xxhash.xxh3_64_intdigest(body)) + body, self.worker * SLOT.size)
        except OSError:  # e.g. no space left: publishing is off in this process
            if self._closer is not None:
                self._closer()
            self.fd = None
            return
        self.last = time.monotonic()


def _decode(raw: bytes) -> tuple[int, Stats] | None:
    """``(pid, stats)`` of a written, whole slot; None for an empty or torn one."""
    if len(raw) < SLOT.size:
        return None
    checksum, pid, mask, *counters = SLOT.unpack(raw)
    if pid == 0 or checksum != xxhash.xxh3_64_intdigest(raw[8:]):
        return None
    per = len(COUNTERS)
    stats: Stats = {}
    for i, tier in enumerate(TIER_NAMES):
        stats[tier] = {**dict(zip(COUNTERS, counters[i * per : (i + 1) * per], strict=True)), "enabled": bool(mask >> i & 1)}
    return pid, stats


def _read_slot(path: str, worker: int) -> tuple[int, Stats] | None:
    """One slot, read again while it is torn (a write was under way); None if empty."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        for _ in range(_READ_TRIES):
            raw = os.pread(fd, SLOT.size, worker * SLOT.size)
            found = _decode(raw) if any(raw) else None
            if found is not None or not any(raw):
                return found
        return None
    finally:
        os.close(fd)


def _counters(stats: Stats) -> list[int]:
    return [int(stats[tier][name]) for tier in TIER_NAMES for name in COUNTERS]


def total(parts: list[Stats]) -> Stats:
    """Counters summed over ``parts``; a tier is enabled if it is in any of them."""
    out: Stats = {tier: {**dict.fromkeys(COUNTERS, 0), "enabled": False} for tier in TIER_NAMES}
    for part in parts:
        for tier in TIER_NAMES:
            for name in COUNTERS:
                out[tier][name] = int(out[tier][name]) + int(part[tier][name])
            out[tier]["enabled"] = bool(out[tier]["enabled"]) or bool(part[tier]["enabled"])
    return out


def counters_of(stats: dict[str, dict[str, int | float]]) -> Stats:
    """A client's ``stats()`` cut to what workers publish (the main process's own client)."""
    return {
        tier: {**{name: int(stats[tier][name]) for name in COUNTERS}, "enabled": bool(stats[tier]["enabled"])}
        for tier in TIER_NAMES
    }
