"""When a hedged request looks again: the hedge delay its targets' latencies set
(:class:`LatencyTracker`), one event-loop timer for every race of a hedger
(blobsdk/tail/race.py), and each race's :class:`Timer` in it.

The races of one hedger share a heap of deadlines on their hedger's clock and one loop timer
for the earliest; a batch of 100 reads sets it once, where each read set and cancelled a loop
timer of its own (``loop.call_later``), though its primary answers first nearly every time.
A deadline is a small list; cancelling one only marks it (and lets go of its callback, so of
its race), and the heap is dropped whole once no deadline is left.  The loop timer is then
left to fire once, idle, rather than be cancelled: reads one after another (each ends before
its hedge is due) then set it once per hedge delay, not once per read.  First looks are
batched the same way: one ``call_soon`` per turn of the loop, for every race that asked
during that turn.  What this saved is in docs/benchmarks.md ("hedging").

A race's :class:`Timer` is its one deadline in that heap, for whichever look is due first
(its hedge, or a hang deadline of its attempts), and its first look.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ..config import MIN_SAMPLES, HedgeConfig

Deadline = list[object]  # [at, seq, callback or None once cancelled or fired]

_REFRESH_FRACTION = 8  # re-sort a window after 1/8 of it is new samples


class Deadlines:
    """Callbacks due at times of ``clock`` (a hedger's: a test's virtual one too), run by
    one timer of ``loop`` (a hedger keeps one per loop it serves: ``Hedger.deadlines``).  The
    loop timer waits ``at - clock()`` of loop time, as a race's own timer did, and a callback
    whose time has not come on ``clock`` when it fires waits on."""

    def __init__(self, clock: Callable[[], float], loop: asyncio.AbstractEventLoop) -> None:
        self._clock = clock
        self.loop = loop
        self._heap: list[Deadline] = []
        self._seq = itertools.count()
        self._live = 0  # deadlines neither cancelled nor fired
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # clock time the loop timer is set for
        self._soon: list[Callable[[], None]] = []

    @property
    def pending(self) -> int:
        """Deadlines neither cancelled nor fired yet."""
        return self._live

    @property
    def armed(self) -> bool:
        """Whether a loop timer is set: while a deadline is pending, and until it has fired
        once after the last one went."""
        return self._timer is not None

    def call_at(self, at: float, callback: Callable[[], None]) -> Deadline:
        """Run ``callback`` once ``clock()`` reaches ``at`` (in a turn of the loop of its own,
        after the callbacks already due then); cancel it with :meth:`cancel`."""
        deadline: Deadline = [at, next(self._seq), callback]
        heapq.heappush(self._heap, deadline)
        self._live += 1
        if at < self._timer_at:
            self._set_timer(at)
        return deadline

    def cancel(self, deadline: Deadline) -> None:
        """Forget ``deadline`` (one that fired already, or was cancelled, too)."""
        if deadline[2] is None:
            return
        deadline[2] = None
        self._live -= 1
        if self._live == 0:
            self._clear()

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the next turn of the loop, with every other one asked for in
        this turn, by one loop callback."""
        if not self._soon:
            self.loop.call_soon(self._run_soon)
        self._soon.append(callback)

    def _run_soon(self) -> None:
        callbacks, self._soon = self._soon, []
        for callback in callbacks:
            _call(callback)

    def _set_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_later(max(0.0, at - self._clock()), self._fired)

    def _clear(self) -> None:
        """No deadline left: drop the heap (the loop timer fires once more, finding none)."""
        self._heap.clear()

    def _fired(self) -> None:
        """The loop timer fired: take every deadline due on the clock, run them on the next
        turn (after the callbacks already due now: an answer that came in this turn is
        then in, rather than hedged or found hung with it waiting), re-arm for the next."""
        self._timer, self._timer_at = None, math.inf
        heap, now = self._heap, self._clock()
        due: list[Callable[[], None]] = []
        while heap and (heap[0][2] is None or heap[0][0] <= now):  # type: ignore[operator]
            deadline = heapq.heappop(heap)
            callback = deadline[2]
            if callback is not None:
                deadline[2] = None
                self._live -= 1
                due.append(callback)  # type: ignore[arg-type]
        if heap:  # its head is pending (cancelled ones were popped above)
            self._set_timer(heap[0][0])  # type: ignore[arg-type]
        if due:
            self.loop.call_soon(_run_all, due)


class Looking(Protocol):
    """A race (blobsdk/tail/race.py), as its :class:`Timer` calls it."""

    def schedule(self) -> None:
        """Set the timer for the next look the race needs."""

    def look(self) -> None:
        """Look now: fail over hung attempts, send a hedge that is due, set the next look."""


class Timer:
    """One race's deadline in its hedger's :class:`Deadlines`: set for the earliest look the
    race needs, kept when it is set for earlier already (the race then looks again when it
    fires, and sets it anew), and the race's first look, on the next turn of the loop with
    every other race's: its attempt has then made its first move (queued in this client,
    where it needs no deadline, or sent).  ``owner.schedule`` runs at that first look,
    ``owner.look`` when the deadline comes; :meth:`close` lets go of ``owner``."""

    __slots__ = ("_deadline", "_deadlines", "_owner", "asked")

    def __init__(self, deadlines: Deadlines, owner: Looking) -> None:
        self._deadlines = deadlines
        self._owner: Looking | None = owner
        self._deadline: Deadline | None = None
        self.asked = False  # a first look is on its way

    def first_look(self) -> None:
        """Ask for a first look, unless one is on its way."""
        if not self.asked:
            self.asked = True
            self._deadlines.call_soon(self._first)

    def set(self, at: float) -> None:
        """Look at ``at`` (the hedger's clock), unless set for earlier already."""
        deadline = self._deadline
        if deadline is not None:
            if deadline[0] <= at:  # type: ignore[operator]
                return
            self._deadlines.cancel(deadline)
        self._deadline = self._deadlines.call_at(at, self._fired)

    def close(self) -> None:
        """Cancel the deadline and let go of the owner (a race is freed by its last
        reference, not left to the cyclic garbage collector)."""
        if self._deadline is not None:
            self._deadlines.cancel(self._deadline)
            self._deadline = None
        self._owner = None

    def _first(self) -> None:
        self.asked = False
        if self._owner is not None:
            self._owner.schedule()

    def _fired(self) -> None:
        """The deadline came.  The shared timer runs this once the callbacks already due
        when it fired have run: an attempt whose answer came in the same turn of the loop (a
        loaded machine runs late) has then returned, rather than be hedged or found hung
        with its answer waiting."""
        self._deadline = None
        if self._owner is not None:
            self._owner.look()


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        _call(callback)


def _call(callback: Callable[[], None]) -> None:
    """One callback; its error goes to the loop's handler, and the others still run."""
    try:
        callback()
    except Exception as exc:  # noqa: BLE001 - one race's bug must not stall the others
        asyncio.get_running_loop().call_exception_handler({"message": "hedger deadline callback failed", "exception": exc})


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
