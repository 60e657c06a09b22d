"""Who waits for a fetch, as the priority its requests queue at: the read path makes one
:class:`Demand` per chunk fetch and hands it down explicitly (``Tier.fetch`` -> the hedger ->
each :class:`~blobsdk.chunks.attempt.Attempt` -> the endpoint or S3 store -> the limiter's
``acquire``), so nothing travels in a context variable.

A prefetch's fetch queues at ``PREFETCH``, behind foreground reads.  A foreground reader that
joins it (single-flight: one fetch per chunk, whoever started it) :meth:`~Demand.promote`\\ s it:
its requests still queued at a limiter move to the foreground queue at once, and those not yet
made are made at ``FOREGROUND``.  A leaf module: the limiter, the hedger, the tiers and the
stores all import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum


class Priority(IntEnum):
    """Queue order when an endpoint is at its limit: lower values go first."""

    FOREGROUND = 0
    PREFETCH = 1


class Demand:
    """The priority of one fetch, raised when a foreground reader joins it."""

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
