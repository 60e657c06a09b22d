"""What one chunk read carries across the layers below the read path, as one object.

A read of one chunk at one target (a replica, an L3 node, a peer) is a :class:`Call`: who
waits for it (its fetch's :class:`Demand`), the grant that lets it read the chunk's bytes,
and the hooks its hedger hears it by (queued, in service, bytes arriving, the server's word
that it waits on its own upstream).  It goes down as one argument (``Hedger.run(call=)`` ->
the attempt function -> ``BlockReplica.read_into(call=)`` -> ``Endpoint.get_into(call=)`` ->
the limiter's ``acquire(call.demand)``), as an HTTP client carries its extensions on its
request: a layer that needs one more thing of the read finds it on the call, and nothing
travels in a context variable.

A leaf module: the limiter, the hedger, the tiers and the stores all import it, and it
imports none of them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import TypeVar

# How often bytes arriving move ``heard`` on: far finer than any hang deadline (>= 0.5 s by
# default), and a clock read per recv, not a callback per recv.
HEARD_EVERY_S = 0.01

T = TypeVar("T")
R = TypeVar("R")


class Priority(IntEnum):
    """Queue order when an endpoint is at its limit: lower values go first."""

    FOREGROUND = 0
    PREFETCH = 1


class Demand:
    """Who waits for a fetch, as the priority its requests queue at, raised when a foreground
    reader joins it.

    The read path makes one per chunk fetch.  A prefetch's fetch queues at ``PREFETCH``,
    behind foreground reads.  A foreground reader that joins it (single-flight: one fetch per
    chunk, whoever started it) :meth:`promote`\\ s it: its requests still queued at a limiter
    move to the foreground queue at once, and those not yet made are made at ``FOREGROUND``.
    """

    __slots__ = ("__weakref__", "_watchers", "priority")

    def __init__(self, priority: Priority = Priority.FOREGROUND) -> None:
        self.priority = priority
        self._watchers: list[Callable[[], None]] | None = None  # made by the first watch

    def promote(self) -> None:
        """A foreground reader waits for this fetch now: its queued requests move ahead."""
        if self.priority is Priority.FOREGROUND:
            return
        self.priority = Priority.FOREGROUND
        for watcher in list(self._watchers or ()):
            watcher()

    def watch(self, on_promote: Callable[[], None]) -> None:
        """Call ``on_promote`` when this demand is promoted (a limiter, while a request of it
        waits).  A foreground demand is never promoted (nothing lowers a priority), so a
        watcher of one is never called: callers may skip it."""
        if self._watchers is None:
            self._watchers = []
        self._watchers.append(on_promote)

    def unwatch(self, on_promote: Callable[[], None]) -> None:
        if self._watchers is None:
            raise ValueError("unwatch of a watcher never watched")
        self._watchers.remove(on_promote)

    def __repr__(self) -> str:
        return f"<Demand {self.priority.name}>"


class Call:
    """One read of one chunk at one target: its ``demand`` (its requests queue at that
    priority), its ``grant`` (the tenancy grant the server checks; empty: none), and what it
    tells its hedger: whether it is in service, and since when.

    The fetch makes one call (its demand and grant) and hands it to the hedger, which makes
    each attempt a call of its own (:meth:`attempt`: the same demand and grant, its own
    hooks).  Code below that waits in a client-side queue (for a concurrency permit) calls
    :meth:`queued` before the wait and :meth:`in_service` after it.  Until then the attempt
    is not hedged, and its latency and hedge delay count from :meth:`in_service`, so a read
    that waited its turn in this client is never taken for a slow server.  A call that never
    says so is in service from its start.

    A server that answers "still working on it, waiting on my own upstream" (an L3 node
    reading a chunk through from L4 sends ``102 Processing``, repeated while it waits) calls
    :meth:`progress`: the attempt's hang deadline then counts from the last such word
    (``heard``), so a node queued behind a busy L4 is not taken for hung while a node that
    falls silent still is (and the target, which spoke, is not hung for the hedger's other
    reads either), and it is no longer hedged (a hedge would make another node read
    the same chunk through: the upstream's queue again, twice).  Its latency still counts
    from :meth:`in_service`.

    Bytes of the reply arriving (its head, or its body, however slowly) are :meth:`receiving`:
    the target is not silent, so the hang deadline counts from the last of them too, and a
    body that a full link delivers at its rate is no hang; unlike :meth:`progress`, the
    attempt is still hedged when it runs past its hedge delay (a slow link is a straggler,
    for the budget).  The hang deadline is thus one for the first byte and one for each
    silence between bytes, never one for the whole body, whose time is its size over the
    link's rate.

    ``on_service`` (the hedger's) is called when the attempt enters service, so the hedger
    times its hedge from then without polling the attempt while it waits."""

    __slots__ = ("_clock", "_on_progress", "_on_service", "begun", "demand", "grant", "heard", "serving", "upstream")

    def __init__(
        self,
        demand: Demand | None = None,
        grant: str = "",
        *,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[], None] | None = None,
        on_service: Callable[[], None] | None = None,
    ) -> None:
        self.demand = demand if demand is not None else Demand()
        self.grant = grant
        self._clock = clock
        self._on_service = on_service
        self._on_progress = on_progress  # the hedger's: the target spoke, so it is not hung
        self.begun = self.heard = clock()
        self.serving = True
        self.upstream = False  # the server said it waits on its own upstream for this attempt

    def attempt(
        self,
        clock: Callable[[], float],
        on_progress: Callable[[], None] | None = None,
        on_service: Callable[[], None] | None = None,
    ) -> Call:
        """This call again for one attempt of a hedged read: the same demand and grant, its
        own clock and hooks (attempts run at once, each in service from its own time)."""
        return Call(self.demand, self.grant, clock=clock, on_progress=on_progress, on_service=on_service)

    def queued(self) -> None:
        self.serving = False

    def in_service(self) -> None:
        self.begun = self.heard = self._clock()
        self.serving = True
        if self._on_service is not None:
            self._on_service()

    def receiving(self) -> None:
        now = self._clock()
        if now - self.heard >= HEARD_EVERY_S:
            self.heard = now
            if self._on_progress is not None:
                self._on_progress()

    def progress(self) -> None:
        self.heard = self._clock()
        self.upstream = True
        if self._on_progress is not None:
            self._on_progress()


AttemptFn = Callable[[T, Call], Awaitable[R]]  # one attempt of a hedged read at one candidate
