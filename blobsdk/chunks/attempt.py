"""One attempt of a hedged request (blobsdk/tail/hedge.py), as the code below the hedger sees it.

A leaf module: the block stores (blobsdk/sources/) and the endpoints mark the attempt they
are, and the hedger reads it, without either importing the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .demand import Demand

# How often bytes arriving move ``heard`` on: far finer than any hang deadline (>= 0.5 s by
# default), and a clock read per recv, not a callback per recv.
HEARD_EVERY_S = 0.01


class Attempt:
    """What one attempt of a hedged request tells its hedger: whether it is in service, and
    since when.  The hedger hands one to every attempt it starts; code below it that waits in
    a client-side queue (for a concurrency permit) calls :meth:`queued` before the wait and
    :meth:`in_service` after it.  Until then the attempt is not hedged, and its latency and
    hedge delay count from :meth:`in_service`, so a read that waited its turn in this client
    is never taken for a slow server.  An attempt that never calls them is in service from
    its start.

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

    __slots__ = ("_clock", "_on_progress", "_on_service", "begun", "demand", "heard", "serving", "upstream")

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[], None] | None = None,
        demand: Demand | None = None,
        *,
        on_service: Callable[[], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_service = on_service
        self.demand = demand if demand is not None else Demand()  # the fetch's: its requests queue at its priority
        self._on_progress = on_progress  # the hedger's: the target spoke, so it is not hung
        self.begun = self.heard = clock()
        self.serving = True
        self.upstream = False  # the server said it waits on its own upstream for this attempt

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
