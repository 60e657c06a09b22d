"""One hedged request in flight: the race of its attempts (see blobsdk/tail/hedge.py for the rules).

Hand-written for the hot path: every chunk read of a hedged tier is one race, and most races
are one attempt that answers before its hedge delay.  So:

- The primary attempt runs in the caller's own task, not a task of its own.  It costs no
  task, and it reaches its endpoint's limiter before the next read of a batch is ranked, so
  the tier's least-loaded order sees the reads a batch has already sent (with a task per
  primary, all 100 reads of a batch were ranked before any had started: every one saw every
  replica idle).  Hedges and failovers run in tasks of their own.  When one of them decides
  the race (or the primary is found hung), the primary is stopped by cancelling the caller's
  task and taking that cancellation back (``Task.uncancel``), as ``asyncio.timeout`` does;
  a cancellation from outside is never taken for ours.
- One deadline per race, for whichever is due first: the hedge, or a look at the hang
  deadlines, set once the attempt has made its first move (an attempt waiting in its
  client-side queue needs none).  The deadlines of every race of a hedger share one loop
  timer (blobsdk/tail/deadlines.py), and their first looks one ``call_soon`` per turn of the
  loop: a batch of reads sets the timer once, where each read set and cancelled its own.
  Nothing polls: an attempt that leaves its client-side queue says so
  (``Attempt(on_service=)``), and a race that finds a target hung tells the hedger's other
  races (``Hedger.races``), whose attempts queued there fail over; before, every race with an
  attempt queued woke every hedge delay to look.  A deadline due earlier than needed is kept
  and re-armed when it fires.
- The caller's task sleeps on one future that an attempt's end or the timer wakes; the
  decisions (hedge, fail over, settle) are made in those callbacks.

Measured (client CPU per 16 KiB L4 read, batches of 100 over three block servers in other
processes, ``python -m benchmarks hedging``'s ``client_cpu_*`` rows, on the 2-core reference
machine under load): with a task per attempt, ``asyncio.wait`` and a timeout per wake-up
(2.8 wake-ups per read, most of them polls of reads queued in the client), a hedged read
cost ~75-105 µs more than plain failover (198-240 vs 118-148 µs); then ~25 µs more (140-153
vs 116-130 µs).  With the shared timer and the race's state in slots, a lone race whose
attempt answers on the next turn of the loop costs 18.2 µs against 6.6 µs in turn (was 20.2);
a batch of 100 reads from in-process replicas behind their limiters (the hedging benchmark's
``client_cpu_inproc_*`` rows: tier, limiter and hedger, no network), hedged, 45-52 µs a read
against 32-37 µs unhedged (was 52-61 against 35-41; the least of 9 rounds, 6 runs each).

What a read keeps alive while in flight is what sets off the cyclic garbage collector (every
700 tracked objects a batch keeps alive, and a full collection of the process once enough
lived through two), which was a third of those in-process figures.  So a race makes its sets
and lists only when it needs them, and takes its target's ``answered`` callback from the
hedger (one per target): a hedged read in flight keeps 25 tracked objects alive, an unhedged
one 20 (were 40 and 28; tests/tiers/test_l4_footprint.py counts them), and 30,000 in-process
reads set off 818 young and 7 full collections (were 1,365 and 11).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ..chunks.attempt import Attempt
from ..chunks.demand import Demand
from ..errors import BlobError, HedgeExhausted, Unavailable
from .deadlines import Deadline
from .health import Reason

if TYPE_CHECKING:
    from .hedgestate import RaceHost as Hedger  # the hedger as its races see it

T = TypeVar("T")
R = TypeVar("R")

Kind = Literal["primary", "hedge", "failover"]
_NONE: frozenset[Any] = frozenset()  # an empty set of a race's, until it needs one
AttemptFn = Callable[[T, Attempt], Awaitable[R]]  # one attempt at one candidate


def is_failover(exc: BaseException) -> bool:
    """Whether an attempt's error is about that candidate only (so another may succeed)."""
    return isinstance(exc, BlobError) and not isinstance(exc, ValueError)


@dataclass
class _Outcome(Generic[R]):
    """What one attempt did: returned ``value`` or raised ``error``."""

    value: R | None = None
    error: BaseException | None = None


