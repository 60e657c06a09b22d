"""An in-process tracker deployment for the peer tier, spoken to through the protocol the
tier uses (``blobsdk.peer.trackers.TrackerClient``), not over HTTP.

:class:`FakeTrackers` keeps one index of which peer holds which chunk, shared by every peer
connected to it (``connect`` is a ``ConnectTrackers``).  It does what a tracker does for a
peer that plays by the rules, and no more:

- a peer is registered while its connection is entered, and learns the tenant at once;
- ``announce``: ``filled`` keys are held by the peer (and all kept), ``evicting``,
  ``evicted`` and ``failed`` ones no longer; nothing is held past eviction;
- ``locate``: a chunk's holders, never the asker itself and never a peer that is only
  fetching it (no trees), each with a serve ticket signed with the holder's key for the
  tenant, as a tracker signs one;
- ``report``: recorded in ``reports``; nobody is banned.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Iterable

from blobsdk.peer.trackers import Announced, Registration
from blobsdk.wire import ChunkRef, Problem, Source

TICKET_S = 60  # how long a serve ticket it hands out lasts


class FakeTrackers:
    """See the module docstring."""

    def __init__(self, tenant: str = "default") -> None:
        self.tenant = tenant
        self.peers: dict[str, Registration] = {}
        self.holders: defaultdict[str, set[str]] = defaultdict(set)  # key -> peer ids
        self.reports: list[tuple[str, str, Problem]] = []  # (source peer id, key, problem)
        self._changed = asyncio.Condition()

    def connect(self, peer: Registration) -> FakeTrackerClient:
        return FakeTrackerClient(self, peer)

    async def until_held(self, peer_id: str, keys: Iterable[str], within: float = 10.0) -> None:
        """Wait until ``peer_id`` has announced it holds every one of ``keys``."""
        wanted = list(keys)
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: all(peer_id in self.holders[key] for key in wanted))

    def sources(self, key: str, asker: str) -> list[Source]:
        """``key``'s holders other than ``asker``, with tickets for the tenant."""
        expires = int(time.time()) + TICKET_S
        return [
            Source(
                peer_id=holder,
                address=self.peers[holder].address,
                complete=True,
                ticket=self.peers[holder].serve_key.ticket(self.tenant, key, expires),
            )
            for holder in sorted(self.holders.get(key, ()))
            if holder != asker and holder in self.peers
        ]

    async def changed(self, peer_id: str, held: Iterable[str], gone: Iterable[str]) -> None:
        async with self._changed:
            for key in held:
                self.holders[key].add(peer_id)
            for key in gone:
                self.holders[key].discard(peer_id)
            self._changed.notify_all()


class FakeTrackerClient:
    """One peer's connection to a :class:`FakeTrackers` (a ``TrackerClient``)."""

    def __init__(self, trackers: FakeTrackers, peer: Registration) -> None:
        self.trackers, self.peer = trackers, peer
        self.counts: Counter[str] = Counter()
        self.tenant: str | None = None

    async def __aenter__(self) -> FakeTrackerClient:
        self.trackers.peers[self.peer.peer_id] = self.peer
        self.tenant = self.trackers.tenant
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        del self.trackers.peers[self.peer.peer_id]
        held = [key for key, holders in self.trackers.holders.items() if self.peer.peer_id in holders]
        await self.trackers.changed(self.peer.peer_id, (), held)

    def tracker_of(self, key: str) -> str:
        return "fake"

    async def locate(self, refs: Iterable[ChunkRef]) -> dict[str, list[Source]]:
        return {ref.key: self.trackers.sources(ref.key, self.peer.peer_id) for ref in refs}

    async def announce(
        self,
        *,
        filled: Iterable[str] = (),
        failed: Iterable[str] = (),
        evicting: Iterable[str] = (),
        evicted: Iterable[str] = (),
    ) -> Announced:
        kept = set(filled)
        await self.trackers.changed(self.peer.peer_id, kept, [*failed, *evicting, *evicted])
        return Announced(keep=kept)

    async def report(self, source: str, key: str, problem: Problem) -> bool:
        self.trackers.reports.append((source, key, problem))
        return False
