"""A peer's side of its trackers (servers/tracker.py): the peer tier's control plane, seen
from a client (issue 11).

``Trackers(session, urls, token, peer_id=..., address=..., serve_key=...)``, entered with
``async with``, says hello to every tracker (handing it the peer's serve key, which it signs
the peer's serve tickets with, and learning the tenant the peer serves) and then heartbeats
each every ``heartbeat_s`` (as the tracker asks), with the peer's current upload count.
Each chunk key belongs to one tracker, chosen by rendezvous hashing over ``urls``
(``blobsdk.placement``), so trackers shard the key space and never talk to each other.
``locate``, ``announce`` and ``report`` batch their keys per tracker and ask the trackers
concurrently.

A tracker is never in the way of a read: a call that takes longer than ``timeout_s`` is
given up (its keys get no sources: the read path goes on to L3/L4; its announcements are
dropped).  A tracker that fails (refused, 5xx) or is slow ``SLOW_CALLS`` times in a row is
marked down for ``down_s``: its keys are not even asked for, and the next heartbeat after
``down_s`` tries it again.  (One slow call is no outage: on the p2p benchmark's loaded 2-core
machine, marking a tracker down for one 250 ms stall sent 5 s of a reader's chunks to the origin:
2.6x the dataset instead of 1.4x.)  A tracker that forgot the peer (restarted, or the peer aged out) answers
``PeerNotFound``: the peer says hello again and retries once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self, TypeVar

import aiohttp

from ._http import HttpEndpoint
from .auth import ServeKey
from .errors import BlobError, PeerNotFound
from .placement import rank
from .wire import (
    TRACKER_MAX_KEYS,
    AnnounceRequest,
    AnnounceResponse,
    ChunkRef,
    HelloResponse,
    LocateRequest,
    LocateResponse,
    PeerHello,
    Problem,
    ReportRequest,
    ReportResponse,
    Source,
)

TIMEOUT_S = 1.0  # a tracker call longer than this is skipped: the read goes on to L3/L4
DOWN_S = 5.0  # a tracker that failed is left alone this long
SLOW_CALLS = 3  # calls in a row past the timeout that count as a failure
HEARTBEAT_S = 5.0  # until a tracker says otherwise

T = TypeVar("T")


@dataclass
class Announced:
    """What the trackers answered to an announcement, merged."""

    keep: set[str] = field(default_factory=set)  # filled keys to keep serving
    hold: set[str] = field(default_factory=set)  # evicting keys to hold a while longer
    hold_s: float = 0.0


class Trackers:
    """See the module docstring."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Sequence[str],
        token: str | None = None,
        *,
        peer_id: str,
        address: str,
        serve_key: ServeKey,
        uploads: Callable[[], int] = lambda: 0,
        budget_bytes: int = 0,
        timeout_s: float = TIMEOUT_S,
        down_s: float = DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("Trackers needs at least one tracker URL")
        self._endpoints = {url.rstrip("/"): HttpEndpoint(session, url, token) for url in urls}
        self.peer_id, self.address, self._serve_key = peer_id, address, serve_key
        self.tenant: str | None = None  # as the trackers say, once one has answered a hello
        self._uploads, self._budget = uploads, budget_bytes
        self._timeout_s, self._down_s, self._clock = timeout_s, down_s, clock
        self._down_until: dict[str, float] = {}
        self._slow: Counter[str] = Counter()  # calls in a row past the timeout, per tracker
        self._heartbeat_s = HEARTBEAT_S
        self._heartbeat: asyncio.Task[None] | None = None
        self.counts: Counter[str] = Counter()

    async def __aenter__(self) -> Self:
        await asyncio.gather(*(self._hello(url) for url in self._endpoints))
        self._heartbeat = asyncio.create_task(self._beat(), name="blobsdk-tracker-heartbeat")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None

    def tracker_of(self, key: str) -> str:
        """The tracker that ``key`` belongs to."""
        return rank(key, list(self._endpoints))[0]

    def is_down(self, url: str) -> bool:
        return self._clock() < self._down_until.get(url.rstrip("/"), 0.0)

    # --- the calls --------------------------------------------------------------------------------

    async def locate(self, refs: Iterable[ChunkRef]) -> dict[str, list[Source]]:
        """Each chunk key's sources, best first (none: fetch from the origin, or its tracker is
        down).  The refs carry their grants: the tracker checks them."""
        wanted = {ref.key: ref for ref in refs}
        found: dict[str, list[Source]] = {key: [] for key in wanted}

        async def ask(url: str, batch: list[str]) -> None:
            def request() -> LocateRequest:
                return LocateRequest(peer_id=self.peer_id, refs=[wanted[key] for key in batch])

            answer = await self._call(url, "/v1/locate", request, LocateResponse)
            if answer is not None:
                found.update((located.key, located.sources) for located in answer.located if located.key in found)

        await self._per_tracker(wanted, ask)
        return found

    async def announce(
        self,
        *,
        filled: Iterable[str] = (),
        failed: Iterable[str] = (),
        evicting: Iterable[str] = (),
        evicted: Iterable[str] = (),
    ) -> Announced:
        """Tell each key's tracker; what they answered (a down tracker: nothing kept or held)."""
        lists = {"filled": set(filled), "failed": set(failed), "evicting": set(evicting), "evicted": set(evicted)}
        merged = Announced()

        async def tell(url: str, batch: list[str]) -> None:
            mine = set(batch)

            def request() -> AnnounceRequest:
                return AnnounceRequest(peer_id=self.peer_id, **{name: sorted(keys & mine) for name, keys in lists.items()})

            answer = await self._call(url, "/v1/announce", request, AnnounceResponse)
            if answer is not None:
                merged.keep.update(answer.keep)
                merged.hold.update(answer.hold)
                merged.hold_s = max(merged.hold_s, answer.hold_s)

        await self._per_tracker(set().union(*lists.values()), tell)
        return merged

    async def report(self, source: str, key: str, problem: Problem) -> bool:
        """Report ``source`` to ``key``'s tracker; whether it is banned now (False if unknown)."""
        request = ReportRequest(peer_id=self.peer_id, source=source, key=key, problem=problem)
        answer = await self._call(self.tracker_of(key), "/v1/report", lambda: request, ReportResponse)
        return answer is not None and answer.banned

    # --- plumbing ---------------------------------------------------------------------------------

    async def _per_tracker(self, keys: Iterable[str], call: Callable[[str, list[str]], Awaitable[None]]) -> None:
        """``call(tracker, its keys)`` for every tracker at once, at most TRACKER_MAX_KEYS keys a call."""
        batches: defaultdict[str, list[str]] = defaultdict(list)
        for key in keys:
            batches[self.tracker_of(key)].append(key)
        step = TRACKER_MAX_KEYS
        await asyncio.gather(
            *(call(url, batch[i : i + step]) for url, batch in batches.items() for i in range(0, len(batch), step))
        )

    async def _call(self, url: str, route: str, body: Callable[[], object], kind: type[T]) -> T | None:
        """One call to tracker ``url``, again after a hello if it forgot this peer; None if it is
        down, fails or is slow (see the module docstring)."""
        if self.is_down(url):
            self.counts["skipped_down"] += 1
            return None

        async def call() -> T:
            try:
                return await self._endpoints[url].call("POST", route, body(), kind)
            except PeerNotFound:
                self.counts["hellos_again"] += 1
                await self._say_hello(url)
                return await self._endpoints[url].call("POST", route, body(), kind)

        return await self._guarded(url, call)

    async def _hello(self, url: str) -> None:
        await self._guarded(url, lambda: self._say_hello(url))

    async def _guarded(self, url: str, work: Callable[[], Awaitable[T]]) -> T | None:
        """``work()``'s result, or None if it failed (the tracker is down for ``down_s``) or
        took over ``timeout_s`` (the ``SLOW_CALLS``-th such call in a row: down too)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await work()
        except TimeoutError:
            self.counts["timeouts"] += 1
            self._slow[url] += 1
            if self._slow[url] >= SLOW_CALLS:
                self._mark_down(url)
            return None
        except BlobError:
            self._mark_down(url)
            return None
        self._slow.pop(url, None)
        self._down_until.pop(url, None)
        return result

    async def _say_hello(self, url: str) -> None:
        hello = PeerHello(
            peer_id=self.peer_id,
            address=self.address,
            serve_key=self._serve_key.hex,
            uploads=self._uploads(),
            budget_bytes=self._budget,
        )
        answer = await self._endpoints[url].call("POST", "/v1/peers", hello, HelloResponse)
        self._heartbeat_s = min(self._heartbeat_s, answer.heartbeat_s)
        self.tenant = answer.tenant
        self.counts["hellos"] += 1

    def _mark_down(self, url: str) -> None:
        self.counts["errors"] += 1
        self._slow.pop(url, None)
        self._down_until[url] = self._clock() + self._down_s

    async def _beat(self) -> None:
        """Heartbeat every tracker; a down one only once its ``down_s`` has passed."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            await asyncio.gather(*(self._hello(url) for url in self._endpoints if not self.is_down(url)))
