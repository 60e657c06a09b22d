"""L3: the regional flash nodes (``servers/flash.py``), seen from the client.

Each chunk lives on ``replicas`` nodes chosen by rendezvous hashing of its chunk key over
the node URLs (:mod:`blobsdk.placement`).  A node that misses reads the chunk through from
L4 itself, so a GET answers with the chunk's stored bytes either way; the client verifies
every copy (``decode``) and tries the next node on a bad or failed one.  L3 is a cache: it
never raises to the reader, it misses (None) and the read falls through to L4.

A node that fails with Unavailable (refused, timed out, 5xx) is marked down and skipped for
``down_seconds``; while it is down its keys go to the next nodes in rendezvous order, as if
it had been removed.

Wire, shared with ``servers/flash.py`` (these structs may move to ``blobsdk/wire.py``)::

    GET    /v1/chunks/{key}?<chunk query>   stored bytes; X-Blobsdk-Cache: hit | miss
    PUT    /v1/chunks/{key}?<chunk query>[&pin_seconds=S]   body = stored bytes; 201
    POST   /v1/hydrate      HydrateRequest -> 202 HydrateStatus (pull chunks from L4, pinned)
    GET    /v1/hydrate/{id} HydrateStatus;  DELETE cancels the job

The chunk query is the ChunkRef as query parameters (:func:`chunk_query`); ``key`` must be
its chunk key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal
from urllib.parse import urlencode

import aiohttp
import msgspec

from .._http import HttpEndpoint
from .._rawget import RawGetEndpoint
from ..errors import BadRequest, BlobError, Unavailable
from ..hedge import HedgeConfig, HedgeExhausted, Hedger
from ..limiter import LimiterRegistry
from ..placement import rank
from ..sources.base import validate_block_id
from ..stats import TierStats
from ..wire import ChunkRef
from .base import BadCopy, Decoder

CACHE_HEADER = "X-Blobsdk-Cache"  # "hit": served from the node's flash; "miss": read through L4
HYDRATE_BATCH = 10_000  # refs per hydrate request (keeps bodies far below the size bound)
_REF_FIELDS = ("block_id", "offset", "length", "raw_length", "checksum", "codec")
_UINT64 = 1 << 64

JobState = Literal["running", "done", "failed", "cancelled"]


class HydrateRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Pull these chunks from L4 into the node and pin them (None: the node's default)."""

    refs: list[ChunkRef]
    pin_seconds: float | None = None


class HydrateStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Progress of one hydrate job: ``done`` chunks are stored and pinned, ``failed`` ones
    are not; the job ends "done" when none failed, else "failed" (or "cancelled")."""

    job_id: str
    state: JobState
    total: int
    done: int = 0
    failed: int = 0
    bytes: int = 0
    errors: list[str] = []  # the first few failures

    @property
    def finished(self) -> bool:
        return self.state != "running"


@dataclass(frozen=True)
class HydrateJob:
    """A hydrate request sent to one node: its job id, or why it could not be sent."""

    url: str
    job_id: str | None
    total: int
    error: str | None = None


def chunk_query(ref: ChunkRef) -> str:
    """``ref`` as URL query parameters."""
    return urlencode({name: getattr(ref, name) for name in _REF_FIELDS})


def ref_from_query(query: Mapping[str, str]) -> ChunkRef:
    """The ChunkRef named by query parameters; BadRequest if any is missing or invalid."""
    try:
        ref = msgspec.convert({k: query[k] for k in _REF_FIELDS if k in query}, ChunkRef, strict=False)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid chunk reference: {exc}") from exc
    return validate_ref(ref)


def validate_ref(ref: ChunkRef) -> ChunkRef:
    validate_block_id(ref.block_id)
    if min(ref.offset, ref.length, ref.raw_length) < 0 or not 0 <= ref.checksum < _UINT64:
        raise BadRequest(f"invalid chunk reference {ref}: negative span or checksum out of range")
    return ref


class L3Tier:
    """The Tier over a set of L3 flash nodes, using (never closing) the caller's session.

    ``token`` is the bearer token the nodes want (it names the tenant); ``timeout`` bounds
    each request to a node (default: the session's).  Besides ``stats`` it counts
    ``node_hits`` (served from a node's flash) and ``node_fills`` (read through L4 by the
    node), see :meth:`extra_stats`.
    """

    name = "l3"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Sequence[str],
        *,
        token: str | None = None,
        replicas: int = 2,
        down_seconds: float = 5.0,
        timeout: aiohttp.ClientTimeout | None = None,
        clock: Callable[[], float] = time.monotonic,
        hedge: HedgeConfig | None = None,
        limiters: LimiterRegistry | None = None,
    ) -> None:
        if replicas < 1 or down_seconds < 0:
            raise ValueError(f"replicas must be >= 1 and down_seconds >= 0, got {replicas} and {down_seconds}")
        self.stats = TierStats()
        self.node_hits = 0
        self.node_fills = 0
        self._nodes = {e.base_url: e for e in (HttpEndpoint(session, url, token) for url in urls)}
        read_timeout = timeout if timeout is not None else session.timeout
        self._reads = {url: RawGetEndpoint(url, token, timeout=read_timeout) for url in self._nodes}
        self._replicas = replicas
        self._down_seconds = down_seconds
        self._request_args = {} if timeout is None else {"timeout": timeout}
        self._clock = clock
        self._down_until: dict[str, float] = {}
        self.hedger = Hedger(hedge)
        self.limiters = limiters if limiters is not None else LimiterRegistry()

    @property
    def urls(self) -> list[str]:
        return list(self._nodes)

    def candidates(self, key: str) -> list[str]:
        """The nodes to ask for ``key``, best first: the first ``replicas`` nodes in
        rendezvous order that are not marked down."""
        now = self._clock()
        up = [url for url in rank(key, self.urls) if self._down_until.get(url, 0.0) <= now]
        return up[: self._replicas]

    async def fetch(self, ref: ChunkRef, decode: Decoder) -> memoryview | None:
        begun = time.perf_counter()
        try:
            raw = await self.hedger.run(
                self.candidates(ref.key), partial(self._fetch_from, ref, decode), failover=_is_blob_error,
                ready=self.limiters.has_room,
            )
        except HedgeExhausted:
            self.stats.misses += 1
            return None
        self.stats.hit(ref.raw_length, time.perf_counter() - begun)
        return raw

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """Nothing to do: the nodes fill themselves when they read a chunk through."""

    async def flush(self) -> None:
        """Nothing deferred."""

    def extra_stats(self) -> dict[str, int | float]:
        now = self._clock()
        down = sum(until > now for until in self._down_until.values())
        hedges = {f"hedge_{name}": value for name, value in self.hedger.stats().items()}
        return {"node_hits": self.node_hits, "node_fills": self.node_fills, "nodes_down": down, **hedges}

    async def node_stats(self) -> dict[str, object]:
        """Each node's own ``/stats`` (cache occupancy, tenants, jobs), or the error that
        kept it from answering."""
        return dict(zip(self._nodes, await asyncio.gather(*(self._one_node_stats(e) for e in self._nodes.values()))))

    async def _one_node_stats(self, node: HttpEndpoint) -> object:
        try:
            async with node.request("GET", "/stats", **self._request_args) as resp:
                return msgspec.json.decode(await resp.read())
        except BlobError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    async def aclose(self) -> None:
        """Close the chunk-read connections (the session belongs to the caller)."""
        for endpoint in self._reads.values():
            await endpoint.aclose()

    async def _fetch_from(self, ref: ChunkRef, decode: Decoder, url: str) -> memoryview:
        """The verified raw bytes from one node; a failure is counted (a node that is
        Unavailable is marked down) and raised, so the hedger tries the next node."""
        try:
            stored, served_from = await self._get(url, ref)
            raw = await decode(ref, stored)
        except BadCopy:
            self.stats.corrupt += 1
            raise
        except Unavailable:
            self.stats.errors += 1
            self._down_until[url] = self._clock() + self._down_seconds
            raise
        except BlobError:  # e.g. the node found every L4 copy bad: L4 will say so itself
            self.stats.errors += 1
            raise
        self._down_until.pop(url, None)
        self._count_source(served_from)
        return raw

    async def _get(self, url: str, ref: ChunkRef) -> tuple[memoryview, str]:
        """The node's copy of ``ref``'s stored bytes (exactly ``ref.length`` of them), and
        where the node found it."""
        route = f"/v1/chunks/{ref.key}?{chunk_query(ref)}"
        buf = memoryview(bytearray(ref.length))
        headers = await self._reads[url].get_into(route, buf, limiter=self.limiters.get(url))
        return buf, headers.get(CACHE_HEADER.lower(), "")

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
        return await self._nodes[job.url].call("GET", f"/v1/hydrate/{job.job_id}", None, HydrateStatus)

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

    async def _post_hydrate(self, url: str, body: HydrateRequest) -> HydrateJob:
        try:
            status = await self._nodes[url].call("POST", "/v1/hydrate", body, HydrateStatus)
        except BlobError as exc:
            return HydrateJob(url, None, len(body.refs), f"{url}: {type(exc).__name__}: {exc}")
        return HydrateJob(url, status.job_id, status.total)

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


def _is_blob_error(exc: BaseException) -> bool:
    """L3 is a cache: any failure of a node is a miss there, never an error to the reader."""
    return isinstance(exc, BlobError)


def _batches(refs: list[ChunkRef], size: int) -> Iterable[list[ChunkRef]]:
    return (refs[i : i + size] for i in range(0, len(refs), size))
