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
``[min_delay_ms, max_delay_ms]``.  See :class:`LatencyTracker`.

Never hedge into a queue: each attempt is handed an :class:`Attempt`; one that waits in a
client-side queue (its endpoint's concurrency permit) calls ``attempt.queued()`` and then
``attempt.in_service()``; until then it is not hedged, and its latency and delay count from
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
stopped peer that was a chunk's only source cost a read its 10 s socket timeout before.

Budget: a token bucket (:class:`HedgeBudget`) earning ``budget_ratio`` tokens per primary
request, holding at most ``budget_burst``; a hedge spends one.  Over any long run, hedges
<= ``budget_ratio`` * requests + ``budget_burst``, so a tier-wide slowdown (every primary
slow) adds at most ~5% load rather than doubling it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Generic, Literal, TypeVar

from ..config import MIN_SAMPLES, HedgeConfig
from ..errors import BlobError, HedgeExhausted, Unavailable
from ..runtime.tasks import task_group
from .attempt import Attempt
from .demand import Demand
from .health import Reason, TargetHealth

T = TypeVar("T")
R = TypeVar("R")

_REFRESH_FRACTION = 8  # re-sort a window after 1/8 of it is new samples

Kind = Literal["primary", "hedge", "failover"]


AttemptFn = Callable[[T, Attempt], Awaitable[R]]  # one attempt at one candidate


def is_failover(exc: BaseException) -> bool:
    """Whether an attempt's error is about that candidate only (so another may succeed)."""
    return isinstance(exc, BlobError) and not isinstance(exc, ValueError)


class _Window:
    """The last ``size`` samples of one target and a cached quantile of them."""

    __slots__ = ("fresh", "samples", "value")

    def __init__(self, size: int) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self.fresh = 0  # samples added since ``value`` was computed
        self.value: float | None = None

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.fresh += 1

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the window, re-sorted only once enough of it is new."""
        n = len(self.samples)
        if n < MIN_SAMPLES:
            return None
        if self.value is None or self.fresh * _REFRESH_FRACTION >= n:
            self.value = sorted(self.samples)[min(n - 1, int(q * n))]
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
    none anywhere the delay is ``max_delay_ms``.
    """

    def __init__(self, config: HedgeConfig) -> None:
        self._config = config
        self._targets: dict[str, _Window] = {}
        self._all = _Window(config.window)

    def record(self, target: str, seconds: float) -> None:
        window = self._targets.get(target)
        if window is None:
            window = self._targets[target] = _Window(self._config.window)
        window.add(seconds)
        self._all.add(seconds)

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
        self.latency = LatencyTracker(self.config)
        self.budget = HedgeBudget(self.config.budget_ratio, self.config.budget_burst)
        self.counts = HedgeStats()
        self.clock = clock
        self.health = health if health is not None else TargetHealth(self.config, clock)
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
        demand: Demand | None = None,
    ) -> R:
        """The result of the first ``attempt(candidate)`` to return, trying ``candidates`` in
        rank order; HedgeExhausted if every one failed over; any other error at once.
        ``key_of`` names a candidate's latency target; ``failover`` picks the errors that
        move on to the next candidate; ``ready`` says whether a candidate has room for a
        hedge now (see the module docstring).  ``patient`` (the last tier, which has nowhere
        to fall through to): an attempt found hung is not cancelled when it is the last one
        running and no candidate is left; it is waited for (its request timeout bounds it),
        so a tier that is only slow for this client never fails the read.  ``demand``: the
        fetch this read serves (None: a foreground one); every attempt carries it to the
        limiter it queues at (blobsdk/tail/demand.py)."""
        demand = demand if demand is not None else Demand()
        self.counts.primaries += 1
        self.budget.earn()
        ranked, probed = self.health.rank(candidates, key_of)
        try:
            single = len(ranked) == 1
            if not self.config.enabled or self.config.max_parallel == 1 or not ranked or (single and patient):
                return await self._in_turn(ranked, attempt, key_of, failover, demand)
            return await _Race(self, ranked, attempt, key_of, failover, ready, demand, probed, patient).run()
        finally:
            if probed is not None:
                self.health.probe_done(probed)

    async def _in_turn(
        self,
        candidates: Sequence[T],
        attempt: AttemptFn[T, R],
        key_of: Callable[[T], str],
        failover: Callable[[BaseException], bool],
        demand: Demand,
    ) -> R:
        """No hedge possible: one attempt at a time, in this task (no task or timer to pay
        for), failing over in rank order."""
        failures: list[tuple[T, BaseException]] = []
        for candidate in candidates:
            if failures:
                self.counts.failovers += 1
            mark = Attempt(self.clock, demand=demand)
            try:
                value = await attempt(candidate, mark)
            except Exception as exc:
                if not failover(exc):
                    raise
                failures.append((candidate, exc))
                continue
            self.latency.record(key_of(candidate), self.clock() - mark.begun)
            self.health.answered(key_of(candidate))
            return value
        raise exhausted(failures, key_of)

    def stats(self) -> dict[str, int]:
        """The counters, plus ``targets_hung`` (now) and ``probes`` of hung targets."""
        return {**asdict(self.counts), "targets_hung": self.health.count(Reason.HUNG), "probes": self.health.probes}


