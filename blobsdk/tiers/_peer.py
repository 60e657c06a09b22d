"""The peer tier (DESIGN §2): between L2 and L3, chunks fetched from other clients
of the same tenant, Owl-style, with the trackers (``servers/tracker.py``) as control plane.

A client with ``tracker_urls`` runs one :class:`PeerTier`: the part of a peer that fetches.
The part that shares, its serving cache, peer server and announce loop, is
:class:`~blobsdk.peer.sharing.Sharing`; the tier owns one, and the trackers (a
:class:`~blobsdk.peer.trackers.TrackerClient`: hello and heartbeats, locate, announce,
report), on one exit stack that entering the tier fills and leaving it empties.

**Fetch** (a chunk L1 and L2 missed): ask the chunk's tracker for sources (the asks of one
loop turn go in one request per tracker), keep those at addresses inside ``[peer]
allowed_networks`` (a tracker that names another address is never followed), and fetch from
them with this tier's hedger and a concurrency limiter per peer, verifying every copy's
checksum.  A bad copy is reported (``bad_bytes``) and never returned; a refusal (busy: 429),
404 (a stale entry: ``missing``) or failure (``failed``) is reported and the next source
tried.  No source, every source failed (and the second ask too, below), or the tracker
down or slow (``tracker_timeout_s``): a miss, and the read goes on to L3/L4 without an
error.  Whatever the sources (stopped, silent, lying that they are fetching it), one
chunk's read spends at most ``fetch_budget_s`` (default ``wait_s`` + 1 s) here, locate
included: then it is a miss (``over_budget``).  Every source failed with budget left, not
all busy: the tracker is asked once more, for complete copies not tried yet
(``asked_again``; the list went stale while its sources were tried: a source silent for
seconds, the others dropped the chunk since: swarm_sim's churn run read the origin 36 more
times for it, 2.25x the blob instead of 1.5x).  The tracker's answers are checked in
``blobsdk.peer.trackers``.

**Trees.** The tracker records every asker as a fetcher of the chunk and sends the next askers
to it (at most its fan-out each), so while a peer fetches a chunk, children are already
waiting at its server: they get the chunk the moment it lands here (from a peer or from
L3/L4, whose fills reach this tier as an upper tier's), and go on to their own children.  A
child waits at most ``wait_s`` for a chunk its source is still fetching, and not at all once
that fetch has ended without it (a tier below failed, the reader left): it gets a miss then
and goes on to its next source.  The tree is per chunk, so a blob of many chunks streams
through the peers chunk by chunk, never stored and forwarded whole.  (Not byte by byte
inside a chunk: a peer serves a chunk once it has it all and has verified it.  At 4 MiB
chunks and the benchmark's rates that costs each hop a few ms.)
What a peer keeps serving, and for how long, is :mod:`blobsdk.peer.sharing`'s.

Deep prefetch: the peer tier is no prefetch target (``holds`` is False), but a chunk a
prefetch brings from L3/L4 through it lands here as a read's does (``keep``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..auth import TICKET_HEADER
from ..chunks import Call, Demand, verify_raw
from ..config import HedgeConfig, PeerConfig, networks
from ..errors import BadCopy, BlobError, BlobNotFound, HedgeExhausted, PeerBusy, TimedOut
from ..net import PEER, Endpoint, LimiterRegistry
from ..peer import ConnectTrackers, Sharing, TrackerClient
from ..runtime import AsyncResource, kept_buffer, uninitialized
from ..stats import TierStats
from ..tail import Hedger
from ..wire import MAX_PROGRESS_MS, MIN_PROGRESS_MS, PROGRESS_HEADER, ChunkRef, Problem, Source, chunk_query
from .base import Decoder, cache_failover

_ANSWER_S = 1.0  # past a source's wait_s, how long its 404 may take to arrive
_BUSY_PAUSE_S, _BUSY_PAUSE_MAX_S = 0.05, 1.0  # every source busy: tried again after this, doubling
_BEATS = 4  # 102 Processing asked of a source still fetching, per timeout_s of silence allowed
# The peer tier's own counters, in the order its stats list them (``Sharing`` counts the rest).
_COUNTS = ("disallowed", "reported", "not_kept", "held", "over_budget", "asked_again", "busy_waits", "reannounced")


class PeerTier(AsyncResource):
    """See the module docstring.  ``trackers`` connects this peer to its trackers
    (:func:`blobsdk.peer.trackers.tracker_servers`); enter the tier (``async with``) to start
    its server and say hello."""

    name = "peer"
    keeps_fetched = True  # the serving cache (and the children waiting) share what it fetched

    def __init__(
        self,
        session: aiohttp.ClientSession,
        trackers: ConnectTrackers,
        config: PeerConfig | None = None,
        *,
        hedge: HedgeConfig | None = None,
        limiters: LimiterRegistry | None = None,
    ) -> None:
        self.config = config or PeerConfig()
        self.stats = TierStats()
        self.peer_id = secrets.token_hex(16)
        self.hedger = Hedger(hedge)
        self.counts: Counter[str] = Counter()
        self.sharing = Sharing(self.config)
        self._connect = trackers
        self._trackers: TrackerClient | None = None
        self._allowed = networks(self.config.allowed_networks)
        budget = self.config.fetch_budget_s
        self._budget_s = self.config.wait_s + _ANSWER_S if budget is None else budget
        progress_ms = self.config.timeout_s * 1000 / _BEATS
        self._progress_ms = f"{min(max(progress_ms, MIN_PROGRESS_MS), MAX_PROGRESS_MS):g}"
        self._endpoints = _Endpoints(session, self.config, limiters if limiters is not None else LimiterRegistry())
        self._background = _Background()
        self._locating: dict[str, tuple[ChunkRef, asyncio.Future[list[Source]]]] = {}
        self._stack: AsyncExitStack | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    async def _start(self) -> None:
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self._endpoints.aclose)
            self._trackers = await self.sharing.open(stack, self._connect, self.peer_id)
            stack.callback(self._forget_trackers)
            stack.push_async_callback(self._background.aclose)
            self._stack = stack.pop_all()

    async def aclose(self) -> None:
        """Stop fetching and serving, tell the trackers what this peer held, close its
        connections."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    def _forget_trackers(self) -> None:
        self._trackers = None

    @property
    def address(self) -> str:
        """Where this peer's server answers."""
        return self.sharing.server.address

    # --- the Tier ------------------------------------------------------------------------------------

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """Nothing without a request: ask fetch."""
        return None

    async def fetch(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> memoryview | None:
        begun = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._budget_s
        # Children sent here wait for this fetch.  On a miss it goes on below, in the same task
        # (the read path's one per chunk): the bytes land by ``fill``, or the task ends without
        # them (a tier below failed, the reader left) and the children get a miss at once.
        expecting = self.sharing.expect(ref.key, asyncio.current_task())
        raw = await self._from_peers(ref, deadline, demand)
        if raw is None:
            self.counts["over_budget"] += loop.time() >= deadline
            self.stats.misses += 1
            return None
        self.stats.hit(ref.raw_length, time.perf_counter() - begun)
        expecting.landed(raw)
        return raw

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """A chunk L3 or L4 served: serve it to the peers waiting for it, and announce it."""
        self.sharing.landed(ref.key, raw)

    def holds(self, ref: ChunkRef) -> bool:
        """Never a prefetch target (``client.prefetch`` warms L1, L2 or L3)."""
        return False

    async def finds(self, ref: ChunkRef) -> bool:
        return False

    async def keep(self, ref: ChunkRef, raw: memoryview) -> None:
        """A chunk a deep prefetch brought from L3 or L4: as ``fill`` (children may be waiting
        for it: without this, a worker's prefetched windows answered every child 404)."""
        self.sharing.landed(ref.key, raw)

    async def flush(self) -> None:
        """Nothing deferred (announcements are advice)."""

    def extra_stats(self) -> dict[str, int | float]:
        trackers = {} if self._trackers is None else self._trackers.counts
        counts = self.counts + self.sharing.counts
        return {
            **self.sharing.stats(),
            "tracker_errors": trackers.get("errors", 0),
            "tracker_timeouts": trackers.get("timeouts", 0),
            "tracker_nonsense": trackers.get("nonsense", 0),
            "bad_sources": trackers.get("bad_sources", 0),
            **{name: counts[name] for name in _COUNTS},
            **{f"hedge_{name}": value for name, value in self.hedger.stats().items()},
        }

    # --- fetching from peers ---------------------------------------------------------------------------

    async def _from_peers(self, ref: ChunkRef, deadline: float, demand: Demand | None) -> memoryview | None:
        """The chunk from the first of its sources to serve a verified copy by ``deadline``
        (loop time); None: none did.  Every source failed with time left, not all of them
        busy: the list may have gone stale while they were tried (one silent for seconds, the
        others dropped the chunk since), so the tracker is asked once more (``asked_again``)
        and its complete sources not tried yet are tried (no fetcher: one named now may be
        waiting for this peer).  Busy sources (429) are no sign of a stale list: asking again
        then cost swarm_sim's ``n100_slots_held`` run origin reads (3.33x -> 3.54x)."""
        tried: set[str] = set()
        for again in (False, True):
            try:
                async with asyncio.timeout_at(deadline):
                    located = await self._locate(ref)
            except TimeoutError:
                return None
            fresh = [s for s in located if s.peer_id not in tried and (s.complete or not again)]
            sources = [s for s in fresh if self._may_contact(s)]
            if not sources:
                return None
            try:
                return await self._from_sources(ref, sources, deadline, demand)
            except HedgeExhausted as exc:
                busy = all(isinstance(error, PeerBusy) for _, error in exc.failures)  # they have it: not stale
                if again or busy or asyncio.get_running_loop().time() >= deadline:
                    return None
                tried.update(s.peer_id for s in sources)
                self.counts["asked_again"] += 1
        return None

    async def _from_sources(self, ref: ChunkRef, sources: list[Source], deadline: float, demand: Demand | None) -> memoryview:
        """The chunk from one of ``sources``; HedgeExhausted if each failed.  Every one of
        them busy (429: each has ``max_uploads`` sends on its uplink), they are tried again
        after a pause (``busy_waits``; 50 ms, doubling, at most 1 s), while the budget lasts:
        they have the chunk, and on full links the origin is busier still than they are."""
        loop = asyncio.get_running_loop()
        pause = _BUSY_PAUSE_S
        while True:
            try:
                return await self.hedger.run(
                    sources,
                    partial(self._fetch_from, ref, deadline),
                    key_of=_address_of,
                    failover=cache_failover,
                    ready=lambda s: self._endpoints.get(s.address).has_room,
                    call=Call(demand),
                )
            except HedgeExhausted as exc:
                if not all(isinstance(error, PeerBusy) for _, error in exc.failures) or loop.time() + pause >= deadline:
                    raise
            self.counts["busy_waits"] += 1
            await asyncio.sleep(pause)
            pause = min(2 * pause, _BUSY_PAUSE_MAX_S)

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

    async def _fetch_from(self, ref: ChunkRef, deadline: float, source: Source, call: Call) -> memoryview:
        """The verified raw bytes from one peer; a failure is counted, reported and raised (the
        hedger then tries the next source).  Past the chunk's ``deadline`` (its budget on
        peers) an attempt is cut and the next ones fail at once: the read goes on to L3/L4.
        A source still fetching the chunk that stayed silent past its ``wait_s``, or for
        ``timeout_s`` (no ``102 Processing`` and no byte: stopped, cut off), broke its word
        and is reported; one cut sooner by the budget is not."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        # A source still fetching the chunk answers once it lands there: a wait in its queue,
        # which is no hang and no cause to hedge; bounded by its wait_s (then it answers 404),
        # and here by that plus a second for the answer.  Meanwhile it says 102 Processing
        # every quarter timeout_s: silent for timeout_s, it stopped or was cut off.
        hard = deadline if source.complete else min(deadline, now + self.config.wait_s + _ANSWER_S)
        if now >= deadline:
            raise TimedOut(f"{source.address}: chunk {ref.key}: its {self._budget_s:g} s on peers are spent")
        try:
            async with asyncio.timeout_at(hard) as limit:

                def heard() -> None:  # from the send of the request on, silence is bounded
                    limit.reschedule(min(hard, loop.time() + self.config.timeout_s))

                return await self._verified_from(ref, source, call, None if source.complete else heard)
        except TimeoutError:
            if not limit.expired():
                raise
            if not source.complete and (limit.when() or hard) < hard:
                self.stats.errors += 1
                self._report(source, ref.key, "failed")
                raise TimedOut(f"{source.address}: chunk {ref.key}: silent for {self.config.timeout_s:g} s") from None
            if source.complete or loop.time() - now < self.config.wait_s:
                raise TimedOut(f"{source.address}: chunk {ref.key}: its {self._budget_s:g} s on peers are spent") from None
            self.stats.errors += 1
            self._report(source, ref.key, "failed")
            raise TimedOut(f"{source.address}: chunk {ref.key} did not land there in time") from None

    async def _verified_from(self, ref: ChunkRef, source: Source, call: Call, heard: Callable[[], None] | None) -> memoryview:
        # Filled whole and verified, or discarded.  The serving cache keeps what fits (and L1
        # does too): a mapping of its own, faulted in at once (runtime/buffers.py, kept_buffer).
        size = ref.raw_length
        buf = kept_buffer(size) if size <= self.config.budget_bytes else memoryview(uninitialized(size))
        route = f"/v1/chunks/{ref.key}?{chunk_query(ref)}"
        headers = {TICKET_HEADER: source.ticket}
        endpoint = self._endpoints.get(source.address)
        try:
            if heard is None:
                await endpoint.get_into(route, buf, headers=headers, call=call)
            else:  # its wait is no hang for the hedger; its silence is ``heard``'s
                call.queued()
                headers[PROGRESS_HEADER] = self._progress_ms
                await endpoint.get_into(route, buf, headers=headers, call=Call(on_progress=heard, on_service=heard))
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
            self._background.spawn(self._trackers.report(source.peer_id, key, problem))

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
        self._background.spawn(self._ask(pending))  # the trackers split it per tracker and request size

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


class _Endpoints:
    """One :class:`Endpoint` per peer address, made when first fetched from, each with a
    concurrency limiter of its own; ``aclose`` closes them all."""

    def __init__(self, session: aiohttp.ClientSession, config: PeerConfig, limiters: LimiterRegistry) -> None:
        self._session, self._limiters = session, limiters
        self._made: dict[str, Endpoint] = {}
        # A source still fetching the chunk sends nothing until it lands (at most wait_s).
        wait = config.wait_s + config.timeout_s
        self._timeout = aiohttp.ClientTimeout(total=None, connect=config.timeout_s, sock_connect=config.timeout_s, sock_read=wait)

    def get(self, address: str) -> Endpoint:
        endpoint = self._made.get(address)
        if endpoint is None:
            endpoint = Endpoint(self._session, address, limiter=self._limiters.get(address), timeout=self._timeout, role=PEER)
            self._made[address] = endpoint
        return endpoint

    async def aclose(self) -> None:
        made, self._made = self._made, {}
        for endpoint in made.values():
            await endpoint.aclose()


class _Background:
    """Work nobody waits for (reports, locate batches): cancelled and awaited on ``aclose``."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _address_of(source: Source) -> str:
    return source.address
