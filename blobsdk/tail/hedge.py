"""Hedged requests over a ranked list of candidates (DESIGN §2).

A :class:`Hedger` serves one tier (its L4 replicas, its L3 nodes, later its peers) and is
shared by every read of that tier, so its latency estimates and its budget are tier-wide::

    run([c0, c1, c2], attempt)
      t = 0          start attempt(c0)                                   "primary"
      t = delay(c0)  c0 still running and the budget has a token: start c1   "hedge"
      c0 raises      a failover error: start the next candidate at once     "failover"
      c1 returns     c1 wins; c0 is cancelled and awaited before run returns

- An attempt *wins* by returning; verification belongs inside it (a bad copy raises
  ``BadCopy``, which fails over like any other failover error).
- Failover errors are BlobErrors that are not ValueErrors (BadRequest, InvalidPath: the
  request itself is wrong, so every candidate would refuse it).  Any other exception is
  raised at once after the attempts still running were cancelled.
- At most ``max_parallel`` attempts run at once; failovers need no budget, hedges do.
- Losers are cancelled *and awaited* (an aiohttp response is released when its ``async
  with`` exits), so no task outlives ``run``; cancelling the caller cancels every attempt.
  A cancelled attempt blocked in a thread (a local file read) cannot be stopped: give each
  attempt its own buffer, never one the caller keeps.

Hedge delay: a per-target quantile (``quantile``, about p95) of the latencies of attempts
that returned, and of losers cancelled after they had run that long (a lower bound, so the
estimate does not learn only the fast winners); failed attempts are not samples, clamped to
``[min_delay_ms, max_delay_ms]``.  See :class:`LatencyTracker`.  An attempt is hedged by the
shorter of its own target's delay and the next candidate's: a target slow on every read (a
slow link) has a p95 as slow as its reads, and by its own delay alone none would be hedged.

Never hedge into a queue: each attempt is handed a :class:`~blobsdk.chunks.call.Call` of its
own; one that waits in a client-side queue (its endpoint's concurrency permit) calls
``call.queued()`` and then ``call.in_service()``; until then it is not hedged, and its latency and delay count from
entering service, so reads waiting their
turn in a burst are not taken for a slow server.  And ``run(..., ready=)`` says whether a
candidate has room now (a free limiter slot): a hedge that is due waits, polling every
``min_delay_ms``, until its target has room, so a burst that saturates every replica
spends no budget on its own stragglers; it is then there for the read that is truly stuck.
(Measured on the hedging benchmark: without these, a 100-read batch's queued reads crossed
the p95 delay, used up the budget, and the stuck read waited out its 200 ms.)

Cost: a request that cannot hedge (disabled, ``max_parallel`` 1, or one candidate of a
patient tier) runs its attempts in turn in the caller's task, with no task, timer or wait to
pay for.  A single candidate of any other tier still races alone, for its hang deadline: a
stopped peer that was a chunk's only source cost a read its 10 s socket timeout before.  A
race (blobsdk/tail/race.py) runs its primary in the caller's task too, with one deadline in
the hedger's shared timer of its event loop (``Hedger.deadlines``, blobsdk/tail/deadlines.py);
only hedges and failovers get tasks.

Budget: a token bucket (:class:`HedgeBudget`) earning ``budget_ratio`` tokens per primary
request, holding at most ``budget_burst``; a hedge spends one.  Over any long run, hedges
<= ``budget_ratio`` * requests + ``budget_burst``, so a tier-wide slowdown (every primary
slow) adds at most ~5% load rather than doubling it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from typing import TypeVar
from weakref import WeakKeyDictionary

from ..chunks import AttemptFn, Call
from ..config import HedgeConfig
from ..errors import BlobError
from .deadlines import Deadlines, LatencyTracker
from .health import HangWatch, Reason, TargetHealth
from .race import HedgeStats, Race, exhausted

T = TypeVar("T")
R = TypeVar("R")

_MAX_ANSWERED = 1024  # targets whose ``answered`` callback a hedger keeps made (peers come and go)

__all__ = ["AttemptFn", "Call", "HedgeBudget", "HedgeConfig", "HedgeStats", "Hedger", "LatencyTracker", "is_failover"]


def is_failover(exc: BaseException) -> bool:
    """Whether an attempt's error is about that candidate only (so another may succeed)."""
    return isinstance(exc, BlobError) and not isinstance(exc, ValueError)


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


