"""The swarm simulator's event loop and tracker meter (``benchmarks/_swarm_model.py``).

:class:`Loop` is a heap of ``(time, seq, callback, args)``: events run in time order, and
events at one time in the order they were scheduled.  Its clock is what the simulated
tracker sees (``clock``; ``wall`` adds a fixed epoch, for serve-ticket expiries).
:class:`Metered` counts each tracker call and the process CPU time it took (the cyclic
collector's passes within apart), and can record the calls; :func:`replay` runs them again
on a fresh tracker, alone: its CPU as in a process of its own.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from blobsdk.errors import BlobError
from servers.tracker_rules import Tracker, TrackerConfig

EPOCH = 1.8e9  # the simulated wall clock's zero, a unix time
T = TypeVar("T")
Call = tuple[str, float, str, tuple[Any, ...]]  # (kind, simulated time, tracker method, arguments)


class Loop:
    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` at ``when`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def run(self, until: float = math.inf, stop: Callable[[], bool] = lambda: False) -> None:
        """Run events in order until none is left, the next is past ``until``, or ``stop()``."""
        heap = self._heap
        while heap and not stop():
            when, _, callback, args = heap[0]
            if when > until:
                break
            heapq.heappop(heap)
            self.now = when
            self.events += 1
            callback(*args)

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return EPOCH + self.now


class Metered:
    """Tracker calls by name, and the process CPU seconds they took in all: ``cpu_s`` without
    the cyclic collector's passes that fell inside a call, ``gc_s`` those passes (while
    :meth:`watching_gc`).

    Why apart: the collector's passes run when some allocation trips its
    threshold, and a locate allocates in bursts (its ranking tuples, the sources), so most
    passes fell inside tracker calls, though what they walk is the simulator's heap (~450
    objects per host: its events, flows, fetches; the tracker's own state is a few objects
    per peer and key).  The full passes walk all of it, and more of them run as N grows (the
    simulator's objects live a simulated while, which spans more allocations at larger N):
    at 3,000 hosts they were 43% of what was charged to the tracker, its CPU per host grew
    2.1x from 100 hosts with them and 1.3x without."""

    def __init__(self, clock: Callable[[], float] = time.process_time, record: Callable[[], float] | None = None) -> None:
        self.calls: Counter[str] = Counter()
        self.cpu_s = 0.0
        self.gc_s = 0.0
        self.log: list[Call] = []  # with ``record`` (the simulated clock): every call, for :func:`replay`
        self._clock, self._record = clock, record
        self._in_call = False
        self._gc_in_call = 0.0
        self._gc_begun = 0.0

    def call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        if self._record is not None:
            self.log.append((name, self._record(), getattr(fn, "__name__", name), args))
        self._in_call, self._gc_in_call = True, 0.0
        begun = self._clock()
        try:
            return fn(*args)
        finally:
            spent = self._clock() - begun
            self._in_call = False
            self.cpu_s += spent - self._gc_in_call
            self.gc_s += self._gc_in_call
            self.calls[name] += 1

    @contextlib.contextmanager
    def watching_gc(self) -> Iterator[None]:
        """Within: the collector's passes inside calls count in ``gc_s``, not ``cpu_s``."""
        gc.callbacks.append(self._on_gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if not self._in_call:
            return
        if phase == "start":
            self._gc_begun = self._clock()
        else:
            self._gc_in_call += self._clock() - self._gc_begun

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class Link:
    """One direction of a host's link, or the origin: ``Bps`` shared by its flows."""

    __slots__ = ("Bps", "flows")

    def __init__(self, Bps: float) -> None:
        self.Bps = Bps
        self.flows: dict[Flow, None] = {}  # insertion-ordered: a run repeats exactly


class Flow:
    """Bytes moving from ``up`` to ``down`` (and through ``pool``, if any); ``done(*args)``
    runs when the last one arrives."""

    __slots__ = ("args", "done", "down", "due", "left", "pool", "rate", "since", "up")

    def __init__(
        self, up: Link, down: Link, size: float, done: Callable[..., None], args: tuple[Any, ...], pool: Link | None = None
    ) -> None:
        self.up, self.down, self.pool, self.left = up, down, pool, size
        self.rate, self.since, self.due = 0.0, 0.0, math.inf  # due: its earliest event pending
        self.done, self.args = done, args


class Network:
    """Processor sharing, simplified: a flow runs at the smaller of its two links' equal
    shares (``Bps / flows``), recomputed for every flow of a link whenever a flow starts or
    ends there; a share the other end leaves unused is not handed on (max-min fairness would).

    A flow slowed down keeps its (now early) event, which finds it unfinished and schedules
    the next; only a flow sped up gets a new one.

    ``pool``: a third share every flow also takes, ``Bps / flows`` of it: the one machine's
    cores that every emulated host's reader spends on the bytes it receives (a testbed's
    hosts share them; real hosts each have their own, and no pool)."""

    def __init__(self, loop: Loop, pool: Link | None = None) -> None:
        self.loop = loop
        self.pool = pool

    def start(self, up: Link, down: Link, size: float, done: Callable[..., None], *args: Any) -> Flow:
        flow = Flow(up, down, size, done, args, self.pool)
        flow.since = self.loop.now
        up.flows[flow] = None
        down.flows[flow] = None
        if self.pool is not None:
            self.pool.flows[flow] = None
            self._reshare(self.pool)
        self._reshare(up)
        self._reshare(down)
        return flow

    def cancel(self, flow: Flow) -> None:
        if flow in flow.up.flows:
            self._remove(flow)

    def _remove(self, flow: Flow) -> None:
        flow.due = -1.0  # its pending events are stale
        flow.up.flows.pop(flow, None)
        flow.down.flows.pop(flow, None)
        if flow.pool is not None:
            flow.pool.flows.pop(flow, None)
            self._reshare(flow.pool)
        self._reshare(flow.up)
        self._reshare(flow.down)

    def _reshare(self, link: Link) -> None:
        now = self.loop.now
        for flow in link.flows:
            flow.left -= flow.rate * (now - flow.since)
            flow.since = now
            flow.rate = min(flow.up.Bps / len(flow.up.flows), flow.down.Bps / len(flow.down.flows))
            if flow.pool is not None:
                flow.rate = min(flow.rate, flow.pool.Bps / len(flow.pool.flows))
            finish = now + max(0.0, flow.left) / flow.rate
            if finish < flow.due:
                flow.due = finish
                self.loop.at(finish, self._arrived, flow, finish)

    def _arrived(self, flow: Flow, due: float) -> None:
        if due != flow.due:  # superseded by an earlier event, or the flow ended
            return
        finish = flow.since + max(0.0, flow.left) / flow.rate
        if finish > self.loop.now + 1e-9:  # slowed down since: not there yet
            flow.due = finish
            self.loop.at(finish, self._arrived, flow, finish)
            return
        self._remove(flow)
        flow.done(*flow.args)


def replay(config: TrackerConfig, log: list[Call], clock: Callable[[], float] = time.process_time) -> tuple[Tracker, Metered]:
    """``log``'s calls again, on a fresh tracker at the times recorded: the tracker's CPU as in
    a process of its own.  The process's other objects (the simulator's) are frozen out of the
    cyclic collector meanwhile (``gc.freeze``), so its passes walk the tracker's objects only,
    and count in the calls' ``cpu_s``.  The tracker's errors are the simulated clients'."""
    now = Loop()
    tracker = Tracker(config, clock=now.clock, wall=now.wall)
    meter = Metered(clock)
    gc.collect()
    gc.freeze()
    try:
        for name, when, method, args in log:
            now.now = when
            with contextlib.suppress(BlobError):
                meter.call(name, getattr(tracker, method), *args)
    finally:
        gc.unfreeze()
    return tracker, meter
