"""L3: the regional flash nodes (``servers/flash.py``), seen from the client.

Each chunk lives on ``replicas`` nodes chosen by rendezvous hashing of its chunk key over
the node URLs (:mod:`blobsdk.chunks.names`).  A node that misses reads the chunk through from
L4 itself, so a GET answers with the chunk's stored bytes either way; the client verifies
every copy (``decode``) and tries the next node on a bad or failed one.  It reports a bad
copy to the node that sent it (``POST /v1/chunks/{key}/bad``): a node sends a cache file it
verified once without reading it again (servers/flashsend.py), so it learns of a file that
rotted since from its clients, verifies the file again and drops it if damaged.  Each GET asks the
node for ``102 Processing`` every half ``hang_min_ms`` while it reads the chunk through: the
hedger then takes a node queued behind a busy L4 for working, not hung, and neither fails
the read over to L4 nor hedges it to another node (either would read the chunk from L4 a
second time, while the node's own read goes on or is cancelled half done).  L3 is a cache: it
never raises to the reader, it misses (None) and the read falls through to L4.

A node that fails with Unavailable (refused, timed out, 5xx) is marked down and skipped for
``down_seconds``; while it is down its keys go to the next nodes in rendezvous order, as if
it had been removed.  Down and hung are kept in the tier's one
:class:`~blobsdk.tail.health.TargetHealth`, which its hedger shares.

The member set can change while reads run (:meth:`L3Tier.set_urls`, behind
``Client.set_l3_urls``).  It is told, not discovered: whoever starts or stops a node (the
job's launcher, an operator) knows it first, the nodes keep no list of members, and a
client that polled one would add a service, a period and a failure mode to every job.  Two
clients with different lists only place some chunks differently (extra misses), since any
node reads any chunk through from L4 and every copy is verified.  It is one dict, replaced whole: each fetch takes the set of the
moment it starts and keeps it, so a read that began on a node since removed still talks to
that node's endpoint.  A removed endpoint is closed at once; a GET already running on it
ends as it would have (rawget closes its connection when it ends), and one that would start
on it is refused (Unavailable) and fails over to the next node or L4, without marking
anything down.  Every copy is verified either way, so a change costs misses, never bytes.
What the tier knew of a removed node (down, hung, its latency, its concurrency limit) is forgotten, so
a node added again starts afresh.

Each node is one :class:`~blobsdk.net.endpoint.Endpoint` (control requests, data GETs, its
concurrency limit).  The wire, shared with ``servers/flash.py``, is in ``blobsdk/wire.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import aiohttp
import msgspec

from ..auth import GRANT_HEADER
from ..chunks import Call, Demand, rank
from ..config import HedgeConfig, L3Config
from ..errors import BadCopy, BlobError, HedgeExhausted, Unavailable
from ..net import L3_NODE, Endpoint, LimiterRegistry
from ..runtime import AsyncResource, BufferPool
from ..stats import TierStats
from ..tail import Hedger, Reason, TargetHealth
from ..wire import (
    CACHE_HEADER,
    HYDRATE_BATCH,
    MIN_PROGRESS_MS,
    PROGRESS_HEADER,
    ChunkRef,
    HydrateRequest,
    HydrateStatus,
    chunk_query,
)
from .base import Decoder, KeepsNothing, cache_failover


@dataclass(frozen=True)
class HydrateJob:
    """A hydrate request sent to one node: its job id, or why it could not be sent; the
    chunks it asked for."""

    url: str
    job_id: str | None
    refs: tuple[ChunkRef, ...]
    error: str | None = None

    @property
    def total(self) -> int:
        return len(self.refs)


class L3Tier(KeepsNothing, AsyncResource):
    """The Tier over a set of L3 flash nodes, using (never closing) the caller's session.

    ``config`` is the client's ``[l3]`` table (replicas per chunk, how long a failed node is
    skipped).  ``token`` is the bearer token the nodes want (it names the tenant); ``timeout`` bounds
    each request to a node (default: the session's).  Besides ``stats`` it counts
    ``node_hits`` (served from a node's flash), ``node_fills`` (read through L4 by the
    node) and ``bad_copies_reported`` (bad copies a node was told of), see :meth:`extra_stats`.
    """

    name = "l3"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Sequence[str],
        config: L3Config = L3Config(),
        *,
        token: str | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        clock: Callable[[], float] = time.monotonic,
        hedge: HedgeConfig | None = None,
        limiters: LimiterRegistry | None = None,
        buffers: BufferPool | None = None,
    ) -> None:
        replicas, down_seconds = config.replicas, config.down_seconds
        if replicas < 1 or down_seconds < 0:  # a struct changed past its own check (force_setattr)
            raise ValueError(f"replicas must be >= 1 and down_seconds >= 0, got {replicas} and {down_seconds}")
        self.stats = TierStats()
        self.buffers = buffers if buffers is not None else BufferPool()
        self.node_hits = 0
        self.node_fills = 0
        self.bad_copies_reported = 0
        self.limiters = limiters if limiters is not None else LimiterRegistry()
        self.nodes_added = 0
        self.nodes_removed = 0
        self._endpoint = partial(Endpoint, session, token=token, timeout=timeout, role=L3_NODE)
        self._nodes = {url: self._new_endpoint(url) for url in dict.fromkeys(url.rstrip("/") for url in urls)}
        self._replicas = replicas
        hedge = hedge if hedge is not None else HedgeConfig()
        self.health = TargetHealth(hedge, clock, down_seconds=down_seconds)
        self.hedger = Hedger(hedge, clock=clock, health=self.health)
        # Twice within the shortest hang deadline: a node reading through says so in time.
        self._progress_ms = f"{max(MIN_PROGRESS_MS, self.hedger.config.hang_min_ms / 2):g}"

    @property
    def urls(self) -> list[str]:
        return list(self._nodes)

    def _new_endpoint(self, url: str) -> Endpoint:
        return self._endpoint(url, limiter=self.limiters.get(url))

    async def set_urls(self, urls: Sequence[str]) -> None:
        """Make ``urls`` (checked by the caller) the nodes from now on: kept nodes keep their
        endpoint and what the tier knows of them, new ones get an endpoint, removed ones are
        forgotten and their endpoint closed (see the module docstring for reads in flight)."""
        old = self._nodes
        nodes = {url.rstrip("/"): old.get(url.rstrip("/")) for url in urls}
        fresh = {url: endpoint if endpoint is not None else self._new_endpoint(url) for url, endpoint in nodes.items()}
        removed = [endpoint for url, endpoint in old.items() if url not in fresh]
        self._nodes = fresh  # one assignment: a fetch sees the old set or the new one, never a mix
        self.nodes_added += sum(endpoint is None for endpoint in nodes.values())
        self.nodes_removed += len(removed)
        for endpoint in removed:
            self.health.forget(endpoint.base_url)
            self.hedger.latency.forget(endpoint.base_url)
            self.limiters.forget(endpoint.base_url)
            await endpoint.aclose()

    def candidates(self, key: str) -> list[str]:
        """The nodes to ask for ``key``, best first: the first ``replicas`` nodes in
        rendezvous order that are not marked down."""
        return self._candidates(key, self._nodes)

    def _candidates(self, key: str, nodes: dict[str, Endpoint]) -> list[str]:
        up = [url for url in rank(key, list(nodes)) if not self.health.has(url, Reason.DOWN)]
        return up[: self._replicas]

    async def fetch(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> memoryview | None:
        begun = time.perf_counter()
        nodes = self._nodes  # this read's member set, whatever set_urls does meanwhile
        try:
            raw = await self.hedger.run(
                self._candidates(ref.key, nodes),
                partial(self._fetch_from, nodes, ref, decode),
                failover=cache_failover,
                ready=lambda url: nodes[url].has_room,  # a hedge goes only to a node with a free slot
                call=Call(demand, ref.grant),
            )
        except HedgeExhausted:
            self.stats.misses += 1
            return None
        self.stats.hit(ref.raw_length, time.perf_counter() - begun)
        return raw

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """Nothing without a request: ask fetch."""
        return None

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """Nothing to do: the nodes fill themselves when they read a chunk through."""

    async def flush(self) -> None:
        """Nothing deferred."""

    def extra_stats(self) -> dict[str, int | float]:
        hedges = {f"hedge_{name}": value for name, value in self.hedger.stats().items()}
        down = self.health.count(Reason.DOWN)
        counts = {"node_hits": self.node_hits, "node_fills": self.node_fills, "bad_copies_reported": self.bad_copies_reported}
        members = {"nodes": len(self._nodes), "nodes_added": self.nodes_added, "nodes_removed": self.nodes_removed}
        return {**counts, "nodes_down": down, **members, **hedges}

    async def node_stats(self) -> dict[str, object]:
        """Each node's own ``/stats`` (cache occupancy, tenants, jobs), or the error that
        kept it from answering."""
        return dict(zip(self._nodes, await asyncio.gather(*(self._one_node_stats(e) for e in self._nodes.values())), strict=True))

    async def _one_node_stats(self, node: Endpoint) -> object:
        try:
            return msgspec.json.decode(await node.read("GET", "/stats"))
        except BlobError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        except msgspec.DecodeError as exc:
            return {"error": f"malformed /stats answer: {exc}"}

    async def aclose(self) -> None:
        """Close the chunk-read connections (the session belongs to the caller)."""
        for node in self._nodes.values():
            await node.aclose()

    async def _fetch_from(self, nodes: dict[str, Endpoint], ref: ChunkRef, decode: Decoder, url: str, call: Call) -> memoryview:
        """The verified raw bytes from one of ``nodes``; a failure is counted (a node that is
        Unavailable is marked down, if it is still a member) and raised, so the hedger tries
        the next node."""
        node = nodes[url]
        try:
            stored, served_from = await self._get(node, ref, call)
            raw = await decode(ref, stored)
        except BadCopy:
            self.stats.corrupt += 1
            await self._report_bad(node, ref)
            raise
        except Unavailable:
            self.stats.errors += 1
            if self._nodes.get(url) is node:  # a removed node's closed endpoint says nothing of its health
                self.health.mark(url, Reason.DOWN)
            raise
        except BlobError:  # e.g. the node found every L4 copy bad: L4 will say so itself
            self.stats.errors += 1
            raise
        self.health.clear(url, Reason.DOWN)
        self._count_source(served_from)
        return raw

    async def _get(self, node: Endpoint, ref: ChunkRef, call: Call) -> tuple[memoryview, str]:
        """The node's copy of ``ref``'s stored bytes (exactly ``ref.length`` of them), and
        where the node found it."""
        route = f"/v1/chunks/{ref.key}?{chunk_query(ref)}"
        buf = self.buffers.take(ref.length)
        asked = {PROGRESS_HEADER: self._progress_ms, **({GRANT_HEADER: call.grant} if call.grant else {})}
        headers = await node.get_into(route, buf, headers=asked, call=call)
        return buf, headers.get(CACHE_HEADER.lower(), "")

    async def _report_bad(self, node: Endpoint, ref: ChunkRef) -> None:
        """Tell the node its copy of ``ref`` came out bad (a failure to tell it is ignored:
        the read goes on elsewhere either way)."""
        route = f"/v1/chunks/{ref.key}/bad?{chunk_query(ref)}"
        grant = {GRANT_HEADER: ref.grant} if ref.grant else {}
        try:
            await node.read("POST", route, headers={**node.control.headers, **grant})
        except BlobError:
            return
        self.bad_copies_reported += 1

    def _count_source(self, served_from: str) -> None:
        if served_from == "hit":
            self.node_hits += 1
        elif served_from == "miss":
            self.node_fills += 1

    # --- hydrate (deep prefetch into L3) -------------------------------------------------

    async def hydrate(self, refs: Iterable[ChunkRef], pin_seconds: float | None = None) -> list[HydrateJob]:
        """Ask every node that holds each chunk (all ``replicas`` of them, down or not) to
        pull it from L4 and pin it.  One job per node and batch; a request that could not
        be sent comes back as a job with ``error`` set (the other replicas still pull)."""
        requests = [
            (url, HydrateRequest(refs=batch, pin_seconds=pin_seconds))
            for url, group in self._group(refs).items()
            for batch in _batches(group, HYDRATE_BATCH)
        ]
        return list(await asyncio.gather(*(self._post_hydrate(url, body) for url, body in requests)))

    async def hydrate_status(self, job: HydrateJob) -> HydrateStatus:
        """The job's progress from its node (a job that was never sent reports "failed");
        raises the node's error (e.g. Unavailable) if it cannot be asked."""
        if job.job_id is None:
            return HydrateStatus(job_id="", state="failed", total=job.total, failed=job.total, errors=[job.error or ""])
        return await self._node(job.url).call("GET", f"/v1/hydrate/{job.job_id}", None, HydrateStatus)

    async def wait_hydrated(self, jobs: Sequence[HydrateJob], poll_seconds: float = 0.2) -> list[HydrateStatus]:
        """Poll until every job finished; a node that cannot be asked fails its job."""
        statuses = await asyncio.gather(*(self._poll_until_finished(job, poll_seconds) for job in jobs))
        return list(statuses)

    def _group(self, refs: Iterable[ChunkRef]) -> dict[str, list[ChunkRef]]:
        unique = {ref.key: ref for ref in refs}
        groups: dict[str, list[ChunkRef]] = {}
        for key, ref in unique.items():
            for url in rank(key, self.urls)[: self._replicas]:
                groups.setdefault(url, []).append(ref)
        return groups

    async def cancel_hydrate(self, job: HydrateJob) -> HydrateStatus | None:
        """Stop a job on its node (what it stored stays); None if it was never sent.
        Raises the node's error if it cannot be asked."""
        if job.job_id is None:
            return None
        return await self._node(job.url).call("DELETE", f"/v1/hydrate/{job.job_id}", None, HydrateStatus)

    def _node(self, url: str) -> Endpoint:
        """A member's endpoint; Unavailable for a node removed since (a job sent there is lost)."""
        node = self._nodes.get(url)
        if node is None:
            raise Unavailable(f"{url}: no longer one of this client's L3 nodes")
        return node

    async def _post_hydrate(self, url: str, body: HydrateRequest) -> HydrateJob:
        refs = tuple(body.refs)
        try:
            status = await self._node(url).call("POST", "/v1/hydrate", body, HydrateStatus)
        except BlobError as exc:
            return HydrateJob(url, None, refs, f"{url}: {type(exc).__name__}: {exc}")
        return HydrateJob(url, status.job_id, refs)

    async def _poll_until_finished(self, job: HydrateJob, poll_seconds: float) -> HydrateStatus:
        while True:
            try:
                status = await self.hydrate_status(job)
            except BlobError as exc:
                lost = f"{job.url}: {type(exc).__name__}: {exc}"
                return HydrateStatus(job_id=job.job_id or "", state="failed", total=job.total, errors=[lost])
            if status.finished:
                return status
            await asyncio.sleep(poll_seconds)


def _batches(refs: list[ChunkRef], size: int) -> Iterable[list[ChunkRef]]:
    return (refs[i : i + size] for i in range(0, len(refs), size))