class Hedger:
    """Runs hedged requests for one tier; see the module docstring.  ``health``: the tier's
    tracker (blobsdk/tail/health.py), made with the same ``config`` and ``clock``, to share;
    by default the hedger keeps one of its own."""

    def __init__(
        self,
        config: HedgeConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        health: TargetHealth | None = None,
    ) -> None:
        self.config = config if config is not None else HedgeConfig()
        self.latency = LatencyTracker(self.config, clock)
        self.budget = HedgeBudget(self.config.budget_ratio, self.config.budget_burst)
        self.counts = HedgeStats()
        self.clock = clock
        self.health = health if health is not None else TargetHealth(self.config, clock)
        self.hangs = HangWatch(self.health, self.latency.estimate)  # and the races in flight
        self._deadlines: WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = WeakKeyDictionary()
        self._last: Deadlines | None = None  # those of the loop served last
        self._answered: dict[str, Callable[[], None]] = {}  # see answered_of
        if self.health.config != self.config:
            raise ValueError("a hedger and the health tracker it shares need the same HedgeConfig")

    async def run(
        self,
        candidates: Sequence[T],
        attempt: AttemptFn[T, R],
        *,
        key_of: Callable[[T], str] = str,
        failover: Callable[[BaseException], bool] = is_failover,
        ready: Callable[[T], bool] | None = None,
        patient: bool = False,
        call: Call | None = None,
    ) -> R:
        """The result of the first ``attempt(candidate)`` to return, trying ``candidates`` in
        rank order; HedgeExhausted if every one failed over; any other error at once.
        ``key_of`` names a candidate's latency target; ``failover`` picks the errors that
        move on to the next candidate; ``ready`` says whether a candidate has room for a
        hedge now (see the module docstring).  ``patient`` (the last tier, which has nowhere
        to fall through to): an attempt found hung is not cancelled when it is the last one
        running and no candidate is left; it is waited for (its request timeout bounds it),
        so a tier that is only slow for this client never fails the read.  ``call``: the
        read (blobsdk/chunks/call.py): its demand (None: a foreground one) and grant, which
        each attempt's own call carries down to the store and the limiter it queues at."""
        call = call if call is not None else Call()
        self.counts.primaries += 1
        self.budget.earn()
        ranked, probed = self.health.rank(candidates, key_of)
        try:
            single = len(ranked) == 1
            if not self.config.enabled or self.config.max_parallel == 1 or not ranked or (single and patient):
                return await self._in_turn(ranked, attempt, key_of, failover, call)
            return await Race(self, ranked, attempt, key_of, failover, ready, call, probed, patient).run()
        finally:
            if probed is not None:
                self.health.probe_done(probed)

    async def _in_turn(
        self,
        candidates: Sequence[T],
        attempt: AttemptFn[T, R],
        key_of: Callable[[T], str],
        failover: Callable[[BaseException], bool],
        call: Call,
    ) -> R:
        """No hedge possible: one attempt at a time, in this task (no task or timer to pay
        for), failing over in rank order."""
        failures: list[tuple[T, BaseException]] | None = None  # made by the first failure
        for candidate in candidates:
            if failures:
                self.counts.failovers += 1
            mark = call.attempt(self.clock)
            try:
                value = await attempt(candidate, mark)
            except Exception as exc:
                if not failover(exc):
                    raise
                failures = failures if failures is not None else []
                failures.append((candidate, exc))
                continue
            self.latency.record(key_of(candidate), self.clock() - mark.begun)
            self.health.answered(key_of(candidate))
            return value
        raise exhausted(failures or [], key_of)

    def answered_of(self, target: str) -> Callable[[], None]:
        """``health.answered`` of ``target``, as the callback an attempt at it calls when its
        target speaks; made once per target, not once per attempt (each object a read in
        flight keeps alive brings the cyclic collector's next pass nearer)."""
        call = self._answered.get(target)
        if call is None:
            if len(self._answered) >= _MAX_ANSWERED:
                self._answered.clear()
            call = self._answered[target] = partial(self.health.answered, target)
        return call

    def deadlines(self, loop: asyncio.AbstractEventLoop | None = None) -> Deadlines:
        """The one timer for every race's hedge and hang looks on ``loop`` (default: the
        running one); one per loop the hedger serves, each let go with its loop."""
        loop = loop if loop is not None else asyncio.get_running_loop()
        last = self._last
        if last is not None and last.loop is loop:
            return last
        found = self._deadlines.get(loop)
        if found is None:
            found = self._deadlines[loop] = Deadlines(self.clock, loop)
        self._last = found
        return found

    def stats(self) -> dict[str, int]:
        """The counters, plus ``targets_hung`` (now) and ``probes`` of hung targets."""
        return {**asdict(self.counts), "targets_hung": self.health.count(Reason.HUNG), "probes": self.health.probes}
