"""Which targets of a tier are hung (DESIGN §2): a failure, not a straggler.

A hung server accepts connections (the kernel does that for a stopped process) and never
answers.  Hedging alone cannot cope: the hung replica keeps getting first attempts, each
needs a hedge from a budget sized for stragglers, its concurrency slots fill with stuck
requests so new attempts to it queue in the client, and a queued attempt is, by design,
never hedged.  So every read that ranks the hung replica first waits for its ``sock_read``
timeout (30 s by default).

The rule, kept per target (an L4 replica, an L3 node) by :class:`TargetHealth`:

- **Hung:** an attempt that has been *in service* (past its client-side queue) for longer
  than the target's hang deadline — ``hang_factor`` x its latency estimate, clamped to
  ``[hang_min_ms, hang_max_ms]`` — marks the target hung, if no attempt at that target
  returned within that deadline either.  A target that answers others is busy, not hung: an
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
  returns from a target marks it healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..config import HedgeConfig

T = TypeVar("T")


class _State:
    __slots__ = ("backoff", "hung", "probe_at", "probing")

    def __init__(self) -> None:
        self.hung = False
        self.probing = False
        self.probe_at = 0.0
        self.backoff = 0.0


class TargetHealth:
    """Hung or healthy, per target name; see the module docstring."""

    def __init__(self, config: HedgeConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._targets: dict[str, _State] = {}
        self._answered_at: dict[str, float] = {}  # when an attempt at each target last returned
        self.probes = 0

    def deadline(self, estimate: float | None) -> float:
        """Seconds in service after which an attempt at a target with this latency
        estimate is hung."""
        c = self._config
        low, high = c.hang_min_ms / 1000, c.hang_max_ms / 1000
        return high if estimate is None else min(high, max(low, c.hang_factor * estimate))

    def is_hung(self, target: str) -> bool:
        state = self._targets.get(target)
        return state is not None and state.hung

    def hung_count(self) -> int:
        return sum(state.hung for state in list(self._targets.values()))  # list(): one step beside the loop thread

    def mark_hung(self, target: str) -> None:
        """An attempt at ``target`` outlived its hang deadline."""
        state = self._targets.setdefault(target, _State())
        if state.hung and not state.probing:
            return  # already known: another read's attempt crossed its deadline too
        c = self._config
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
        healthy."""
        self._answered_at[target] = self._clock()
        state = self._targets.get(target)
        if state is not None and state.hung:
            state.hung = state.probing = False

    def probe_done(self, target: str) -> None:
        """A probe ended without a verdict (cancelled: another candidate won first)."""
        state = self._targets.get(target)
        if state is not None:
            state.probing = False

    def rank(self, candidates: Sequence[T], key_of: Callable[[T], str]) -> tuple[list[T], str | None]:
        """``candidates`` with hung targets last (stable), except that one hung target whose
        probe is due goes first; and the name of that probed target, if any."""
        healthy = [c for c in candidates if not self.is_hung(key_of(c))]
        if len(healthy) == len(candidates):
            return list(candidates), None
        hung = [c for c in candidates if self.is_hung(key_of(c))]
        now = self._clock()
        for c in hung:
            state = self._targets[key_of(c)]
            if not state.probing and now >= state.probe_at:
                state.probing = True
                self.probes += 1
                return [c, *healthy, *(h for h in hung if h is not c)], key_of(c)
        return [*healthy, *hung], None
