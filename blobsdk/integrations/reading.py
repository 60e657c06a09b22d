"""How a dataset of blobsdk.torch reads in each process: readahead and deep-prefetch
settings, the readahead of an iteration started before it, the deep prefetch a window ahead,
and the workers' published stats (see blobsdk/torch.py's module docstring)."""

from __future__ import annotations

import contextlib
import multiprocessing.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._extras import requires_extra

with requires_extra("torch", "blobsdk.torch"):
    from torch.utils.data import get_worker_info

from ..runtime import WorkerStats, counters_of, total
from ..sync import SyncClient, SyncPrefetch, SyncReadahead
from .order import Position, is_int
from .stores import PREFETCH_TIERS, ClosedOnExit, ProcessClient, Store

Sample = tuple[str, bytearray]
Transform = Callable[[Sample], Any]


@dataclass(frozen=True)
class Reading:
    """How an iteration reads: readahead depth and bytes, deep-prefetch window and tier."""

    readahead: int
    readahead_bytes: int
    prefetch_window: int | None
    prefetch_tier: str | None  # resolved: a tier the store has, or None (no deep prefetch)

    @classmethod
    def of(cls, store: Store, readahead: int, readahead_bytes: int, window: int | None, tier: str | None) -> Reading:
        if not is_int(readahead) or readahead < 1:
            raise ValueError(f"readahead must be an int >= 1, got {readahead!r}")
        if not is_int(readahead_bytes) or readahead_bytes < 1:
            raise ValueError(f"readahead_bytes must be an int >= 1, got {readahead_bytes!r}")
        if window is not None and (not is_int(window) or window < 1):
            raise ValueError(f"prefetch_window must be an int >= 1 or None, got {window!r}")
        tier = prefetch_tier(store, tier)
        return cls(readahead, readahead_bytes, window, tier if window is not None else None)


def prefetch_tier(store: Store, tier: str | None) -> str | None:
    has = store.cache_tiers()
    if tier == "auto":
        return has[0] if has else None
    if tier is not None and tier not in PREFETCH_TIERS:
        raise ValueError(f"prefetch_tier must be 'auto', 'l1', 'l2', 'l3' or None, got {tier!r}")
    if tier is not None and tier not in has:
        configured = ", ".join(map(repr, has)) or "none"
        raise ValueError(f"prefetch_tier {tier!r} is not configured for this store; configured: {configured}")
    return tier


class Ahead:
    """An iteration's readahead started before it: closed when taken by a wrong guess, when
    the dataset closes, or at the exit of its process (before the client closes)."""

    def __init__(self, paths: list[str], reads: SyncReadahead) -> None:
        self.paths = paths
        self.reads = reads
        self.finalizer = multiprocessing.util.Finalize(self, reads.close, exitpriority=1)


@dataclass
class Iteration:
    position: Position
    paths: list[str] = field(repr=False)  # this worker's samples of the epoch, in order


def readahead(client: SyncClient, paths: Sequence[str], reading: Reading) -> SyncReadahead:
    """``client.readahead``: a generator, whose closing cancels the reads in flight."""
    return client.readahead(paths, depth=reading.readahead, max_bytes=reading.readahead_bytes)


def publish(stats: WorkerStats, client: SyncClient, *, force: bool = False) -> None:
    """In a DataLoader worker, publish its client's counters (if ``force`` or due)."""
    info = get_worker_info()
    if info is not None and (force or stats.due()):
        counters = stats_of(client)
        if counters is not None:
            stats.publish(info.id, counters, force=True)


def stats_of(client: SyncClient) -> dict[str, dict[str, int | float]] | None:
    """``client.stats()``, read in this thread while the client's loop thread runs: some
    tiers' extra stats iterate a dict that loop may change meanwhile (RuntimeError), so it
    is read again, and given up for this publish (never failing a read) if it keeps failing."""
    for _ in range(3):
        with contextlib.suppress(RuntimeError):
            return client.stats()
    return None


def worker_stats(stats: WorkerStats, client: ProcessClient) -> dict[str, Any]:
    """``{"workers": {id: counters}, "main": counters, "total": counters}``: per tier
    ("l1" ... "l4") ``hits, misses, bytes, corrupt, errors`` and ``enabled``, cumulative, as
    each worker last published them (see blobsdk/runtime/workerstats.py); "main" is this process's
    own client (when it read, e.g. ``num_workers=0``), left out if it has none; "total" sums
    them all."""
    workers = stats.read()
    out: dict[str, Any] = {"workers": workers}
    parts = list(workers.values())
    main = client.opened()
    if main is not None:
        out["main"] = counters_of(main.stats())
        parts.append(out["main"])
    out["total"] = total(parts)
    return out


def current_worker() -> tuple[int, int]:
    """``(id, num_workers)`` of the DataLoader worker this runs in; ``(0, 1)`` outside one."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def check_transform(transform: object) -> Transform:
    if transform is None:
        return identity
    if not callable(transform):
        raise TypeError(f"transform must be callable or None, not {type(transform).__name__}")
    return transform


def identity(sample: Sample) -> Sample:
    return sample


class WindowPrefetch(ClosedOnExit):
    """Deep prefetch of one iteration's samples, a window ahead: :meth:`enter` at each position
    starts window ``k+1`` on entering window ``k`` and cancels the windows before ``k``;
    :meth:`close` cancels what still runs."""

    def __init__(self, client: SyncClient, paths: Sequence[str], window: int | None, tier: str | None) -> None:
        self._client = client
        self._paths = paths
        self._window = window
        self._tier = tier
        self._entered: int | None = None
        self.running: dict[int, SyncPrefetch] = {}  # window -> its prefetch

    def enter(self, position: int) -> None:
        if self._window is None or self._tier is None or position // self._window == self._entered:
            return
        first, current = self._entered is None, position // self._window
        self._entered = current
        self._cancel([w for w in self.running if w < current])
        for window in (current, current + 1) if first else (current + 1,):  # the first also warms its own
            ahead = self._paths[window * self._window : (window + 1) * self._window]
            if ahead:
                self.running[window] = self._client.prefetch(ahead, tier=self._tier)

    def close(self) -> None:
        self._cancel(list(self.running))

    def _cancel(self, windows: list[int]) -> None:
        for window in windows:
            handle = self.running.pop(window)
            if not handle.done:
                handle.cancel()