@dataclass
class _Outcome(Generic[R]):
    """What one attempt did: returned ``value`` or raised ``error``."""

    value: R | None = None
    error: Exception | None = None


class _Race(Generic[T, R]):
    """One hedged request: its attempts in flight, the candidates left, the failures."""

    def __init__(
        self,
        hedger: Hedger,
        candidates: Sequence[T],
        attempt: AttemptFn[T, R],
        key_of: Callable[[T], str],
        failover: Callable[[BaseException], bool],
        ready: Callable[[T], bool] | None,
        demand: Demand,
        probe: str | None = None,
        patient: bool = False,
    ) -> None:
        self._hedger = hedger
        self._demand = demand
        self._patient = patient
        self._waited_for: set[Attempt] = set()  # hung, but the last hope: not failed over
        self._ready = ready
        self._probe = probe  # the hung target this read probes, if any
        self._deferred = False
        self._candidates = candidates
        self._attempt = attempt
        self._key_of = key_of
        self._failover = failover
        self._next = 0  # index of the next candidate to start
        self._running: dict[asyncio.Task[_Outcome[R]], tuple[T, Kind, Attempt]] = {}
        self._hung: set[Attempt] = set()  # attempts failed over as hung (cancelled)
        self._failures: list[tuple[T, BaseException]] = []
        self._hedging = hedger.config.enabled
        self._armed: tuple[Attempt, float] | None = None  # the watched attempt, and its delay
        self._not_before = -math.inf  # a deferred hedge looks again no earlier than this
        self._tasks: asyncio.TaskGroup | None = None

    async def run(self) -> R:
        async with task_group() as tasks:  # on any exit, cancels and awaits what still runs
            self._tasks = tasks
            if self._candidates:
                self._start("primary")
            decided = await self._race()
            self._cancel_running()
        if decided is None:
            raise exhausted(self._failures, self._key_of)
        if decided.error is not None:
            raise decided.error  # not a failover error: raised outside the group, unwrapped
        return decided.value  # type: ignore[return-value]

    async def _race(self) -> _Outcome[R] | None:
        """The first returned outcome or non-failover error; None if all failed over."""
        while self._running:
            done = await self._wait()
            if done:
                decided = self._settle(done)
                if decided is not None:
                    return decided
                continue
            self._fail_over_hung()
            due = self._due()  # the attempt may have entered service since the timer was set
            if due is not None and self._hedger.clock() >= due:
                self._hedge()
        return None

    def _hang_check_at(self) -> float | None:
        """When an attempt may next be found hung: its hang deadline if in service, else
        soon (its target may be found hung by another read meanwhile); None if nothing runs."""
        health, now = self._hedger.health, self._hedger.clock()
        poll = self._hedger.config.hang_min_ms / 2000  # queued: look again in half the shortest deadline
        times = []
        for candidate, _, mark in self._running.values():
            if mark in self._waited_for:
                continue
            if not mark.serving:
                times.append(now + poll)
                continue
            key = self._key_of(candidate)
            deadline = health.deadline(self._hedger.latency.estimate(key))
            # Past its deadline at a target that still answers others: when it falls silent.
            times.append(max(mark.heard + deadline, health.silent_since(key, deadline)))
        return min(times, default=None)

    def _fail_over_hung(self) -> None:
        """Cancel every attempt that outlived its hang deadline, or whose target is hung, and
        fail over from it at once, spending no hedge budget (a hung target is a failure)."""
        health, now = self._hedger.health, self._hedger.clock()
        for task, (candidate, _, mark) in list(self._running.items()):
            if mark in self._waited_for:
                continue
            key = self._key_of(candidate)
            deadline = health.deadline(self._hedger.latency.estimate(key))
            if mark.serving and now - mark.heard >= deadline and health.silent_for(key, deadline):
                health.mark(key, Reason.HUNG)
            elif key == self._probe or not health.has(key, Reason.HUNG):
                continue  # a probe of a hung target fails only by its own deadline
            if self._patient and len(self._running) == 1 and not self._healthy_left():
                self._waited_for.add(mark)  # nowhere better to go: wait for it
                continue
            del self._running[task]
            self._hung.add(mark)
            task.cancel()
            self._hedger.counts.hung_failovers += 1
            self._fail_over(candidate, Unavailable(f"{key}: no answer within its hang deadline (hung)"))

    def _healthy_left(self) -> bool:
        """Whether a candidate not yet tried is a target not known to be hung.  A patient tier
        (the last: nowhere to fall through to) waits for its last attempt rather than move on
        only to targets already found hung: on a loaded machine a healthy replica may outlive
        its hang deadline, and failing over from it to a stalled one would wait out a socket
        timeout instead (seen: 30 s, in a fresh-clone run beside another suite)."""
        health = self._hedger.health
        return any(not health.has(self._key_of(c), Reason.HUNG) for c in self._candidates[self._next :])

    def _due(self) -> float | None:
        """Clock time of the next hedge (inf while the watched attempt is queued in this
        client or its server waits on its upstream); None: no hedge due."""
        if self._armed is None:
            return None
        mark, delay = self._armed
        return max(mark.begun + delay, self._not_before) if mark.serving and not mark.upstream else math.inf

    async def _wait(self) -> set[asyncio.Task[_Outcome[R]]]:
        """The attempts that finished, or none once the hedge may be due (a queued attempt
        is looked at again every hedge delay)."""
        due = self._due()
        if due == math.inf:
            assert self._armed is not None
            due = self._hedger.clock() + self._armed[1]
        hang = self._hang_check_at()
        if hang is not None:
            due = hang if due is None else min(due, hang)
        timeout = None if due is None else max(0.0, due - self._hedger.clock())
        done, _ = await asyncio.wait(self._running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return done

    def _start(self, kind: Kind) -> None:
        candidate = self._candidates[self._next]
        self._next += 1
        assert self._tasks is not None
        mark = Attempt(self._hedger.clock, partial(self._hedger.health.answered, self._key_of(candidate)), self._demand)
        task = self._tasks.create_task(self._timed(candidate, mark), name=f"hedge:{kind}:{self._key_of(candidate)}")
        self._running[task] = (candidate, kind, mark)
        self._arm(candidate, mark)

    def _arm(self, candidate: T, mark: Attempt) -> None:
        """Watch the attempt just started for a hedge, if another may follow it."""
        can_hedge = self._hedging and self._next < len(self._candidates) and len(self._running) < self._hedger.config.max_parallel
        self._armed = (mark, self._hedger.latency.delay(self._key_of(candidate))) if can_hedge else None
        self._not_before = -math.inf

    async def _timed(self, candidate: T, mark: Attempt) -> _Outcome[R]:
        """Run one attempt in its own task; a returned value's latency since it entered
        service becomes a sample of its target."""
        try:
            value = await self._attempt(candidate, mark)
        except asyncio.CancelledError:
            # A loser in service at least this long: keeping that (censored) sample stops
            # the estimate from learning only the fast winners and hedging ever earlier.
            # (Not a hung one: its wait says nothing about the target's latency.)
            if mark.serving and mark not in self._hung:
                self._hedger.latency.record(self._key_of(candidate), self._hedger.clock() - mark.begun)
            raise
        except Exception as exc:  # noqa: BLE001 - the race decides; CancelledError is no Exception
            return _Outcome(error=exc)
        self._hedger.latency.record(self._key_of(candidate), self._hedger.clock() - mark.begun)
        self._hedger.health.answered(self._key_of(candidate))
        return _Outcome(value=value)

    def _hedge(self) -> None:
        """The hedge delay passed: start the next candidate if it has room and the budget
        allows; without room, look again in ``min_delay_ms`` (never hedge into a queue)."""
        if self._ready is not None and not self._ready(self._candidates[self._next]):
            self._hedger.counts.hedges_deferred += not self._deferred
            self._deferred = True
            self._not_before = self._hedger.clock() + max(self._hedger.config.min_delay_ms, 1.0) / 1000
            return
        if self._hedger.budget.try_spend():
            self._hedger.counts.hedges_sent += 1
            self._start("hedge")
            return
        self._hedger.counts.budget_exhausted += 1
        self._hedging = False
        self._armed = None

    def _settle(self, done: set[asyncio.Task[_Outcome[R]]]) -> _Outcome[R] | None:
        """The winner among finished attempts, or the first non-failover error; else fail
        over from each failed one (in the order they started) and return None."""
        finished = [(task.result(), *self._running.pop(task)[:2]) for task in list(self._running) if task in done]
        for outcome, _, kind in finished:
            if outcome.error is None:
                self._hedger.counts.hedges_won += kind == "hedge"
                return outcome
        for outcome, candidate, _ in finished:
            assert outcome.error is not None
            if not self._failover(outcome.error):
                return outcome
            self._fail_over(candidate, outcome.error)
        return None

    def _fail_over(self, candidate: T, error: Exception) -> None:
        self._failures.append((candidate, error))
        if self._next < len(self._candidates):
            self._hedger.counts.failovers += 1
            self._start("failover")

    def _cancel_running(self) -> None:
        for task in self._running:
            task.cancel()


def exhausted(failures: list[tuple[T, BaseException]], key_of: Callable[[T], str]) -> HedgeExhausted:
    """The error once every candidate failed: each failure described, the last as cause."""
    if not failures:
        return HedgeExhausted("no candidates to try", [])
    described = "; ".join(f"{key_of(c)}: {type(e).__name__}: {e}" for c, e in failures)
    exc = HedgeExhausted(f"all {len(failures)} candidates failed: {described}", failures)
    exc.__cause__ = failures[-1][1]
    return exc
