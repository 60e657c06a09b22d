"""One hedged request in flight: the race of its attempts (see blobsdk/tail/hedge.py for the rules).

Hand-written for the hot path: every chunk read of a hedged tier is one race, and most races
are one attempt that answers before its hedge delay.  So:

- The primary attempt runs in the caller's own task, not a task of its own.  It costs no
  task, and it reaches its endpoint's limiter before the next read of a batch is ranked, so
  the tier's least-loaded order sees the reads a batch has already sent (with a task per
  primary, every read of a batch was ranked before any had started: each saw every replica
  idle).  Hedges and failovers run in tasks of their own.  When one of them decides the race
  (or the primary is found hung), the primary is stopped by cancelling the caller's task and
  taking that cancellation back (``Race._stop``, ``Race._take_back``: the only two places
  that touch the caller's task), as ``asyncio.timeout`` does; a cancellation from outside
  is never taken for ours.
- One deadline per race (:class:`~blobsdk.tail.deadlines.Timer`), for whichever is due
  first: the hedge, or a look at the hang deadlines (:class:`~blobsdk.tail.health.HangWatch`),
  set once the attempt has made its first move (an attempt waiting in its client-side queue
  needs none).  Nothing polls: an attempt that leaves its client-side queue says so
  (``Call.attempt(on_service=)``), and a race that finds a target hung tells the hedger's other
  races, whose attempts queued there fail over.
- The caller's task sleeps on one future that an attempt's end or the timer wakes; the
  decisions (hedge, fail over, settle) are made in those callbacks.

A race names what it uses of the hedger that runs it as a protocol (:class:`RaceHost`), and
keeps the counters it writes (:class:`HedgeStats`) and the error once every attempt failed
(:func:`exhausted`) here, so it imports nothing of blobsdk/tail/hedge.py, which starts races.

What a read keeps alive while in flight is what sets off the cyclic garbage collector, so a
race makes its sets and lists only when it needs them, takes its target's ``answered``
callback from the hedger (one per target), and is freed by its last reference
(tests/tiers/test_l4_footprint.py counts what a read keeps).  The figures are in
docs/benchmarks.md ("hedging").
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, Protocol, TypeVar

from ..chunks import AttemptFn, Call
from ..config import HedgeConfig
from ..errors import HedgeExhausted, Unavailable
from .deadlines import Deadlines, LatencyTracker, Timer
from .health import HangWatch, TargetHealth

T = TypeVar("T")
R = TypeVar("R")

Kind = Literal["primary", "hedge", "failover"]
_NONE: frozenset[Any] = frozenset()  # an empty set of a race's, until it needs one


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


class Budget(Protocol):
    """A hedger's hedge budget as a race spends it (:class:`~blobsdk.tail.hedge.HedgeBudget`)."""

    def try_spend(self) -> bool: ...


class RaceHost(Protocol):
    """What a race reads and updates of the hedger that runs it (:class:`~blobsdk.tail.hedge.Hedger`)."""

    config: HedgeConfig
    clock: Callable[[], float]
    latency: LatencyTracker
    counts: HedgeStats
    health: TargetHealth
    hangs: HangWatch  # the hang rule on its attempts, and the races in flight, poked when one finds a target hung

    @property
    def budget(self) -> Budget: ...

    def answered_of(self, target: str) -> Callable[[], None]: ...

    def deadlines(self, loop: asyncio.AbstractEventLoop | None = None) -> Deadlines: ...


def exhausted(failures: list[tuple[T, BaseException]], key_of: Callable[[T], str]) -> HedgeExhausted:
    """The error once every candidate failed: each failure described, the last as cause."""
    if not failures:
        return HedgeExhausted("no candidates to try", [])
    described = "; ".join(f"{key_of(c)}: {type(e).__name__}: {e}" for c, e in failures)
    exc = HedgeExhausted(f"all {len(failures)} candidates failed: {described}", failures)
    exc.__cause__ = failures[-1][1]
    return exc


@dataclass
class _Outcome(Generic[R]):
    """What one attempt did: returned ``value`` or raised ``error``."""

    value: R | None = None
    error: BaseException | None = None


class _Entry(Generic[T, R]):
    """One attempt: its candidate, the candidate's target, its kind and task (None: the
    primary, in the caller's task), and how the hang watch left it: ``hung`` (failed over as
    hung, stopped) or ``waited`` (hung, but the last hope: waited for)."""

    __slots__ = ("candidate", "hung", "key", "kind", "task", "waited")

    def __init__(self, candidate: T, key: str, kind: Kind) -> None:
        self.candidate = candidate
        self.key = key
        self.kind = kind
        self.task: asyncio.Task[_Outcome[R]] | None = None
        self.hung = False
        self.waited = False


