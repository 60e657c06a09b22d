"""The peer tier (issue 11; DESIGN §2): between L2 and L3, chunks fetched from other clients
of the same tenant, Owl-style, with the trackers (``servers/tracker.py``) as control plane.

A client with ``tracker_urls`` runs one :class:`PeerTier`, which owns three things:

- a :class:`~blobsdk.peer.trackers.Trackers` (hello and heartbeats, locate, announce, report);
- a :class:`~blobsdk.peer.server.PeerServer` that serves this tier's chunks to other peers;
- the *serving cache*: the chunks this peer has told its trackers it holds, a byte-budgeted
  LRU (``[peer] budget_bytes``) of the very buffers the read path filled into L1, so a chunk
  in both costs its memory once.

**Fetch** (a chunk L1 and L2 missed): ask the chunk's tracker for sources (the asks of one
loop turn go in one request per tracker), keep those at addresses inside ``[peer]
allowed_networks`` (a tracker that names another address is never followed), and fetch from
them with this tier's hedger and a concurrency limiter per peer, verifying every copy's
checksum.  A bad copy is reported (``bad_bytes``) and never returned; a refusal (busy: 429),
404 (a stale entry: ``missing``) or failure (``failed``) is reported and the next source
tried.  No source, every source failed, or the tracker down or slow (``tracker_timeout_s``):
a miss, and the read goes on to L3/L4 without an error.  Whatever the sources (stopped,
silent, lying that they are fetching it), one chunk's read spends at most
``fetch_budget_s`` (default ``wait_s`` + 1 s) here, locate included: then it is a miss
(``over_budget``).  The tracker's answers are checked in ``blobsdk.peer.trackers``; a tracker
that forgot this peer (restarted) gets its serving cache's keys announced again.

**Trees.** The tracker records every asker as a fetcher of the chunk and sends the next askers
to it (at most its fan-out each), so while a peer fetches a chunk, children are already
waiting at its server: they get the chunk the moment it lands here (from a peer or from
L3/L4, whose fills reach this tier as an upper tier's), and go on to their own children.  A
child waits at most ``wait_s`` for a chunk its source is still fetching.  The tree is per
chunk, so a blob of many chunks streams through the peers chunk by chunk, never stored and
forwarded whole.  (Not byte by byte inside a chunk: a peer serves a chunk once it has it all
and has verified it.  At 4 MiB chunks and the benchmark's rates that costs each hop a few ms.)

**Caching.** Every verified chunk this peer fetched is announced as filled; the trackers
answer which to keep (hot chunks on enough peers for the fan-out) and the rest leave the
serving cache ``_DROP_GRACE_S`` later.  A chunk the LRU evicts is announced as evicting; if it is the last copy
others still ask for, the tracker says hold, and it is kept ``hold_s`` more outside the
budget (at most ``_MAX_HELD`` chunks) before it is announced as evicted.  Announcements are
batched every ``_ANNOUNCE_S``.

Deep prefetch: the peer tier is no prefetch target (``holds`` is False), but a chunk a
prefetch brings from L3/L4 through it lands here as a read's does (``keep``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp
import cachetools

from ..auth import TICKET_HEADER, ServeKey
from ..config import HedgeConfig, PeerConfig, networks
from ..errors import BadCopy, BlobError, BlobNotFound, HedgeExhausted, PeerBusy, TimedOut
from ..net.endpoint import Endpoint
from ..peer.server import PeerServer
from ..peer.trackers import Trackers
from ..read.codec import verify_raw
from ..stats import TierStats
from ..tail.attempt import Attempt
from ..tail.hedge import Hedger
from ..tail.limiter import LimiterRegistry
from ..wire import ChunkRef, Problem, Source, chunk_query
from .base import Decoder, cache_failover

_ANNOUNCE_S = 0.05  # announcements wait this long to be batched
logger = logging.getLogger("blobsdk.peer")
_MAX_HELD = 1024  # chunks kept past the budget because a tracker said hold
_ANSWER_S = 1.0  # past a source's wait_s, how long its 404 may take to arrive
# A fill the trackers said not to keep is served this much longer: children it was handed to
# before the announcement may still be on their way (dropping it at once cost the p2p
# benchmark ~17 404s an epoch).
_DROP_GRACE_S = 2.0


class _ServingCache(cachetools.LRUCache[str, memoryview]):
    """The serving cache's LRU; what it evicts is collected for the next announcement."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(maxsize=budget_bytes, getsizeof=len)
        self.evicted: list[tuple[str, memoryview]] = []

    def popitem(self) -> tuple[str, memoryview]:
        key, raw = super().popitem()
        self.evicted.append((key, raw))
        return key, raw


