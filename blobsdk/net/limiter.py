"""Adaptive concurrency limits per upstream endpoint (DESIGN §2), in the style of Netflix
concurrency-limits.

Each endpoint (an L3 node, an L4 block server) gets one :class:`AdaptiveLimiter`.  A request
holds a :class:`Permit` for as long as it runs (``async with limiter.acquire() as permit``);
while ``in_flight >= capacity`` further requests wait in a priority queue, foreground reads
before prefetch, first come first served within a priority.  When a request ends, its
outcome moves the limit:

- success: its round-trip time (RTT) is a sample.  The *floor* is the lowest RTT seen; a
  floor not seen again for ``min_rtt_window_s`` is re-probed (briefly admitting a quarter
  of the limit, as BBR's ProbeRTT), so it follows the network both ways (see ``_Floor``).
  ``limiter.capacity`` is what may be in flight now: the limit, or less while probing.
  Where sizes vary, pass ``acquire(size=nbytes)``: only requests of at least half the
  largest recent size are samples (a small request's RTT would set a floor that the large
  ones could never reach, and read as inflation forever); the others still hold a slot
  and can drop.
- drop: a request its caller told so, explicitly: :meth:`Permit.dropped` (it timed out)
  or :meth:`Permit.overloaded` (HTTP 429/503: the server is shedding load); or one whose
  block raised ``TimeoutError`` itself (a deadline inside the permit).  Nothing is inferred
  from an exception's ``__cause__``.  The limit is multiplied by ``backoff``, at most once
  per round trip: only requests that began after the last cut can cut again, so a burst of
  429s answering one overload shrinks the limit once, not once per request (as TCP halves
  once per window).  For ``min_rtt_window_s`` after a drop the limit stays below the one that dropped, then
  probes it again: a server with a shallow queue rejects before its latency rises, and
  without this memory the limit would climb back into the 429s every few round trips.
  Only a drop amid successes (one since the last cut) is remembered so.  Drops while
  nothing succeeds (a server still busy with work others left behind, as a cold burst
  meets it, or a server that is down) say the server is full, not at which concurrency:
  they still cut, and fast 429s can cut the limit to ``min_limit`` within milliseconds, but
  once requests succeed again the limit before those cuts is regained in *slow start*, +1
  per sample (doubling per round trip, as TCP after a timeout), until it is reached, the
  RTT exceeds ``tolerance`` x the floor, or a drop amid successes finds the level.
- ignored: cancellation (a hedged loser, a reader that left) and every other error (404,
  connection refused, bad checksum) say nothing about load; the slot is released, no sample.
  So a deadline belongs *inside* the permit: one around it reaches it as a cancellation.

Algorithms (``LimiterConfig.algorithm``):

- ``"gradient"`` (default; Netflix Gradient/Gradient2): ``gradient = clamp(tolerance *
  floor / rtt, 0.5, 1)``, ``target = limit * gradient + sqrt(limit)``, and the limit moves
  ``smoothing`` of the way to the target per round trip, i.e. ``1 / limit`` of that step
  per sample (as TCP congestion avoidance adds ``1 / window``: a full step per sample would
  compound over the ``limit`` samples of one round trip, before any could show its effect,
  and overshoot).  At the floor the limit grows by ``smoothing * sqrt(limit)`` per round
  trip; beyond ``tolerance`` x the floor it shrinks in proportion to the inflation, by at
  most about ``smoothing / 2`` per round trip; the sqrt term is the queue it lets build up.
  The default because it backs off as queueing builds, *before* the server rejects.
- ``"aimd"``: +1 per ``limit`` successes (additive), ``x backoff`` on a drop or on an RTT
  above ``tolerance`` x the floor (multiplicative), with the same once-per-round-trip rule.

Either way a limit only grows from requests that found it at least half used (else the
caller, not the server, was the bottleneck, and an unused limit would drift to
``max_limit``), and it stays within ``[min_limit, max_limit]``.

An endpoint whose latency says nothing about our load gets ``by_latency=False``: only drops
cut its limit, and every success is a sample at the floor (no floor is kept or probed).  An
object store (the S3 L4) is one: it serves each GET from a fleet that one client does not
queue, its time to first byte varies by more than ``tolerance`` on its own (AWS S3's median
is well over twice its best), and it says when it is overloaded (503 SlowDown), so a latency
limit would only cap throughput (docs/architecture.md, "Adaptive concurrency", has the figure).

Priority is passed explicitly: ``acquire(call)`` takes the read's :class:`~blobsdk.chunks.call.Call`
(or a bare Demand), queues at its demand's priority (moved to the foreground queue if a
foreground reader joins the fetch meanwhile), and marks the call queued while it waits and
in service once admitted: the hedger never takes a read waiting its turn for a slow server.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from enum import Enum
from types import TracebackType
from typing import Self

from ..chunks import Call, Demand, Priority
from ..config import LimiterConfig

Clock = Callable[[], float]


DEFAULT_CONFIG = LimiterConfig()


class _Outcome(Enum):
    SUCCESS = "success"
    DROP = "drop"
    IGNORE = "ignore"

    __hash__ = object.__hash__  # counted per request: identity, in C (Enum's is Python code)


_PROBE_SHARE = 4  # a floor probe admits 1/4 of the limit
_BELOW = 1e-6  # an estimate this far under an integer limit stays under it
_SIZE_DECAY = 0.999  # per request: the largest recent size halves in ~700 smaller ones


class Permit:
    """One request's slot at an endpoint: ``async with`` waits for it, the body is the
    request, and leaving the block releases it and reports the outcome.

    Whoever sees the request fail tells the permit why, explicitly: :meth:`overloaded` (the
    server shed it: 429/503) or :meth:`dropped` (it timed out).  A ``TimeoutError`` raised out
    of the block (a deadline inside the permit) is a drop too; nothing else is inferred from
    an exception, and a cancellation says nothing about load.
    """

    __slots__ = ("_entered", "_limiter", "call", "demand", "drop", "in_flight_at_start", "sample", "started")

    def __init__(self, limiter: AdaptiveLimiter, demand: Demand, sample: bool, call: Call | None = None) -> None:
        self._limiter = limiter
        self.demand = demand
        self.call = call  # marked queued while the permit waits, in service once admitted
        self.sample = sample  # whether its RTT is a sample (see ``acquire(size=)``)
        self.drop = False  # told it was shed or timed out
        self.started = 0.0  # limiter clock when it was admitted
        self.in_flight_at_start = 0  # requests in flight once it was admitted, itself included
        self._entered = False

    def overloaded(self) -> None:
        """The server shed this request (429/503): shrink the limit, whatever is raised."""
        self.drop = True

    def dropped(self) -> None:
        """The request timed out (no answer in time): shrink the limit, whatever is raised."""
        self.drop = True

    @property
    def priority(self) -> Priority:
        return self.demand.priority

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("a Permit is entered only once; call acquire() per request")
        self._entered = True
        if self.call is not None:
            self.call.queued()
        await self._limiter.admit(self)
        if self.call is not None:
            self.call.in_service()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._limiter.release(self, self._outcome(exc))

    def _outcome(self, exc: BaseException | None) -> _Outcome:
        """A drop if the request was told so or timed out, success if it returned, else
        nothing to learn from (cancelled: a hedged loser or a reader that left; any other
        error: 404, refused, a bad checksum)."""
        if self.drop or isinstance(exc, TimeoutError):
            return _Outcome.DROP
        return _Outcome.SUCCESS if exc is None else _Outcome.IGNORE


class _Floor:
    """The RTT floor (minimum RTT) and its periodic re-probe, as BBR's ProbeRTT does.

    A sample at or below the floor refreshes it.  Once the floor is ``window_s`` old, the
    limiter probes: it admits at most ``probe_cap`` requests (a quarter of its limit) until
    that many requests that started under the cap have answered, and their fastest RTT
    becomes the floor, higher or lower than before.  So a floor learned too low (a faster
    path that is gone) or too high (never measured below the server's knee) is corrected
    within a window, at the cost of a round trip or two at reduced concurrency per window.
    The first drop also probes a floor that no probe has confirmed yet: the first samples
    come from cold connections at whatever concurrency the callers started with.
    """

    def __init__(self, window_s: float, min_cap: int, clock: Clock) -> None:
        self.value = math.inf
        self.probe_cap: int | None = None  # set while probing
        self.probes = 0
        self._window = window_s
        self._min_cap = min_cap
        self._clock = clock
        self._since = clock()  # when the floor was last set, or the probe began
        self._best = math.inf
        self._samples = 0
        self._confirmed = False

    def add(self, rtt: float, started: float, in_flight_at_start: int, limit: int) -> None:
        """Take the sample of a request that started at ``started`` with
        ``in_flight_at_start`` in flight; ``limit`` is the limit now."""
        now = self._clock()
        if self.probe_cap is None and rtt <= self.value:
            self.value, self._since = rtt, now
        elif self.probe_cap is None and now - self._since >= self._window:
            self._start_probe(now, limit)
        elif self.probe_cap is not None and started >= self._since and in_flight_at_start <= self.probe_cap:
            self._best, self._samples = min(self._best, rtt), self._samples + 1
            if self._samples >= self.probe_cap:
                self._end_probe(now)

    def on_drop(self, limit: int) -> None:
        """A drop: probe now if no probe has confirmed the floor yet."""
        if not self._confirmed and self.probe_cap is None:
            self._start_probe(self._clock(), limit)

    def expire_probe(self) -> None:
        """Give up a probe that got no samples for a window (its requests all failed)."""
        now = self._clock()
        if self.probe_cap is not None and now - self._since >= self._window:
            self._end_probe(now)

    def _start_probe(self, now: float, limit: int) -> None:
        self.probe_cap = max(self._min_cap, limit // _PROBE_SHARE)
        self._best, self._samples, self._since = math.inf, 0, now
        self.probes += 1

    def _end_probe(self, now: float) -> None:
        if math.isfinite(self._best):
            self.value, self._confirmed = self._best, True
        self.probe_cap, self._since = None, now


class AdaptiveLimiter:
    """The in-flight limit of one endpoint and its queue of waiting requests (see
    :class:`Permit` for what counts as a drop)."""

    def __init__(
        self,
        name: str,
        config: LimiterConfig = DEFAULT_CONFIG,
        *,
        clock: Clock = time.monotonic,
        by_latency: bool = True,
    ) -> None:
        self.name = name
        self.config = config
        self.by_latency = by_latency  # False: only drops cut (see the module docstring)
        self._clock = clock
        self._estimate = float(config.initial)
        self._floor = _Floor(config.min_rtt_window_s, config.min_limit, clock)
        self._cut_at = -math.inf
        self._ceiling, self._ceiling_until = config.max_limit, -math.inf  # see _on_drop
        self._served = False  # a success since the last cut (see _on_drop)
        self._regain = 0.0  # the limit before drops that met no success: regained in slow start
        self._in_flight = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap; cancelled ones linger
        self._queued = 0
        self._seq = itertools.count()
        self._counts = dict.fromkeys(_Outcome, 0)
        self._large_size = 0.0

    @property
    def limit(self) -> int:
        return int(self._estimate)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def has_room(self) -> bool:
        """Whether a request would be admitted at once (nothing queued, a slot free)."""
        return not self._queued and self._in_flight < self.capacity

    @property
    def capacity(self) -> int:
        """How many requests may be in flight now: the limit, or fewer while the floor is
        being probed."""
        probe_cap = self._floor.probe_cap
        return self.limit if probe_cap is None else min(probe_cap, self.limit)

    def acquire(self, demand: Call | Demand | Priority | None = None, *, size: int | None = None) -> Permit:
        """A permit to enter with ``async with``, queued at ``demand``'s priority (a Call's
        demand's; None: FOREGROUND), and moved ahead if that demand is promoted while it waits
        (see blobsdk/chunks/call.py); a Call is marked queued and in service by the permit.
        ``size``: the bytes the request moves, where that varies (see the module docstring)."""
        if isinstance(demand, Call):
            return Permit(self, demand.demand, self._samples_size(size), demand)
        if not isinstance(demand, Demand):
            demand = Demand(Priority.FOREGROUND if demand is None else demand)
        return Permit(self, demand, self._samples_size(size))

    def _samples_size(self, size: int | None) -> bool:
        """Whether a request of ``size`` bytes is comparable with the largest recent ones."""
        if size is None:
            return True
        self._large_size = max(float(size), self._large_size * _SIZE_DECAY)
        return size >= self._large_size / 2

    def stats(self) -> dict[str, int | float]:
        floor = self._floor.value
        return {
            "limit": self.limit,
            "in_flight": self._in_flight,
            "queued": self._queued,
            "successes": self._counts[_Outcome.SUCCESS],
            "drops": self._counts[_Outcome.DROP],
            "ignored": self._counts[_Outcome.IGNORE],
            "min_rtt_ms": round(floor * 1000, 3) if math.isfinite(floor) else 0.0,
            "probes": self._floor.probes,
        }

    # --- queue ---------------------------------------------------------------------------

    async def admit(self, permit: Permit) -> None:
        """Give ``permit`` a slot (``Permit.__aenter__``): at once if one is free and
        nobody waits, else once one is; then stamp when it started and the load it found."""
        await self._take_slot(permit)
        permit.started = self._clock()
        permit.in_flight_at_start = self._in_flight

    async def _take_slot(self, permit: Permit) -> None:
        if self._in_flight < self.capacity and not self._queued:  # never overtake a waiter
            self._in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (permit.priority, next(self._seq), waiter))
        self._queued += 1
        # A foreground request is at the front's priority already, never promoted: no watcher
        # (a closure and its cells, made in _watch, only for what may move).
        promoted = None if permit.priority is Priority.FOREGROUND else self._watch(permit, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            self._leave_queue(waiter)
            raise
        finally:
            if promoted is not None:
                permit.demand.unwatch(promoted)

    def _watch(self, permit: Permit, waiter: asyncio.Future[None]) -> Callable[[], None]:
        """Queue ``waiter`` again at the front's priority if ``permit``'s demand is promoted
        while it waits (``_wake`` skips its old entry); the watcher, to unwatch."""

        def promoted() -> None:
            if not waiter.done():
                heapq.heappush(self._waiters, (permit.priority, next(self._seq), waiter))

        permit.demand.watch(promoted)
        return promoted

    def _leave_queue(self, waiter: asyncio.Future[None]) -> None:
        """A waiter was cancelled: if it had already been granted a slot, pass the slot on."""
        if waiter.done() and not waiter.cancelled():
            self._in_flight -= 1
            self._wake()
            return
        waiter.cancel()
        self._queued -= 1
        if len(self._waiters) > 2 * self._queued + 64:
            self._waiters = [entry for entry in self._waiters if not entry[2].done()]
            heapq.heapify(self._waiters)

    def _wake(self) -> None:
        """Grant free slots to the best waiters (the slot is counted as theirs at once)."""
        while self._waiters and self._in_flight < self.capacity:
            waiter = heapq.heappop(self._waiters)[2]
            if waiter.done():
                continue  # cancelled while queued, already uncounted
            self._queued -= 1
            self._in_flight += 1
            waiter.set_result(None)

    # --- feedback ------------------------------------------------------------------------

    def release(self, permit: Permit, outcome: _Outcome) -> None:
        """Free ``permit``'s slot (``Permit.__aexit__``) and learn from its outcome."""
        self._in_flight -= 1
        self._counts[outcome] += 1
        if outcome is _Outcome.SUCCESS and permit.sample:
            self._on_success(permit, self._clock() - permit.started)
        elif outcome is _Outcome.DROP:
            self._on_drop(permit)
        self._floor.expire_probe()
        self._wake()

    def _on_success(self, permit: Permit, rtt: float) -> None:
        if self.by_latency:
            self._floor.add(rtt, permit.started, permit.in_flight_at_start, self.limit)
        else:
            rtt = self._floor.value = min(rtt, self._floor.value)  # for stats only: a sample at the floor
        cfg = self.config
        inflated = rtt > cfg.tolerance * self._floor.value
        if inflated:
            self._regain = 0.0  # a queue builds: the level is found, slow start ends
        if cfg.algorithm == "gradient":
            self._adjust(permit, self._slow_start(_gradient_step(self._estimate, rtt, self._floor.value, cfg)))
        elif inflated:
            self._cut(permit)  # AIMD reads inflation as a drop
        else:
            self._adjust(permit, self._slow_start(self._estimate + 1 / self._estimate))
        self._served = True  # after AIMD's cut above: this success is since the last cut

    def _slow_start(self, estimate: float) -> float:
        """Below the level to regain, +1 per sample (doubling per round trip, as TCP's slow
        start after a timeout), else ``estimate``."""
        if self._estimate >= self._regain:
            return estimate
        return max(estimate, min(self._regain, self._estimate + 1))

    def _on_drop(self, permit: Permit) -> None:
        """Cut.  A drop amid successes also holds the limit below the one that dropped for a
        window; a drop when nothing has succeeded since the last cut (the server is full of
        others' work, or down) says nothing about our level: the limit before it is regained
        in slow start once requests succeed."""
        dropped_at, served = self.limit, self._served
        if self._cut(permit):
            if served:
                self._ceiling, self._ceiling_until = dropped_at, self._cut_at + self.config.min_rtt_window_s
                self._regain = 0.0
            else:
                self._regain = max(self._regain, float(dropped_at))
            if self.by_latency:
                self._floor.on_drop(self.limit)

    def _adjust(self, permit: Permit, estimate: float) -> None:
        """Move to ``estimate``, growing only on evidence (a request that found the limit at
        least half used, else the caller was the bottleneck) and not up to a limit that
        dropped within the last window."""
        if estimate > self._estimate:
            if permit.in_flight_at_start < self._estimate / 2:
                return
            if self._clock() < self._ceiling_until:
                estimate = max(self._estimate, min(estimate, self._ceiling - _BELOW))
        self._set(estimate)

    def _cut(self, permit: Permit) -> bool:
        """Multiplicative decrease, once per round trip: only requests that began after the
        last cut saw the current limit.  Whether it cut."""
        if permit.started < self._cut_at:
            return False
        self._cut_at, self._served = self._clock(), False
        self._set(self._estimate * self.config.backoff)
        return True

    def _set(self, estimate: float) -> None:
        self._estimate = min(float(self.config.max_limit), max(float(self.config.min_limit), estimate))


def _gradient_step(estimate: float, rtt: float, floor: float, cfg: LimiterConfig) -> float:
    """Gradient: aim for ``limit * clamp(tolerance * floor / rtt, 0.5, 1) + sqrt(limit)``
    and move ``smoothing`` of the way there per round trip, i.e. ``1 / limit`` of that step
    per sample (a round trip brings about ``limit`` samples)."""
    allowed = cfg.tolerance * floor
    gradient = 1.0 if rtt <= allowed else max(0.5, allowed / rtt)
    target = estimate * gradient + math.sqrt(estimate)
    return estimate + cfg.smoothing * (target - estimate) / estimate


class LimiterRegistry:
    """One limiter per endpoint base URL, created on first use, all with one config (and
    ``by_latency`` as the first :meth:`get` of the endpoint asks)."""

    def __init__(
        self,
        config: LimiterConfig = DEFAULT_CONFIG,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._limiters: dict[str, AdaptiveLimiter] = {}

    def get(self, endpoint: str, *, by_latency: bool = True) -> AdaptiveLimiter:
        """The limiter of ``endpoint`` (a base URL; a trailing slash does not matter);
        ``by_latency``: see :class:`AdaptiveLimiter` (ValueError if the endpoint's limiter
        was made with the other)."""
        key = endpoint.rstrip("/")
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = AdaptiveLimiter(key, self.config, clock=self._clock, by_latency=by_latency)
            self._limiters[key] = limiter
        elif limiter.by_latency != by_latency:
            raise ValueError(f"the limiter of {key} was made with by_latency={limiter.by_latency}")
        return limiter

    def forget(self, endpoint: str) -> None:
        """Drop ``endpoint``'s limiter (a server no longer used; requests holding its permits
        still return them to it).  A later :meth:`get` makes a new one."""
        self._limiters.pop(endpoint.rstrip("/"), None)

    def has_room(self, endpoint: str) -> bool:
        """Whether ``endpoint`` would admit a request at once (one never used: yes)."""
        limiter = self._limiters.get(endpoint.rstrip("/"))
        return limiter is None or limiter.has_room

    def load(self, endpoint: str) -> int:
        """Requests in flight at ``endpoint`` or queued for it here (one never used: 0)."""
        limiter = self._limiters.get(endpoint.rstrip("/"))
        return 0 if limiter is None else limiter.in_flight + limiter.queued

    def limit(self, endpoint: str) -> int:
        """``endpoint``'s in-flight limit (one never used: the initial one)."""
        limiter = self._limiters.get(endpoint.rstrip("/"))
        return self.config.initial if limiter is None else limiter.limit

    def stats(self) -> dict[str, dict[str, int | float]]:
        """``{endpoint: limiter stats}`` for every endpoint used so far."""
        return {name: limiter.stats() for name, limiter in self._limiters.items()}