class Race(Generic[T, R]):
    """One hedged request: its attempts in flight, the candidates left, the failures."""

    __slots__ = (
        "__weakref__",
        "_armed",
        "_armed_delay",
        "_attempt",
        "_call",
        "_candidates",
        "_clock",
        "_deferred",
        "_failover",
        "_failures",
        "_hedger",
        "_hedging",
        "_interrupted",
        "_key_of",
        "_loop",
        "_next",
        "_not_before",
        "_over",
        "_patient",
        "_probe",
        "_ready",
        "_result",
        "_running",
        "_task",
        "_tasks",
        "_timer",
        "_wake",
    )

    def __init__(
        self,
        hedger: RaceHost,
        candidates: Sequence[T],
        attempt: AttemptFn[T, R],
        key_of: Callable[[T], str],
        failover: Callable[[BaseException], bool],
        ready: Callable[[T], bool] | None,
        call: Call,
        probe: str | None = None,
        patient: bool = False,
    ) -> None:
        self._hedger = hedger
        self._clock = hedger.clock
        self._candidates = candidates
        self._attempt = attempt
        self._key_of = key_of
        self._failover = failover
        self._ready = ready
        self._call = call  # the read's: each attempt's own call is made from it
        self._probe = probe  # the hung target this read probes, if any
        self._patient = patient
        self._next = 0  # index of the next candidate to start
        self._running: dict[Call, _Entry[T, R]] = {}
        self._failures: list[tuple[T, BaseException]] | None = None  # made by the first
        self._tasks: AbstractSet[asyncio.Task[_Outcome[R]]] = _NONE  # every task started, until it ended
        self._hedging = hedger.config.enabled
        self._deferred = False
        self._armed: Call | None = None  # the watched attempt
        self._armed_delay = 0.0  # and its hedge delay
        self._not_before = -math.inf  # a deferred hedge looks again no earlier than this
        self._loop = asyncio.get_running_loop()
        self._timer = Timer(hedger.deadlines(self._loop), self)
        task = asyncio.current_task()
        assert task is not None, "a hedged request runs in a task"
        self._task = task  # the caller's, which runs the primary attempt
        self._interrupted = False  # the caller's task was cancelled by us, to stop the primary
        self._wake: asyncio.Future[None] | None = None  # what the caller sleeps on
        self._over = False
        self._result: _Outcome[R] | None = None  # None once over: every candidate failed

    async def run(self) -> R:
        races = self._hedger.hangs.races
        races.add(self)
        try:
            await self._primary()
            while not self._over:
                self._wake = self._loop.create_future()
                await self._wake
        finally:
            races.discard(self)
            self._end()
            if self._tasks:
                await _wait_out(self._started())
            # An attempt's on_service refers to this race: let go of the attempts, so the
            # race is freed by its last reference, not left to the cyclic garbage collector.
            self._armed = None
            self._running.clear()
        result = self._result
        if result is None:
            raise exhausted(self._failures or [], self._key_of)
        if result.error is not None:
            raise result.error
        return result.value  # type: ignore[return-value]

    # --- the attempts ---------------------------------------------------------------------

    async def _primary(self) -> None:
        """The first candidate's attempt, in the caller's task."""
        entry, mark = self._new_entry("primary")
        before = self._task.cancelling()  # cancellations asked before the primary: not ours
        try:
            value = await self._attempt(entry.candidate, mark)
        except asyncio.CancelledError:
            if not self._take_back(before):
                raise  # from outside: run's finally stops the rest
            # Stopped by us: another attempt decided the race, or this one was found hung.
            self._censored(entry, mark)
            return
        except Exception as exc:  # noqa: BLE001 - settled like any attempt's error
            self._take_back(before)
            self._settle(mark, _Outcome(error=exc))
            return
        self._take_back(before)
        if mark in self._running:
            self._record(entry.key, mark)
        self._settle(mark, _Outcome(value=value))

    def _start(self, kind: Kind) -> None:
        """The next candidate's attempt, in a task of its own."""
        entry, mark = self._new_entry(kind)
        task = self._loop.create_task(self._timed(entry, mark), name=f"hedge:{kind}:{entry.key}")
        entry.task = task
        self._started().add(task)
        task.add_done_callback(partial(self._ended, mark))

    def _new_entry(self, kind: Kind) -> tuple[_Entry[T, R], Call]:
        candidate = self._candidates[self._next]
        self._next += 1
        entry: _Entry[T, R] = _Entry(candidate, self._key_of(candidate), kind)
        mark = self._call.attempt(self._clock, self._hedger.answered_of(entry.key), self.schedule)
        self._running[mark] = entry
        self._arm(entry.key, mark)
        return entry, mark

    def _started(self) -> set[asyncio.Task[_Outcome[R]]]:
        """The set of tasks started, made on first use."""
        tasks = self._tasks
        if not isinstance(tasks, set):
            tasks = self._tasks = set()
        return tasks

    async def _timed(self, entry: _Entry[T, R], mark: Call) -> _Outcome[R]:
        """Run one attempt in its own task; a returned value's latency since it entered
        service becomes a sample of its target."""
        try:
            value = await self._attempt(entry.candidate, mark)
        except asyncio.CancelledError:
            self._censored(entry, mark)
            raise
        except Exception as exc:  # noqa: BLE001 - the race decides; CancelledError is no Exception
            return _Outcome(error=exc)
        self._record(entry.key, mark)
        return _Outcome(value=value)

    def _record(self, key: str, mark: Call) -> None:
        self._hedger.latency.record(key, self._clock() - mark.begun)
        self._hedger.health.answered(key)

    def _censored(self, entry: _Entry[T, R], mark: Call) -> None:
        """A loser stopped in service at least this long: keeping that (censored) sample stops
        the estimate from learning only the fast winners and hedging ever earlier.  (Not a
        hung one: its wait says nothing about the target's latency.)"""
        if mark.serving and not entry.hung:
            self._hedger.latency.record(entry.key, self._clock() - mark.begun)

    def _ended(self, mark: Call, task: asyncio.Task[_Outcome[R]]) -> None:
        """A task's done callback."""
        self._started().discard(task)
        if task.cancelled():
            return  # stopped by us (a loser, or hung): already settled
        error = task.exception()
        self._settle(mark, task.result() if error is None else _Outcome(error=error))

    def _stop(self, entry: _Entry[T, R]) -> None:
        if entry.task is not None:
            entry.task.cancel()
        elif not self._interrupted:  # the primary: stopped by cancelling the caller's task, once
            self._interrupted = True
            self._task.cancel()

    def _take_back(self, before: int) -> bool:
        """Undo our cancellation of the caller's task, if we made one; whether the task is
        left with no other cancellation than the ``before`` it had when the primary started
        (else one came from outside too, and it stands)."""
        if not self._interrupted:
            return False
        self._interrupted = False
        return self._task.uncancel() <= before

    def _end(self) -> None:
        """Cancel the timer, and every task (a race left by an error or a cancellation)."""
        self._timer.close()
        for task in self._tasks:
            task.cancel()

    # --- deciding -------------------------------------------------------------------------

    def _settle(self, mark: Call, outcome: _Outcome[R]) -> None:
        """An attempt ended: a value or an error that is no failover decides the race; a
        failover error starts the next candidate."""
        entry = self._running.pop(mark, None)
        if entry is None or self._over:
            return  # failed over as hung already, or a loser that ended as it was stopped
        if outcome.error is None:
            self._hedger.counts.hedges_won += entry.kind == "hedge"
            self._decide(outcome)
        elif not self._failover(outcome.error):
            self._decide(outcome)
        else:
            self._fail_over(entry.candidate, outcome.error)
            self._after_change()

    def _fail_over(self, candidate: T, error: BaseException) -> None:
        if self._failures is None:
            self._failures = []
        self._failures.append((candidate, error))
        if self._next < len(self._candidates):
            self._hedger.counts.failovers += 1
            self._start("failover")

    def _after_change(self) -> None:
        """Once attempts ended or started: over if none is left, else re-time the next look."""
        if not self._running:
            self._decide(None)
        else:
            self.schedule()

    def _decide(self, outcome: _Outcome[R] | None) -> None:
        """The race is over (None: every candidate failed): stop what still runs, wake the caller."""
        self._over, self._result = True, outcome
        for entry in self._running.values():
            self._stop(entry)
        self._running.clear()
        self._end()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # --- looks: hedges and hang deadlines (the timer's owner) ------------------------------

    def schedule(self) -> None:
        """Set the timer for the next look (the hedge or a hang deadline)."""
        if self._over or self._timer.asked:
            return  # over, or the first look is on its way
        at = self._next_look()
        if at is not None:
            self._timer.set(at)

    def poke(self) -> None:
        """Another race found a target hung: look whether an attempt of this one is there."""
        if not self._over:
            self._loop.call_soon(self.look)

    def look(self) -> None:
        """Fail over hung attempts, send a due hedge, set the next timer."""
        if self._over:
            return
        try:
            self._fail_over_hung()
            if not self._over:
                due = self._due()
                if due is not None and self._clock() >= due:
                    self._hedge()
                self._after_change()
        except Exception as exc:  # noqa: BLE001 - a callback's error must reach the caller, not the loop's log
            self._decide(_Outcome(error=exc))

    def _next_look(self) -> float | None:
        due = self._due()
        if due == math.inf:  # the watched attempt waits in this client or on its server's upstream
            due = None
        elif due is not None and due <= self._hedger.hangs.bound(self._running):
            return due  # the usual case, without working out any hang deadline
        hang = self._hedger.hangs.next_check(self._running.items())
        if hang is not None:
            due = hang if due is None else min(due, hang)
        return due

    def _due(self) -> float | None:
        """Clock time of the next hedge (inf while the watched attempt is queued in this
        client or its server waits on its upstream); None: no hedge due."""
        mark = self._armed
        if mark is None:
            return None
        return max(mark.begun + self._armed_delay, self._not_before) if mark.serving and not mark.upstream else math.inf

    def _arm(self, key: str, mark: Call) -> None:
        """Watch the attempt just started for a hedge, if another may follow it."""
        config = self._hedger.config
        can_hedge = self._hedging and self._next < len(self._candidates) and len(self._running) < config.max_parallel
        self._armed = mark if can_hedge else None
        if can_hedge:
            self._armed_delay = self._hedger.latency.hedge_delay(key, self._key_of(self._candidates[self._next]))
        self._not_before = -math.inf
        self._timer.first_look()  # once the attempt made its first move: queued (no timer yet) or not

    def _hedge(self) -> None:
        """The hedge delay passed: start the next candidate if it has room and the budget
        allows; without room, look again in ``min_delay_ms`` (never hedge into a queue)."""
        counts, config = self._hedger.counts, self._hedger.config
        if self._ready is not None and not self._ready(self._candidates[self._next]):
            counts.hedges_deferred += not self._deferred
            self._deferred = True
            self._not_before = self._clock() + max(config.min_delay_ms, 1.0) / 1000
            return
        if self._hedger.budget.try_spend():
            counts.hedges_sent += 1
            self._start("hedge")
            return
        counts.budget_exhausted += 1
        self._hedging = False
        self._armed = None

    def _fail_over_hung(self) -> None:
        """Stop every attempt that outlived its hang deadline, or whose target is hung, and
        fail over from it at once, spending no hedge budget (a hung target is a failure).  A
        patient tier (the last: nowhere to fall through to) waits for its last attempt rather
        than move on only to targets already found hung: on a loaded machine a healthy
        replica may outlive its hang deadline, and failing over from it to a stalled one would
        wait out a socket timeout instead (seen: 30 s, in a fresh-clone run beside another
        suite)."""
        hangs, now = self._hedger.hangs, self._clock()
        for mark, entry in list(self._running.items()):
            if entry.waited or (entry.task is not None and entry.task.done()):
                continue  # waited for, or ended (its outcome is on its way)
            found = hangs.found_hung(entry.key, mark, now, self)
            if not found and (entry.key == self._probe or not hangs.is_hung(entry.key)):
                continue  # a probe of a hung target fails only by its own deadline
            if self._patient and len(self._running) == 1 and not self._untried_healthy():
                entry.waited = True  # nowhere better to go: wait for it
                continue
            del self._running[mark]
            entry.hung = True
            self._stop(entry)
            self._hedger.counts.hung_failovers += 1
            self._fail_over(entry.candidate, Unavailable(f"{entry.key}: no answer within its hang deadline (hung)"))

    def _untried_healthy(self) -> bool:
        """Whether a candidate not yet tried is a target not known to be hung."""
        return self._hedger.hangs.any_healthy(map(self._key_of, self._candidates[self._next :]))


async def _wait_out(tasks: set[asyncio.Task[_Outcome[R]]]) -> None:
    """Wait until every task (cancelled already) has ended, even if the caller is cancelled
    meanwhile (then that cancellation is raised once they have): no task outlives a race."""
    cancelled: asyncio.CancelledError | None = None
    while tasks:
        try:
            await asyncio.wait(list(tasks))
        except asyncio.CancelledError as exc:
            cancelled = exc
        tasks.difference_update([t for t in tasks if t.done()])
    if cancelled is not None:
        raise cancelled
