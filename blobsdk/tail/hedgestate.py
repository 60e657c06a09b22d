"""What a hedger (blobsdk/tail/hedge.py) shares with the races it runs (blobsdk/tail/race.py):
the attempt at one candidate, whether an attempt's error moves on to the next, the error once
every one failed, its latency estimates, its hedge budget, its counters, and
:class:`RaceHost`, the hedger as a race sees it.  It sits below both, so a race names what it
uses of its hedger without importing the hedger, which starts races."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..config import MIN_SAMPLES, HedgeConfig
from ..errors import BlobError, HedgeExhausted
from .deadlines import Deadlines
from .health import HangWatch, TargetHealth

T = TypeVar("T")
R = TypeVar("R")

_REFRESH_FRACTION = 8  # re-sort a window after 1/8 of it is new samples


def is_failover(exc: BaseException) -> bool:
    """Whether an attempt's error is about that candidate only (so another may succeed)."""
    return isinstance(exc, BlobError) and not isinstance(exc, ValueError)


def exhausted(failures: list[tuple[T, BaseException]], key_of: Callable[[T], str]) -> HedgeExhausted:
    """The error once every candidate failed: each failure described, the last as cause."""
    if not failures:
        return HedgeExhausted("no candidates to try", [])
    described = "; ".join(f"{key_of(c)}: {type(e).__name__}: {e}" for c, e in failures)
    exc = HedgeExhausted(f"all {len(failures)} candidates failed: {described}", failures)
    exc.__cause__ = failures[-1][1]
    return exc


class _Window:
    """The last ``size`` samples of one target, cached quantiles of them, and when the
    last one came."""

    __slots__ = ("at", "fresh", "median", "samples", "value")

    def __init__(self, size: int) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self.fresh = 0  # samples added since ``value`` was computed
        self.value: float | None = None
        self.median: float | None = None
        self.at = -math.inf  # clock time of the last sample

    def add(self, seconds: float, at: float) -> None:
        self.samples.append(seconds)
        self.fresh += 1
        self.at = at

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the window, re-sorted only once enough of it is new."""
        n = len(self.samples)
        if n < MIN_SAMPLES:
            return None
        if self.value is None or self.fresh * _REFRESH_FRACTION >= n:
            ordered = sorted(self.samples)
            self.value, self.median = ordered[min(n - 1, int(q * n))], ordered[n // 2]
            self.fresh = 0
        return self.value


class LatencyTracker:
    """A cheap streaming latency quantile per target, and the hedge delay it implies.

    Each target keeps its last ``window`` samples in a ring; the quantile is recomputed by
    sorting the ring once 1/8 of it is new (128 floats sort in a few µs: well under a µs per
    sample, and the estimate lags by at most 1/8 window).  A ring is exact over its window
    and forgets old behaviour in ``window`` samples, unlike an EWMA of mean + k·deviation,
    which assumes a shape the heavy-tailed HDD/network latencies do not have.  A target with
    fewer than ``MIN_SAMPLES`` samples borrows the quantile of all targets together; with
    none anywhere the delay is ``max_delay_ms``.  :meth:`typical` (the median of a target's
    recent samples) is for ranking targets, which a few slow samples must not decide.
    """

    def __init__(self, config: HedgeConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._targets: dict[str, _Window] = {}
        self._all = _Window(config.window)

    def forget(self, target: str) -> None:
        """Drop ``target``'s own window (no longer a target; the samples of all stay)."""
        self._targets.pop(target, None)

    def record(self, target: str, seconds: float) -> None:
        window = self._targets.get(target)
        if window is None:
            window = self._targets[target] = _Window(self._config.window)
        now = self._clock()
        window.add(seconds, now)
        self._all.add(seconds, now)

    def typical(self, target: str, within: float) -> float | None:
        """The median latency of ``target``'s own window, if its last sample is at most
        ``within`` seconds old.  Else None, and the window starts afresh: what the target did
        then says little about it now, and a target ranked last for being slow gets no
        samples to say otherwise."""
        window = self._targets.get(target)
        if window is None:
            return None
        if self._clock() - window.at > within:
            self._targets[target] = _Window(self._config.window)
            return None
        return window.median if window.quantile(self._config.quantile) is not None else None

    def estimate(self, target: str) -> float | None:
        """The latency quantile of ``target`` (or of all targets), None if unmeasured."""
        window = self._targets.get(target)
        own = None if window is None else window.quantile(self._config.quantile)
        return own if own is not None else self._all.quantile(self._config.quantile)

    def delay(self, target: str) -> float:
        """Seconds to wait for ``target`` before hedging: its estimate, clamped."""
        low, high = self._config.min_delay_ms / 1000, self._config.max_delay_ms / 1000
        estimate = self.estimate(target)
        return high if estimate is None else min(high, max(low, estimate))

    def hedge_delay(self, target: str, next_target: str) -> float:
        """How long an attempt at ``target`` runs before ``next_target`` is hedged to: the
        shorter of their delays.  By the next one's p95 it would have answered 95 times in
        100, so an attempt still running then is better raced, even when it is only its
        own target's usual pace: a replica slow on every read, behind a slow link, has a
        p95 as slow as its reads, and its own delay alone would hedge none of them."""
        return min(self.delay(target), self.delay(next_target))


class HedgeBudget:
    """A token bucket: each primary request earns ``ratio`` tokens (capped at ``burst``,
    starting full), each hedge spends one."""

    def __init__(self, ratio: float, burst: float) -> None:
        self._ratio = ratio
        self._burst = burst
        self.tokens = burst

    def earn(self) -> None:
        self.tokens = min(self._burst, self.tokens + self._ratio)

    def try_spend(self) -> bool:
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class HedgeStats:
    """``primaries``: requests run; ``hedges_sent``/``hedges_won``: hedged attempts started /
    that returned first; ``budget_exhausted``: requests that wanted a hedge and had no token;
    ``failovers``: attempts started because another one failed; ``hedges_deferred``:
    requests whose hedge waited for its target to have room; ``hung_failovers``: attempts
    failed over because they outlived their hang deadline or their target was hung (see
    blobsdk/tail/health.py)."""

    primaries: int = 0
    hedges_sent: int = 0
    hedges_won: int = 0
    budget_exhausted: int = 0
    failovers: int = 0
    hedges_deferred: int = 0
    hung_failovers: int = 0


class RaceHost(Protocol):
    """What a race reads and updates of the hedger that runs it (:class:`~blobsdk.tail.hedge.Hedger`)."""

    config: HedgeConfig
    clock: Callable[[], float]
    latency: LatencyTracker
    budget: HedgeBudget
    counts: HedgeStats
    health: TargetHealth
    hangs: HangWatch  # the hang rule on its attempts, and the races in flight, poked when one finds a target hung

    def answered_of(self, target: str) -> Callable[[], None]: ...

    def deadlines(self, loop: asyncio.AbstractEventLoop | None = None) -> Deadlines: ...