class _Entry(Generic[T, R]):
    """One attempt running: its candidate, kind and task (None: the primary, in the caller's task)."""

    __slots__ = ("candidate", "kind", "task")

    def __init__(self, candidate: T, kind: Kind, task: asyncio.Task[_Outcome[R]] | None) -> None:
        self.candidate = candidate
        self.kind = kind
        self.task = task


class Race(Generic[T, R]):
    """One hedged request: its attempts in flight, the candidates left, the failures."""

    __slots__ = (
        "__weakref__",
        "_armed",
        "_armed_delay",
        "_attempt",
        "_candidates",
        "_clock",
        "_deadlines",
        "_deferred",
        "_demand",
        "_failover",
        "_failures",
        "_hedger",
        "_hedging",
        "_hung",
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
        "_soon",
        "_task",
        "_tasks",
        "_timer",
        "_timer_at",
        "_waited_for",
        "_wake",
    )

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
        self._clock = hedger.clock
        self._demand = demand
        self._patient = patient
        self._ready = ready
        self._probe = probe  # the hung target this read probes, if any
        self._candidates = candidates
        self._attempt = attempt
        self._key_of = key_of
        self._failover = failover
        self._next = 0  # index of the next candidate to start
        self._running: dict[Attempt, _Entry[T, R]] = {}
        # Made on first use (most races need none: each tracked object a read keeps alive
        # brings the cyclic collector's next pass nearer).
        self._hung: AbstractSet[Attempt] = _NONE  # attempts failed over as hung (stopped)
        self._waited_for: AbstractSet[Attempt] = _NONE  # hung, but the last hope: not failed over
        self._failures: list[tuple[T, BaseException]] | None = None
        self._hedging = hedger.config.enabled
        self._deferred = False
        self._armed: Attempt | None = None  # the watched attempt
        self._armed_delay = 0.0  # and its hedge delay
        self._not_before = -math.inf  # a deferred hedge looks again no earlier than this
        self._loop = asyncio.get_running_loop()
        self._deadlines = hedger.deadlines(self._loop)
        task = asyncio.current_task()
        assert task is not None, "a hedged request runs in a task"
        self._task = task
        self._timer: Deadline | None = None  # this race's deadline in its hedger's shared timer
        self._timer_at = math.inf  # hedger clock time the timer is set for
        self._wake: asyncio.Future[None] | None = None  # what the caller sleeps on
        self._over = False
        self._result: _Outcome[R] | None = None  # None once over: every candidate failed
        self._interrupted = False  # the caller's task was cancelled by us, to stop the primary
        self._tasks: AbstractSet[asyncio.Task[_Outcome[R]]] = _NONE  # every task started, until it ended
        self._soon = False  # a first look at the timer is on its way (see _arm)

    async def run(self) -> R:
        races = self._hedger.races
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

    # --- the primary, in the caller's task --------------------------------------------------

    async def _primary(self) -> None:
        candidate = self._candidates[0]
        self._next = 1
        mark = self._new_attempt(candidate)
        self._running[mark] = _Entry(candidate, "primary", None)
        self._arm(candidate, mark)
        cancelling = self._task.cancelling()
        try:
            value = await self._attempt(candidate, mark)
        except asyncio.CancelledError:
            if not self._take_back(cancelling):
                raise  # from outside: run's finally stops the rest
            # Stopped by us: another attempt decided the race, or this one was found hung.
            if mark.serving and mark not in self._hung:
                self._hedger.latency.record(self._key_of(candidate), self._clock() - mark.begun)
            return
        except Exception as exc:  # noqa: BLE001 - settled like any attempt's error
            self._take_back(cancelling)
            self._settle(mark, _Outcome(error=exc))
            return
        self._take_back(cancelling)
        if mark in self._running:
            self._record(candidate, mark)
        self._settle(mark, _Outcome(value=value))

    def _take_back(self, cancelling: int) -> bool:
        """Undo our own cancellation of the caller's task, if we made one; whether the task is
        left with no other cancellation than it had before the race."""
        if not self._interrupted:
            return False
        self._interrupted = False
        return self._task.uncancel() <= cancelling

    # --- attempts in tasks ----------------------------------------------------------------

    def _new_attempt(self, candidate: T) -> Attempt:
        on_progress = self._hedger.answered_of(self._key_of(candidate))
        return Attempt(self._clock, on_progress, self._demand, on_service=self._schedule)

    def _start(self, kind: Kind) -> None:
        candidate = self._candidates[self._next]
        self._next += 1
        mark = self._new_attempt(candidate)
        task = self._loop.create_task(self._timed(candidate, mark), name=f"hedge:{kind}:{self._key_of(candidate)}")
        self._started().add(task)
        task.add_done_callback(partial(self._ended, mark))
        self._running[mark] = _Entry(candidate, kind, task)
        self._arm(candidate, mark)

    def _started(self) -> set[asyncio.Task[_Outcome[R]]]:
        """The set of tasks started, made on first use."""
        tasks = self._tasks
        if not isinstance(tasks, set):
            tasks = self._tasks = set()
        return tasks

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
                self._hedger.latency.record(self._key_of(candidate), self._clock() - mark.begun)
            raise
        except Exception as exc:  # noqa: BLE001 - the race decides; CancelledError is no Exception
            return _Outcome(error=exc)
        self._record(candidate, mark)
        return _Outcome(value=value)

    def _record(self, candidate: T, mark: Attempt) -> None:
        key = self._key_of(candidate)
        self._hedger.latency.record(key, self._clock() - mark.begun)
        self._hedger.health.answered(key)

    def _ended(self, mark: Attempt, task: asyncio.Task[_Outcome[R]]) -> None:
        """A task's done callback."""
        self._started().discard(task)
        if task.cancelled():
            return  # stopped by us (a loser, or hung): already settled
        error = task.exception()
        self._settle(mark, task.result() if error is None else _Outcome(error=error))

    # --- deciding -------------------------------------------------------------------------

    def _settle(self, mark: Attempt, outcome: _Outcome[R]) -> None:
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
            self._schedule()

    def _decide(self, outcome: _Outcome[R] | None) -> None:
        """The race is over (None: every candidate failed): stop what still runs, wake the caller."""
        self._over, self._result = True, outcome
        for entry in self._running.values():
            self._stop(entry)
        self._running.clear()
        self._end()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _stop(self, entry: _Entry[T, R]) -> None:
        if entry.task is not None:
            entry.task.cancel()
        elif not self._interrupted:
            self._interrupted = True
            self._task.cancel()

    def _end(self) -> None:
        """Cancel the timer, and every task (a race left by an error or a cancellation)."""
        if self._timer is not None:
            self._deadlines.cancel(self._timer)
            self._timer = None
        for task in self._tasks:
            task.cancel()

    # --- the timer: hedges and hang deadlines ----------------------------------------------

    def _schedule(self) -> None:
        """Set the timer for the next look (the hedge or a hang deadline), unless it is set
        for earlier already (it then looks again when it fires)."""
        if self._over or self._soon:
            return  # over, or the first look is on its way
        at = self._next_look()
        if at is None or (self._timer is not None and self._timer_at <= at):
            return
        if self._timer is not None:
            self._deadlines.cancel(self._timer)
        self._timer_at = at
        self._timer = self._deadlines.call_at(at, self._fired)

    def _fired(self) -> None:
        """The deadline came.  The shared timer runs this once the callbacks already due
        when it fired have run: an attempt whose answer came in the same turn of the loop (a
        loaded machine runs late) has then returned, rather than be hedged or found hung
        with its answer waiting."""
        self._timer = None
        self._look()

    def poke(self) -> None:
        """Another race found a target hung: look whether an attempt of this one is there."""
        if not self._over:
            self._loop.call_soon(self._look)

    def _look(self) -> None:
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
        elif due is not None and due <= self._hang_bound():
            return due  # the usual case, without working out any hang deadline
        hang = self._hang_check_at()
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

    def _arm(self, candidate: T, mark: Attempt) -> None:
        """Watch the attempt just started for a hedge, if another may follow it."""
        config = self._hedger.config
        can_hedge = self._hedging and self._next < len(self._candidates) and len(self._running) < config.max_parallel
        self._armed = mark if can_hedge else None
        if can_hedge:
            self._armed_delay = self._delay(candidate)
        self._not_before = -math.inf
        if not self._soon:  # once the attempt made its first move: queued (no timer yet) or not
            self._soon = True
            self._deadlines.call_soon(self._first_look)

    def _delay(self, candidate: T) -> float:
        """How long ``candidate``'s attempt runs before the next candidate is hedged to: the
        shorter of their delays.  By the next one's p95 it would have answered 95 times in
        100, so an attempt still running then is better raced, even when it is only its
        own target's usual pace: a replica slow on every read, behind a slow link, has a
        p95 as slow as its reads, and its own delay alone would hedge none of them."""
        latency, key_of = self._hedger.latency, self._key_of
        return min(latency.delay(key_of(candidate)), latency.delay(key_of(self._candidates[self._next])))

    def _first_look(self) -> None:
        self._soon = False
        self._schedule()

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

    def _hang_bound(self) -> float:
        """A lower bound of :meth:`_hang_check_at`: no deadline is shorter than ``hang_min_ms``."""
        heard = math.inf
        for mark in self._running:  # a loop, not a generator: this runs at every look of every race
            if mark.serving and mark.heard < heard:
                heard = mark.heard
        return heard + self._hedger.config.hang_min_ms / 1000

    def _hang_check_at(self) -> float | None:
        """When an attempt in service may next be found hung (its hang deadline); None if none
        is in service (one queued in this client fails over when its target is found hung:
        see :meth:`poke`)."""
        health = self._hedger.health
        first: float | None = None
        for mark, entry in self._running.items():
            if mark in self._waited_for or not mark.serving:
                continue
            key = self._key_of(entry.candidate)
            deadline = health.deadline(self._hedger.latency.estimate(key))
            # Past its deadline at a target that still answers others: when it falls silent.
            at = max(mark.heard + deadline, health.silent_since(key, deadline))
            first = at if first is None else min(first, at)
        return first

    def _fail_over_hung(self) -> None:
        """Stop every attempt that outlived its hang deadline, or whose target is hung, and
        fail over from it at once, spending no hedge budget (a hung target is a failure)."""
        health, now = self._hedger.health, self._clock()
        for mark, entry in list(self._running.items()):
            if mark in self._waited_for or (entry.task is not None and entry.task.done()):
                continue  # waited for, or ended (its outcome is on its way)
            key = self._key_of(entry.candidate)
            deadline = health.deadline(self._hedger.latency.estimate(key))
            if mark.serving and now - mark.heard >= deadline and health.silent_for(key, deadline):
                health.mark(key, Reason.HUNG)
                for race in list(self._hedger.races):
                    if race is not self:
                        race.poke()
            elif key == self._probe or not health.has(key, Reason.HUNG):
                continue  # a probe of a hung target fails only by its own deadline
            if self._patient and len(self._running) == 1 and not self._healthy_left():
                self._waited_for = {*self._waited_for, mark}  # nowhere better to go: wait for it
                continue
            del self._running[mark]
            self._hung = {*self._hung, mark}
            self._stop(entry)
            self._hedger.counts.hung_failovers += 1
            self._fail_over(entry.candidate, Unavailable(f"{key}: no answer within its hang deadline (hung)"))

    def _healthy_left(self) -> bool:
        """Whether a candidate not yet tried is a target not known to be hung.  A patient tier
        (the last: nowhere to fall through to) waits for its last attempt rather than move on
        only to targets already found hung: on a loaded machine a healthy replica may outlive
        its hang deadline, and failing over from it to a stalled one would wait out a socket
        timeout instead (seen: 30 s, in a fresh-clone run beside another suite)."""
        health = self._hedger.health
        return any(not health.has(self._key_of(c), Reason.HUNG) for c in self._candidates[self._next :])


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


def exhausted(failures: list[tuple[T, BaseException]], key_of: Callable[[T], str]) -> HedgeExhausted:
    """The error once every candidate failed: each failure described, the last as cause."""
    if not failures:
        return HedgeExhausted("no candidates to try", [])
    described = "; ".join(f"{key_of(c)}: {type(e).__name__}: {e}" for c, e in failures)
    exc = HedgeExhausted(f"all {len(failures)} candidates failed: {described}", failures)
    exc.__cause__ = failures[-1][1]
    return exc
