"""L3 regional flash node: a disk cache of chunks in front of L4, shared by a region's clients.

Routes (chunk bytes travel raw in their stored form, maybe lz4: the client verifies them)::

    GET    /v1/chunks/{key}?<ChunkRef>  the chunk; X-Blobsdk-Cache: hit (flash) or miss (L4)
           [X-Blobsdk-Progress: MS]     and an interim 102 Processing every MS ms meanwhile
    POST   /v1/chunks/{key}/bad?<ChunkRef>   a client got a bad copy: verify ours again,
                                        drop it if damaged -> JSON {"dropped": bool}
                                        (collapsed per chunk, rate-limited per tenant: 429
                                        past it; servers/flashreports.py)
    PUT    /v1/chunks/{key}?<ChunkRef>[&pin_seconds=S]   body = stored bytes; 201 stored
    POST   /v1/hydrate                  HydrateRequest (msgpack or JSON) -> 202 HydrateStatus
    GET    /v1/hydrate/{job_id}         HydrateStatus;  DELETE cancels the job
    GET    /stats                       JSON: cache, tenants' usage, request counters, L4, jobs

``<ChunkRef>`` is the ChunkRef as query parameters (blobsdk.wire.chunk_query); ``key``
must be its chunk key, else 400.

Read-through: a miss reads the L4 replicas in order (blobsdk/tail/replicaread.py, the
client's L4 tier's engine too), verifies each copy (decode + xxh3-64),
stores the first good one for the requesting tenant and serves it; one load per chunk key is
in flight (single-flight: the fill is charged to the tenant that asked first).  A hit is read
and verified (xxh3-64) on its first read since the fill or the node's start; later hits of
that same file are sent with ``sendfile``, unread and unhashed (servers/flashsend.py: why, and
how a file that rots later is caught by the client and dropped).  No good copy
is 502 ``corrupt_data`` (404 if the block is gone, 503 if L4 is down) and nothing is stored.
A fill the cache refuses (full, chunk larger than the capacity, over the requester's quota:
counted as ``quota_rejections``) still serves the bytes.  A GET with ``X-Blobsdk-Progress:
MS`` gets ``102 Processing`` every MS ms until its answer (servers/_common/http.py
``with_progress``): a read-through queued behind a busy L4 is then not taken for a hung node
by the client's hedger, which would read the chunk from L4 itself, a second time.

Tenants (``--keys``; servers/_common/auth.py): a request's tenant is the one its signed
token names; ``--token`` is a static admin token (tenant "default"); with neither,
everything is tenant "default" and no token is needed.  A bad token is 401.  With a keyring,
a tenant's GET, PUT and hydrate need, for each chunk, the grant the metadata API gave that
tenant for the chunk's byte range (else 403 ``forbidden``), so a tenant reads only chunks of
its own buckets; the cache key covers the chunk's checksum, so bytes a tenant PUTs can be
found only under the key of a chunk they verify against.  ``--quota TENANT:MiB`` bounds what
a tenant's fills and PUTs may hold.  An explicit write over the tenant's quota (PUT, hydrate)
is 429 ``quota_exceeded`` for that tenant only, and changes nothing (another tenant's copy of
the chunk stays); a PUT body that does not match its ChunkRef
is 422 ``corrupt_data``; a chunk the cache cannot admit is 507 ``insufficient_storage``.
``/stats`` shows a tenant its own usage and quota only (an admin sees everything).
With a keyring, tenants share the node's request slots (``--tenant-slots``;
servers/_common/admission.py): a tenant's flood of hits queues behind its own requests, not
in front of another tenant's, and a read-through gives its slot back while it waits on L4.

Hydrate jobs (servers/hydrate.py) pull their chunks from L4 in the background
(``hydrate_concurrency`` chunks at a time across all jobs), verify, store and pin them
(``pin_seconds``) for the tenant; a job ends "done" if every chunk is stored, else "failed".
The last ``max_jobs`` jobs are kept for status queries.  Jobs and loads are owned tasks: app
cleanup cancels and awaits them.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from functools import partial

from aiohttp import web

from blobsdk.cache import DiskCache, validate_key
from blobsdk.chunks import ChunkDecoder
from blobsdk.config import Timeouts, s3_location
from blobsdk.errors import BadCopy, BadRequest, BadUpload, InsufficientStorage, QuotaExceeded
from blobsdk.net import LimiterRegistry, limits_of_args, new_session, progress_every
from blobsdk.runtime import SingleFlight
from blobsdk.sources import BlockStore, Buffer, HttpBlockStore, ReplicatedBlockStore
from blobsdk.tail import ReplicaReader
from blobsdk.wire import CACHE_HEADER, ChunkRef, ref_from_query

from ._common.admission import TenantGate, install_gate, stepped_out
from ._common.auth import ServerAuth, check_grant, claims_of
from ._common.faults import FAULTS_ENV, FaultConfig, config_of_args, fault_extensions
from ._common.http import (
    METRICS_KEY,
    auth_of_args,
    base_app,
    read_piece,
    send_bytes,
    serve,
    with_progress,
)
from ._common.logs import setup_logging
from .flashconfig import FlashConfig, config_of, flags
from .flashmetrics import export
from .flashreports import BadCopyReports
from .flashsend import send_verified
from .hydrate import Hydrator, Job

OCTETS = "application/octet-stream"


@dataclass
class Counters:
    """What the node did, for /stats and /metrics."""

    hits: int = 0  # GETs served from flash
    misses: int = 0  # GETs read through from L4
    fills: int = 0  # read-through copies stored
    fills_refused: int = 0  # read-through copies the cache did not admit
    quota_rejections: int = 0  # read-through copies over the requester's quota (served, not stored)
    puts: int = 0  # chunks stored by PUT


class FlashNode:
    """The route handlers over one DiskCache and the L4 replicas behind it.  Its resources
    open in :meth:`open` (app start-up) and close with the stack given there."""

    cache: DiskCache
    l4: ReplicaReader  # the read-through from L4

    def __init__(self, config: FlashConfig, *, blocks: BlockStore | None = None, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.counters = Counters()
        self._given_blocks = blocks
        self._clock = clock
        self._loads: SingleFlight[tuple[Buffer, bool]] = SingleFlight()
        self._verify = ChunkDecoder()
        self.hydrator = Hydrator(self._hydrate_chunk, self._check_size, config)
        self._limiters = LimiterRegistry()  # one per block server: reads wait for it, hedges look at it
        self.gate: TenantGate | None = None  # tenants' request slots (make_app installs it with a keyring)
        self.reports = BadCopyReports(config, clock=clock)

    async def open(self, stack: AsyncExitStack) -> None:
        self.l4 = ReplicaReader(self._given_blocks or await self._open_blocks(stack), limiters=self._limiters)
        c = self.config
        self.cache = await stack.enter_async_context(
            DiskCache(
                c.dir,
                capacity_bytes=c.capacity_bytes,
                min_free_ratio=c.min_free_ratio,
                ttl_seconds=c.ttl_seconds,
                hold_seconds=c.hold_seconds,
                quotas=c.quotas,
                threads=c.threads,
                name="l3",
                clock=self._clock,
                remember_verified=True,
            )
        )
        stack.push_async_callback(self._stop_tasks)  # first out: no task may outlive the cache

    async def _open_blocks(self, stack: AsyncExitStack) -> BlockStore:
        limiters = self._limiters
        if self.config.source_url is not None:
            from blobsdk.sources import S3BlockStore

            bucket, prefix = s3_location(self.config.source_url)
            s3 = self.config.s3
            store = S3BlockStore(
                bucket,
                prefix,
                config=s3.options(),
                allow_http=s3.allow_http,
                limiter=limiters.get(self.config.source_url, by_latency=False),
            )
            return await stack.enter_async_context(store)
        session = await stack.enter_async_context(new_session(Timeouts()))
        stores = [
            HttpBlockStore(session, url, self.config.block_token, limiter=limiters.get(url)) for url in self.config.block_urls
        ]
        blocks = ReplicatedBlockStore(stores)
        stack.push_async_callback(blocks.aclose)
        return blocks

    async def _stop_tasks(self) -> None:
        await self.hydrator.aclose()
        await self.reports.aclose()
        await self._loads.aclose()

    # --- chunks ---------------------------------------------------------------------------

    async def get_chunk(self, request: web.Request) -> web.StreamResponse:
        ref = self._ref_of(request)
        tenant = check_grant(request, ref.block_id, ref.offset, ref.length).tenant
        progress_every(request)  # a malformed ask is refused on a hit too
        sent = await send_verified(self.cache, request, ref)
        if sent is not None:
            self.counters.hits += 1
            return sent
        async with stepped_out(request):  # a read-through waits on L4: its slot is another request's meanwhile
            data, hit = await with_progress(request, partial(self.load, ref, tenant))
        if hit:
            self.counters.hits += 1
        else:
            self.counters.misses += 1
        return await send_bytes(request, data, content_type=OCTETS, headers={CACHE_HEADER: "hit" if hit else "miss"})

    async def bad_copy(self, request: web.Request) -> web.Response:
        """A client found the copy it got bad: verify ours again, dropped if damaged
        (collapsed per chunk, rate-limited per tenant: servers/flashreports.py)."""
        ref = self._ref_of(request)
        tenant = check_grant(request, ref.block_id, ref.offset, ref.length).tenant
        return web.json_response({"dropped": await self.reports.report(self.cache, ref.key, tenant)})

    async def put_chunk(self, request: web.Request) -> web.Response:
        ref = self._ref_of(request)
        tenant = check_grant(request, ref.block_id, ref.offset, ref.length).tenant
        pin_seconds = _seconds(request.query.get("pin_seconds", "0"))
        data = await _read_exact_body(request, ref.length)
        try:
            await self._verify(ref, memoryview(data))
        except BadCopy as exc:
            raise BadUpload(f"body does not match its chunk reference: {exc}") from exc
        await self._store(ref, data, tenant, pin_seconds)
        self.counters.puts += 1
        return web.Response(status=201)

    async def load(self, ref: ChunkRef, tenant: str, pin_seconds: float = 0.0) -> tuple[Buffer, bool]:
        """The chunk's stored bytes and whether they came from flash; one load per key in
        flight, shared by whoever waits for it (blobsdk.runtime.singleflight's rule: the load is
        cancelled when the last of them leaves)."""
        loaded, _ = await self._loads.run(ref.key, lambda: self._load(ref, tenant, pin_seconds))
        return loaded

    async def _load(self, ref: ChunkRef, tenant: str, pin_seconds: float) -> tuple[Buffer, bool]:
        data = await self.cache.get(ref.key, length=ref.length)
        if data is not None:
            return data, True
        buf, _ = await self.l4.read(ref, self._verify)
        await self._fill(ref, buf, tenant, pin_seconds)
        return buf, False

    async def _fill(self, ref: ChunkRef, data: Buffer, tenant: str, pin_seconds: float) -> None:
        """Store a read-through copy if the cache admits it: a refusal is only counted."""
        try:
            stored = await self.cache.put(ref.key, data, tenant=tenant, pin_seconds=pin_seconds)
        except QuotaExceeded:
            self.counters.quota_rejections += 1
            return
        if stored:
            self.counters.fills += 1
        else:
            self.counters.fills_refused += 1

    async def _store(self, ref: ChunkRef, data: Buffer, tenant: str, pin_seconds: float) -> None:
        """Store explicitly: QuotaExceeded (429) or InsufficientStorage (507) if it cannot be."""
        if not await self.cache.put(ref.key, data, tenant=tenant, pin_seconds=pin_seconds):
            raise InsufficientStorage(f"chunk {ref.key} ({len(data)} bytes) was not admitted: cache full or too small")

    def _ref_of(self, request: web.Request) -> ChunkRef:
        key = validate_key(request.match_info["key"])
        ref = ref_from_query(request.query)
        if ref.key != key:
            raise BadRequest(f"chunk key {key} is not the key of {ref} ({ref.key})")
        return self._check_size(ref)

    def _check_size(self, ref: ChunkRef) -> ChunkRef:
        if ref.length > self.config.max_chunk_bytes:
            raise BadRequest(f"chunk of {ref.length} bytes exceeds this node's limit of {self.config.max_chunk_bytes}")
        return ref

    # --- hydrate (the jobs: servers/hydrate.py) ---------------------------------------------

    def job(self, job_id: str) -> Job | None:
        """A running or recently finished hydrate job."""
        return self.hydrator.job(job_id)

    def running_jobs(self) -> int:
        return self.hydrator.running_jobs()

    async def _hydrate_chunk(self, ref: ChunkRef, tenant: str, pin_seconds: float) -> int:
        """Make sure the chunk is stored and pinned; its stored size."""
        if self.cache.pin(ref.key, pin_seconds):
            return ref.length
        data, _ = await self.load(ref, tenant, pin_seconds)
        if not self.cache.pin(ref.key, pin_seconds):  # not stored by the load: try for this tenant
            await self._store(ref, data, tenant, pin_seconds)
        return ref.length

    # --- observability --------------------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        """Everything for an admin (or when the node has no auth); a tenant sees only its
        own usage and quota."""
        claims = claims_of(request)
        if claims.admin:
            return web.json_response(self.snapshot())
        tenant = claims.tenant
        usage = self.cache.tenant_usage().get(tenant, 0)
        quota = self.config.quotas.get(tenant)
        return web.json_response({"tenant": tenant, "tenants": {tenant: usage}, "quota_bytes": quota})

    def snapshot(self) -> dict[str, object]:
        return {
            "cache": self.cache.stats(),
            "tenants": self.cache.tenant_usage(),
            "requests": asdict(self.counters),
            "reports": asdict(self.reports.counters),
            "l4": self.l4.stats.as_dict(),
            "jobs": {"running": self.running_jobs(), "kept": self.hydrator.kept_jobs()},
            **({"admission": self.gate.stats()} if self.gate is not None else {}),
        }


FLASH_NODE = web.AppKey("flash_node", FlashNode)


async def _read_exact_body(request: web.Request, length: int) -> bytearray:
    """The request body, which must be exactly ``length`` bytes (BadRequest otherwise)."""
    if request.content_length is not None and request.content_length != length:
        raise BadRequest(f"body of {request.content_length} bytes, the chunk reference says {length}")
    body = bytearray()
    while piece := await read_piece(request, length + 1 - len(body)):
        body += piece
        if len(body) > length:
            break
    if len(body) != length:
        raise BadRequest(f"body of {'more than ' if len(body) > length else ''}{len(body)} bytes, expected {length}")
    return body


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"pin_seconds must be a number, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise BadRequest(f"pin_seconds must be >= 0, got {raw!r}")
    return value


def make_app(
    config: FlashConfig,
    *,
    auth: ServerAuth | None = None,
    blocks: BlockStore | None = None,
    clock: Callable[[], float] = time.monotonic,
    faults: FaultConfig | None = None,
    admin_token: str | None = None,
) -> web.Application:
    """The flash node for ``config``; ``auth``: who may do what (default: anyone anything).
    ``blocks`` replaces the L4 replicas named by
    ``config.block_urls`` (the caller keeps and closes it); ``clock`` drives the cache's TTL,
    hold and pins (tests); ``faults`` and ``admin_token``: see servers/_common/faults.py."""
    node = FlashNode(config, blocks=blocks, clock=clock)
    app = base_app("blobsdk_flash", auth, extensions=fault_extensions(faults, admin_token))
    app[FLASH_NODE] = node
    node.gate = install_gate(app, config.tenant_slots, clock=clock)
    _install(app, node)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await node.open(stack)
            yield

    app.cleanup_ctx.append(lifecycle)
    return app


def _install(app: web.Application, node: FlashNode) -> None:
    app.router.add_get("/v1/chunks/{key}", node.get_chunk, allow_head=False)
    app.router.add_put("/v1/chunks/{key}", node.put_chunk)
    app.router.add_post("/v1/chunks/{key}/bad", node.bad_copy)
    hydrator = node.hydrator
    app.router.add_post("/v1/hydrate", hydrator.post_hydrate)
    app.router.add_get("/v1/hydrate/{job_id}", hydrator.get_hydrate, allow_head=False)
    app.router.add_delete("/v1/hydrate/{job_id}", hydrator.cancel_hydrate)
    app.router.add_get("/stats", node.stats, allow_head=False)
    export(app[METRICS_KEY], node)


# --- command line ---------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = flags()
    args = parser.parse_args(argv)
    try:
        config = config_of(args)
        faults = config_of_args(args, os.environ.get(FAULTS_ENV))
        auth = auth_of_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    setup_logging("flash", args.log_level)  # once the flags are good: a refused start changes nothing
    app = make_app(config, auth=auth, faults=faults, admin_token=args.admin_token)
    serve(app, args.host, args.port, args.port_file, limits_of_args(args))


if __name__ == "__main__":
    main()
