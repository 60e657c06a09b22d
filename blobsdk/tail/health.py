"""The health of a tier's targets (an L4 replica, an L3 node, a tracker), kept in one place.

One :class:`TargetHealth` per tier (or per set of trackers) says, per target name, whether
it is unhealthy and why.  A target may be so for any of three reasons (:class:`Reason`),
each with its own rule, each cleared by its own evidence:

- ``DOWN``: it failed in a way that says it is not there (refused, 5xx, timed out, an answer
  that makes no sense).  Skipped for ``down_seconds`` (its keys go to the next targets, as
  if it had been removed), then tried again; a success clears it at once.  Marked by the
  L3 tier (a node that failed with Unavailable) and by :mod:`blobsdk.peer.trackers`.
- ``BAD_BYTES``: it served a copy that failed its checksum.  Ranked after the others for
  ``bad_bytes_seconds`` (``[repair] demote_seconds``), or until it serves a verified copy,
  so one corrupt replica costs one dropped copy, not one per read.  Marked by the L4 tier.
- ``HUNG`` (DESIGN §2): no answer within its hang deadline, a failure, not a straggler.
  Marked by the hedger (blobsdk/tail/hedge.py); the rest of this docstring is its rule.

A tier and its hedger share one tracker (``Hedger(..., health=)``): the hedger ranks and
fails over hung targets, the tier skips or demotes the others, and the tier's counts
(``targets_hung``, ``nodes_down``, ``replicas_demoted``) all come from it.

A hung server accepts connections (the kernel does that for a stopped process) and never
answers.  Hedging alone cannot cope: the hung replica keeps getting first attempts, each
needs a hedge from a budget sized for stragglers, its concurrency slots fill with stuck
requests so new attempts to it queue in the client, and a queued attempt is, by design,
never hedged.  So every read that ranks the hung replica first waits for its ``sock_read``
timeout (30 s by default).

The rule, kept per target:

- **Hung:** an attempt that has been *in service* (past its client-side queue) and silent
  for longer than the target's hang deadline — ``hang_factor`` x its latency estimate,
  clamped to ``[hang_min_ms, hang_max_ms]`` — marks the target hung, if no attempt at that
  target returned or received bytes within that deadline either.  Silent: no byte of its
  reply arrived (``Call.receiving``), so the deadline bounds the first byte and each
  pause between bytes, never the whole body: a 4 MiB body behind seven others on a full
  200 Mbit/s link takes seconds at the link's rate, and calling that hung failed nearly
  every L4 read over to the other replica, whose link was as full.  A target that answers others is busy, not hung: an
  HDD server's queue (which the client does not see) makes a read wait far past the
  estimate while its spindles serve the reads ahead of it.  Calling that hung failed every
  read queued there over to the other replicas, which queued them again: on the benchmark's
  saturated HDD tier (benchmarks/ingest.py) the L3 nodes' ~60 hung failovers an epoch read
  bytes nobody used.  The late read is a straggler, for the hedge budget.  The hedger then fails that
  attempt over to the next candidate at once without spending hedge budget (it is a failure,
  counted in ``hung_failovers``), and so does every attempt still queued for or running at a
  target that is hung.
- **Ranked last:** candidates that are hung go after the healthy ones, so new first attempts
  go elsewhere.
- **Probed back gently:** once ``probe_after_s`` has passed (doubling after each failed probe,
  up to ``probe_max_s``), one read at a time may try the hung target first again: if it
  answers within the deadline the target is healthy again; if it hangs, the read fails over
  after at most one hang deadline and the next probe waits twice as long.  Any attempt that
  returns from a target marks it not hung.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Protocol, TypeVar

from ..config import HedgeConfig

T = TypeVar("T")


class Reason(Enum):
    """Why a target is unhealthy (see the module docstring for each rule)."""

    HUNG = "hung"
    DOWN = "down"
    BAD_BYTES = "bad bytes"

    # A member is a singleton: hash it by identity, in C.  Enum's own __hash__ is Python code
    # (hash of the name), and every read looks reasons up in dicts several times (~0.2 µs each).
    __hash__ = object.__hash__


_HUNG = Reason.HUNG  # a module global is read faster than an Enum member (~0.1 µs, several per read)


class _Hung:
    __slots__ = ("backoff", "hung", "probe_at", "probing")

    def __init__(self) -> None:
        self.hung = False
        self.probing = False
        self.probe_at = 0.0
        self.backoff = 0.0


class TargetHealth:
    """Healthy, or unhealthy for some :class:`Reason`, per target name; see the module
    docstring.  ``config`` holds the hang rule (the tier's hedge settings); ``down_seconds``
    and ``bad_bytes_seconds`` how long a target stays down or ranked last."""

    def __init__(
        self,
        config: HedgeConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        down_seconds: float = 0.0,
        bad_bytes_seconds: float = 0.0,
    ) -> None:
        self.config = config if config is not None else HedgeConfig()
        self.down_seconds = down_seconds
        self.bad_bytes_seconds = bad_bytes_seconds
        self._clock = clock
        self._hung: dict[str, _Hung] = {}
        self._until: dict[Reason, dict[str, float]] = {Reason.DOWN: {}, Reason.BAD_BYTES: {}}  # unhealthy until
        self._answered_at: dict[str, float] = {}  # when an attempt at each target last returned
        self.probes = 0

    # --- every reason ---------------------------------------------------------------------

    def mark(self, target: str, reason: Reason) -> None:
        """``target`` is unhealthy for ``reason`` (now, or again)."""
        if reason is _HUNG:
            self._mark_hung(target)
        else:
            seconds = self.down_seconds if reason is Reason.DOWN else self.bad_bytes_seconds
            self._until[reason][target] = self._clock() + seconds

    def clear(self, target: str, reason: Reason) -> None:
        """``target`` showed it is healthy again as far as ``reason`` goes."""
        if reason is _HUNG:
            state = self._hung.get(target)
            if state is not None and state.hung:
                state.hung = state.probing = False
        else:
            self._until[reason].pop(target, None)

    def forget(self, target: str) -> None:
        """Drop all that is known of ``target`` (no longer one: a node removed from a tier)."""
        self._hung.pop(target, None)
        self._answered_at.pop(target, None)
        for timed in self._until.values():
            timed.pop(target, None)

    def has(self, target: str, reason: Reason) -> bool:
        """Whether ``target`` is unhealthy for ``reason`` now."""
        if reason is _HUNG:
            state = self._hung.get(target)
            return state is not None and state.hung
        timed = self._until[reason]
        until = timed.get(target)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del timed[target]
        return False

    def count(self, reason: Reason) -> int:
        """How many targets are unhealthy for ``reason`` now."""
        if reason is _HUNG:
            return sum(state.hung for state in list(self._hung.values()))  # list(): one step beside the loop thread
        now = self._clock()
        return sum(until > now for until in list(self._until[reason].values()))

    # --- the hang rule --------------------------------------------------------------------

    def deadline(self, estimate: float | None) -> float:
        """Seconds in service after which an attempt at a target with this latency
        estimate is hung."""
        c = self.config
        low, high = c.hang_min_ms / 1000, c.hang_max_ms / 1000
        return high if estimate is None else min(high, max(low, c.hang_factor * estimate))

    def _mark_hung(self, target: str) -> None:
        """An attempt at ``target`` outlived its hang deadline."""
        state = self._hung.setdefault(target, _Hung())
        if state.hung and not state.probing:
            return  # already known: another read's attempt crossed its deadline too
        c = self.config
        state.backoff = c.probe_after_s if not state.hung else min(c.probe_max_s, 2 * state.backoff)
        state.hung, state.probing = True, False
        state.probe_at = self._clock() + state.backoff

    def silent_since(self, target: str, seconds: float) -> float:
        """When ``target`` has been silent ``seconds`` (no attempt at it returned): its last
        answer plus ``seconds``; ``-inf`` if none ever did."""
        answered = self._answered_at.get(target)
        return float("-inf") if answered is None else answered + seconds

    def silent_for(self, target: str, seconds: float) -> bool:
        """No attempt at ``target`` returned in the last ``seconds`` (or ever)."""
        return self._clock() >= self.silent_since(target, seconds)

    def answered(self, target: str) -> None:
        """An attempt at ``target`` returned, or its server said it is working on one: it is
        not hung."""
        self._answered_at[target] = self._clock()
        self.clear(target, _HUNG)

    def probe_done(self, target: str) -> None:
        """A probe ended without a verdict (cancelled: another candidate won first)."""
        state = self._hung.get(target)
        if state is not None:
            state.probing = False

    def rank(self, candidates: Sequence[T], key_of: Callable[[T], str]) -> tuple[Sequence[T], str | None]:
        """``candidates`` with hung targets last (stable), except that one hung target whose
        probe is due goes first; and the name of that probed target, if any.  With no target
        hung (the usual case), ``candidates`` itself."""
        if not any(state.hung for state in self._hung.values()):
            return candidates, None
        healthy = [c for c in candidates if not self.has(key_of(c), Reason.HUNG)]
        if len(healthy) == len(candidates):
            return list(candidates), None
        hung = [c for c in candidates if self.has(key_of(c), Reason.HUNG)]
        now = self._clock()
        for c in hung:
            state = self._hung[key_of(c)]
            if not state.probing and now >= state.probe_at:
                state.probing = True
                self.probes += 1
                return [c, *healthy, *(h for h in hung if h is not c)], key_of(c)
        return [*healthy, *hung], None


class Poked(Protocol):
    """A race in flight (blobsdk/tail/race.py), as the hang watch tells it a target is hung."""

    def poke(self) -> None: ...


class Heard(Protocol):
    """An attempt's call (blobsdk/chunks/call.py) as the hang watch sees it: whether it is in
    service, and when its target last spoke for it."""

    @property
    def serving(self) -> bool: ...

    @property
    def heard(self) -> float: ...


class Watched(Protocol):
    """A race's record of one attempt: its target, and whether it is waited for past its
    hang deadline (the last hope of a patient tier: no longer watched)."""

    @property
    def key(self) -> str: ...

    @property
    def waited(self) -> bool: ...


class HangWatch:
    """The hang rule (the module docstring) applied to the attempts of one hedger's races:
    when one of a race's attempts in service may next be found hung, whether one is now, and
    which races are in flight, so that one that finds a target hung tells the others (their
    attempts queued or running there fail over; none of them polls).  ``estimate``: a
    target's latency estimate, which sets its hang deadline."""

    __slots__ = ("_estimate", "_health", "_least", "races")

    def __init__(self, health: TargetHealth, estimate: Callable[[str], float | None]) -> None:
        self._health = health
        self._estimate = estimate
        self._least = health.config.hang_min_ms / 1000  # no hang deadline is shorter
        self.races: set[Poked] = set()  # in flight: told when a race finds a target hung

    def bound(self, marks: Iterable[Heard]) -> float:
        """A lower bound of :meth:`next_check`, cheap: it looks up no deadline."""
        heard = math.inf
        for mark in marks:  # a loop, not a generator: this runs at every look of every race
            if mark.serving and mark.heard < heard:
                heard = mark.heard
        return heard + self._least

    def next_check(self, running: Iterable[tuple[Heard, Watched]]) -> float | None:
        """When an attempt in service may next be found hung: past its deadline, once its
        target is silent as long (a target that answers others is busy, not hung); None if
        none is in service (one queued in this client fails over when its target is found
        hung: see ``Race.poke``)."""
        health, first = self._health, math.inf
        for mark, entry in running:
            if mark.serving and not entry.waited:
                deadline = health.deadline(self._estimate(entry.key))
                first = min(first, max(mark.heard + deadline, health.silent_since(entry.key, deadline)))
        return None if first == math.inf else first

    def found_hung(self, target: str, mark: Heard, now: float, finder: Poked) -> bool:
        """Whether an attempt at ``target`` is hung by its own deadline now; if so ``target``
        is marked hung and every race in flight but ``finder`` is told."""
        if not mark.serving:
            return False
        deadline = self._health.deadline(self._estimate(target))
        if now - mark.heard < deadline or not self._health.silent_for(target, deadline):
            return False
        self._health.mark(target, _HUNG)
        for race in list(self.races):
            if race is not finder:
                race.poke()
        return True

    def is_hung(self, target: str) -> bool:
        return self._health.has(target, _HUNG)

    def any_healthy(self, targets: Iterable[str]) -> bool:
        """Whether one of ``targets`` is not known to be hung."""
        return any(not self._health.has(target, _HUNG) for target in targets)