class PeerTier:
    """See the module docstring.  Enter it (``async with``) to start its server and trackers."""

    name = "peer"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        tracker_urls: Sequence[str],
        config: PeerConfig | None = None,
        *,
        token: str | None = None,
        hedge: HedgeConfig | None = None,
        limiters: LimiterRegistry | None = None,
    ) -> None:
        if not tracker_urls:
            raise ValueError("the peer tier needs at least one tracker URL")
        self.config = config or PeerConfig()
        self.stats = TierStats()
        self.peer_id = secrets.token_hex(16)
        self.hedger = Hedger(hedge)
        self.limiters = limiters if limiters is not None else LimiterRegistry()
        self.counts: Counter[str] = Counter()
        self._session, self._tracker_urls, self._token = session, tuple(tracker_urls), token
        self._allowed = networks(self.config.allowed_networks)
        self._serve_key = ServeKey.generate()
        self._server = PeerServer(self.config, self._serve_key, self._lookup, self._trackers_tenant)
        self._trackers: Trackers | None = None
        self._serving = _ServingCache(self.config.budget_bytes)
        self._held: dict[str, tuple[memoryview, float]] = {}  # key -> (bytes, held until)
        self._dropping: dict[str, float] = {}  # key the trackers said not to keep -> when it leaves
        self._landing: dict[str, tuple[asyncio.Future[memoryview | None], float]] = {}  # key -> (lands, since)
        self._endpoints: dict[str, Endpoint] = {}
        # A source still fetching the chunk sends nothing until it lands (at most wait_s).
        wait = self.config.wait_s + self.config.timeout_s
        budget = self.config.fetch_budget_s
        self._budget_s = self.config.wait_s + _ANSWER_S if budget is None else budget
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=self.config.timeout_s, sock_connect=self.config.timeout_s, sock_read=wait
        )
        self._locating: dict[str, tuple[ChunkRef, asyncio.Future[list[Source]]]] = {}
        self._filled: set[str] = set()
        self._evicting: set[str] = set()
        self._evicted: set[str] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._announcer: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        address = await self._server.start()
        try:
            trackers = Trackers(
                self._session,
                self._tracker_urls,
                self._token,
                peer_id=self.peer_id,
                address=address,
                serve_key=self._serve_key,
                uploads=lambda: self._server.uploads,
                forgotten=self._forgotten,
                budget_bytes=self.config.budget_bytes,
                timeout_s=self.config.tracker_timeout_s,
            )
            self._trackers = await trackers.__aenter__()
        except BaseException:
            await self._server.aclose()
            raise
        self._announcer = asyncio.create_task(self._announce_loop(), name="blobsdk-peer-announcer")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving, tell the trackers what this peer held, close its connections."""
        tasks = [t for t in (self._announcer, *self._background) if t is not None]
        self._announcer = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.aclose()
        for lands, _ in self._landing.values():
            if not lands.done():
                lands.set_result(None)
        self._landing.clear()
        trackers, self._trackers = self._trackers, None
        if trackers is not None:
            gone = set(self._serving) | set(self._held) | self._evicting | self._evicted
            self._serving.clear()
            self._held.clear()
            if gone:
                await trackers.announce(evicted=gone)
            await trackers.__aexit__(None, None, None)
        endpoints, self._endpoints = self._endpoints, {}
        for endpoint in endpoints.values():
            await endpoint.aclose()

    @property
    def address(self) -> str:
        """Where this peer's server answers."""
        return self._server.address

    def _trackers_tenant(self) -> str | None:
        return None if self._trackers is None else self._trackers.tenant

    # --- the Tier ------------------------------------------------------------------------------------

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """Nothing without a request: ask fetch."""
        return None

    async def fetch(self, ref: ChunkRef, decode: Decoder) -> memoryview | None:
        begun = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._budget_s
        self._expect(ref.key)
        raw = await self._from_peers(ref, deadline)
        if raw is None:
            self.counts["over_budget"] += loop.time() >= deadline
            self.stats.misses += 1
            return None
        self.stats.hit(ref.raw_length, time.perf_counter() - begun)
        self._landed(ref.key, raw)
        return raw

    async def _from_peers(self, ref: ChunkRef, deadline: float) -> memoryview | None:
        """The chunk from the first of its sources to serve a verified copy by ``deadline``
        (loop time); None: none did."""
        try:
            async with asyncio.timeout_at(deadline):
                located = await self._locate(ref)
        except TimeoutError:
            return None
        sources = [s for s in located if self._may_contact(s)]
        if not sources:
            return None
        try:
            return await self.hedger.run(
                sources,
                partial(self._fetch_from, ref, deadline),
                key_of=_address_of,
                failover=cache_failover,
                ready=lambda s: self._endpoint(s.address).has_room,
            )
        except HedgeExhausted:
            return None

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """A chunk L3 or L4 served: serve it to the peers waiting for it, and announce it."""
        self._landed(ref.key, raw)

    def holds(self, ref: ChunkRef) -> bool:
        """Never a prefetch target (``client.prefetch`` warms L1, L2 or L3)."""
        return False

    async def keep(self, ref: ChunkRef, raw: memoryview) -> None:
        """A chunk a deep prefetch brought from L3 or L4: as ``fill`` (children may be waiting
        for it: without this, a worker's prefetched windows answered every child 404)."""
        self._landed(ref.key, raw)

    async def flush(self) -> None:
        """Nothing deferred (announcements are advice)."""

    def extra_stats(self) -> dict[str, int | float]:
        served = self._server.counts
        trackers = {} if self._trackers is None else self._trackers.counts
        return {
            "serving_entries": len(self._serving) + len(self._held),
            "serving_bytes": self._serving.currsize + sum(raw.nbytes for raw, _ in list(self._held.values())),
            "uploads": served["uploads"],
            "bytes_served": served["bytes_served"],
            "uploads_refused": served["refused"],
            "uploads_missing": served["missing"],
            "tracker_errors": trackers.get("errors", 0),
            "tracker_timeouts": trackers.get("timeouts", 0),
            "tracker_nonsense": trackers.get("nonsense", 0),
            "bad_sources": trackers.get("bad_sources", 0),
            **{name: self.counts[name] for name in ("disallowed", "reported", "not_kept", "held", "over_budget", "reannounced")},
            **{f"hedge_{name}": value for name, value in self.hedger.stats().items()},
        }

    # --- fetching from peers ---------------------------------------------------------------------------

    def _may_contact(self, source: Source) -> bool:
        """Whether ``source``'s address is an IP address inside ``allowed_networks``."""
        try:
            host = urlsplit(source.address).hostname or ""
            allowed = any(ipaddress.ip_address(host) in network for network in self._allowed)
        except ValueError:  # a host name, or no valid address at all: never contacted
            allowed = False
        if not allowed:
            self.counts["disallowed"] += 1
        return allowed

    def _endpoint(self, address: str) -> Endpoint:
        endpoint = self._endpoints.get(address)
        if endpoint is None:
            endpoint = Endpoint(self._session, address, limiter=self.limiters.get(address), timeout=self._timeout)
            self._endpoints[address] = endpoint
        return endpoint

    async def _fetch_from(self, ref: ChunkRef, deadline: float, source: Source, attempt: Attempt) -> memoryview:
        """The verified raw bytes from one peer; a failure is counted, reported and raised (the
        hedger then tries the next source).  Past the chunk's ``deadline`` (its budget on
        peers) an attempt is cut and the next ones fail at once: the read goes on to L3/L4.
        A source still fetching the chunk that stayed silent past its ``wait_s`` broke its
        word (it answers 404 by then) and is reported; one cut sooner is not."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        # A source still fetching the chunk answers once it lands there: a wait in its queue,
        # which is no hang and no cause to hedge; bounded by its wait_s (then it answers 404),
        # and here by that plus a second for the answer (a stopped peer sends none).
        own = math.inf if source.complete else now + self.config.wait_s + _ANSWER_S
        if now >= deadline:
            raise TimedOut(f"{source.address}: chunk {ref.key}: its {self._budget_s:g} s on peers are spent")
        try:
            async with asyncio.timeout_at(min(own, deadline)) as limit:
                return await self._verified_from(ref, source, attempt)
        except TimeoutError:
            if not limit.expired():
                raise
            if source.complete or loop.time() - now < self.config.wait_s:
                raise TimedOut(f"{source.address}: chunk {ref.key}: its {self._budget_s:g} s on peers are spent") from None
            self.stats.errors += 1
            self._report(source, ref.key, "failed")
            raise TimedOut(f"{source.address}: chunk {ref.key} did not land there in time") from None

    async def _verified_from(self, ref: ChunkRef, source: Source, attempt: Attempt) -> memoryview:
        buf = memoryview(bytearray(ref.raw_length))
        route = f"/v1/chunks/{ref.key}?{chunk_query(ref)}"
        headers = {TICKET_HEADER: source.ticket}
        try:
            if source.complete:
                await self._endpoint(source.address).get_into(route, buf, headers=headers, attempt=attempt)
            else:
                attempt.queued()
                await self._endpoint(source.address).get_into(route, buf, headers=headers)
            return verify_raw(ref, buf)
        except BadCopy:
            self.stats.corrupt += 1
            self._report(source, ref.key, "bad_bytes")
            raise
        except PeerBusy:
            self._report(source, ref.key, "refused")
            raise
        except BlobNotFound:
            self._report(source, ref.key, "missing")
            raise
        except BlobError:
            self.stats.errors += 1
            self._report(source, ref.key, "failed")
            raise

    def _report(self, source: Source, key: str, problem: Problem) -> None:
        if self._trackers is not None:
            self.counts["reported"] += 1
            self._spawn(self._trackers.report(source.peer_id, key, problem))

    # --- locate: one request per tracker for the asks of one loop turn --------------------------------

    async def _locate(self, ref: ChunkRef) -> list[Source]:
        loop = asyncio.get_running_loop()
        asked = self._locating.get(ref.key)
        if asked is None:
            if not self._locating:
                loop.call_soon(self._send_locates)
            asked = self._locating[ref.key] = (ref, loop.create_future())
        return await asyncio.shield(asked[1])

    def _send_locates(self) -> None:
        pending, self._locating = list(self._locating.values()), {}
        self._spawn(self._ask(pending))  # Trackers splits it per tracker and request size

    async def _ask(self, batch: list[tuple[ChunkRef, asyncio.Future[list[Source]]]]) -> None:
        try:
            found = {} if self._trackers is None else await self._trackers.locate(ref for ref, _ in batch)
        except BaseException as exc:
            for _, answer in batch:
                if answer.done():
                    continue
                if isinstance(exc, Exception):
                    answer.set_exception(exc)
                else:
                    answer.cancel()
            raise
        for ref, answer in batch:
            if not answer.done():
                answer.set_result(found.get(ref.key, []))

    # --- serving ------------------------------------------------------------------------------------

    def _expect(self, key: str) -> None:
        """This peer is fetching ``key``: children sent here meanwhile wait for it."""
        if key not in self._landing:
            self._landing[key] = (asyncio.get_running_loop().create_future(), time.monotonic())

    def _landed(self, key: str, raw: memoryview) -> None:
        """``key``'s verified bytes are here: hand them to the waiting children, serve them
        from now on, and announce them."""
        landing = self._landing.pop(key, None)
        if landing is not None and not landing[0].done():
            landing[0].set_result(raw)
        if self.config.budget_bytes and key not in self._serving and raw.nbytes <= self.config.budget_bytes:
            self._serving[key] = raw
            self._filled.add(key)

    async def _lookup(self, ref: ChunkRef) -> memoryview | None:
        """What the peer server serves for ``ref``: the serving cache's copy, or the chunk this
        peer is fetching once it lands (waiting at most ``wait_s``), or None."""
        raw = self._serving.get(ref.key)
        if raw is None and ref.key in self._held:
            raw = self._held[ref.key][0]
        if raw is not None:
            return raw
        landing = self._landing.get(ref.key)
        if landing is None:
            return None
        try:
            async with asyncio.timeout(self.config.wait_s):
                return await asyncio.shield(landing[0])
        except TimeoutError:
            return None

    # --- announcements ----------------------------------------------------------------------------

    async def _announce_loop(self) -> None:
        while True:
            await asyncio.sleep(_ANNOUNCE_S)
            try:
                now = time.monotonic()
                self._expire(now)
                await self._announce(now)
            except Exception:  # a bug: logged, and the next round goes on
                logger.exception("peer tier: announcing to the trackers failed")

    def _expire(self, now: float) -> None:
        """Free the waiters of fetches that never landed (they failed below, or their reader
        left); drop the not-kept fills whose grace is over; let held chunks go when due."""
        for key, (lands, since) in list(self._landing.items()):
            if now - since > self.config.wait_s:
                del self._landing[key]
                if not lands.done():
                    lands.set_result(None)
        for key, at in list(self._dropping.items()):
            if at <= now:
                del self._dropping[key]
                if self._serving.pop(key, None) is not None:
                    self.counts["not_kept"] += 1
        for key, (_, until) in list(self._held.items()):
            if until <= now:
                del self._held[key]
                self._evicted.add(key)

    async def _announce(self, now: float) -> None:
        """Tell the trackers what was filled, is being evicted and was evicted; act on what
        they answer (keep, hold)."""
        assert self._trackers is not None
        evicted_bytes = dict(self._serving.evicted)
        self._serving.evicted.clear()
        self._evicting.update(evicted_bytes)
        filled, evicting, evicted = self._filled, self._evicting - set(self._serving), self._evicted
        self._filled, self._evicting, self._evicted = set(), set(), set()
        if not (filled or evicting or evicted):
            return
        answer = await self._trackers.announce(filled=filled, evicting=evicting, evicted=evicted)
        for key in filled - answer.keep:  # served a little longer: children may be on their way
            self._dropping.setdefault(key, now + _DROP_GRACE_S)
        for key in evicting & answer.hold:
            raw = evicted_bytes.get(key)
            if raw is not None and len(self._held) < _MAX_HELD:
                self._held[key] = (raw, now + answer.hold_s)
                self.counts["held"] += 1
            else:
                self._evicted.add(key)

    def _forgotten(self, url: str) -> None:
        """Tracker ``url`` knows none of this peer's copies (it restarted, or this peer aged out
        there): announce those it owns again, with the next announcement."""
        trackers = self._trackers
        if trackers is None:  # the first hellos: nothing served yet
            return
        keys = [key for key in (*self._serving, *self._held) if trackers.tracker_of(key) == url]
        self._filled.update(keys)
        self.counts["reannounced"] += len(keys)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _address_of(source: Source) -> str:
    return source.address
