"""Metadata API server: getReadPlan, commit, delete, list and scan over a MetadataStore.

Routes (msgpack bodies; JSON with ``Content-Type: application/json``):

    POST /v1/plans   GetPlansRequest -> GetPlansResponse   (at most 1000 paths)
    POST /v1/commit  CommitRequest   -> CommitResponse     (at most 1000 ops, atomic)
    POST /v1/delete  DeleteRequest   -> DeleteResponse
    POST /v1/list    ListRequest     -> ListResponse
    POST /v1/scan    ScanRequest     -> ScanResponse
    POST /v1/naming  NamingRequest   -> ScanResponse       (the plans naming some blocks)
    GET  /v1/stat?path=...           -> BlobInfo
    GET  /healthz, /metrics

Tenancy (``--keys``; servers/_common/auth.py): a tenant's token names the buckets it may
use, and its requests take a fair share of the server's request slots (``--tenant-slots``;
servers/_common/admission.py), so that one tenant's flood of lookups waits behind its own
requests, not in front of another tenant's.  Every path of a request must be in one of them (else 403 ``forbidden``; a listing
prefix must lie inside one, and ``/`` does not); ``scan``, ``naming`` and ``fences`` are for admins.  Each plan answered
to a tenant (plans, commit) carries a chunk grant per chunk for that tenant, valid for
``--grant-ttl`` seconds or until the token expires if sooner, which the block servers and L3
nodes want before they serve the chunk's bytes.  Grants are never stored.

The reserved namespace ``/{bucket}/.blobsdk/`` (blobsdk/chunks/names.py): the store refuses every
tenant's (and an admin's) commit or delete of kind ``"blob"`` there (400 ``invalid_path``),
and takes kind ``"index"`` only in the shape of a chunk index entry (blobsdk/metadata/base.py).
A tenant may make index commits in its buckets (its saves record their chunks): the store
cannot know the bytes an entry names, so a save checks an entry before it reuses it and a
restore checks every chunk (blobsdk/write/dedup.py).

Run: ``python -m servers.api --db meta.sqlite [--host H] [--port P] [--token T] [--keys FILE]``, or
``--metadata redis://HOST:PORT/DB`` in place of ``--db`` (blobsdk/metadata/_redis.py: Redis or Redis Cluster).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import msgspec
from aiohttp import web

from blobsdk.auth import GRANT_TTL_S, Claims
from blobsdk.chunks import bucket_of, validate_hex32, validate_prefix
from blobsdk.cli import ArgumentParser
from blobsdk.errors import BadRequest, BlobError, Forbidden
from blobsdk.metadata import MetadataStore, RetryAwareStore
from blobsdk.net import limits_of_args
from blobsdk.wire import (
    MAX_OPS_PER_REQUEST,
    MAX_PATHS_PER_REQUEST,
    CommitRequest,
    CommitResponse,
    DeleteRequest,
    DeleteResponse,
    FenceRequest,
    FenceResponse,
    GetPlansRequest,
    GetPlansResponse,
    ListRequest,
    ListResponse,
    NamingRequest,
    ReadPlan,
    ScanRequest,
    ScanResponse,
)

from ._common import prog
from ._common.admission import holds_slot, install_gate, next_turn
from ._common.auth import AUTH_KEY, ServerAuth, claims_of, require_admin
from ._common.faults import FAULTS_ENV, FaultConfig, config_of_args, fault_extensions
from ._common.http import Handler, add_serve_args, auth_of_args, base_app, positive, read_body, reply, serve
from ._common.logs import setup_logging
from ._common.stores import metadata_store_of

TENANT_SLOTS = 2  # one SQLite thread, one loop: more at once adds no throughput, only waiting
PLAN_UNIT = 100  # paths looked up and signed in one turn of a request's slot (~0.6 ms of signing)


def make_app(
    store: MetadataStore,
    auth: ServerAuth | None = None,
    *,
    grant_ttl: float = GRANT_TTL_S,
    faults: FaultConfig | None = None,
    admin_token: str | None = None,
    tenant_slots: int = TENANT_SLOTS,
) -> web.Application:
    """The API app over ``store``.  The app owns the store: it is closed on app cleanup.
    ``auth``: who may do what (default: anyone anything); ``grant_ttl``: how long a chunk
    grant lasts.  ``faults`` and ``admin_token``: see servers/_common/faults.py.
    ``tenant_slots``: the requests a tenant may run at once, shared by the tenants present
    (with a keyring; servers/_common/admission.py)."""
    if not 0 < grant_ttl < float("inf"):
        raise ValueError(f"grant_ttl must be a positive number of seconds, got {grant_ttl}")
    app = base_app("blobsdk_api", auth, extensions=fault_extensions(faults, admin_token))
    install_gate(app, tenant_slots)
    app.middlewares.append(_value_errors_as_bad_request)
    api = _Api(store, _Granter(app[AUTH_KEY], grant_ttl))
    app.router.add_post("/v1/plans", api.plans)
    app.router.add_post("/v1/commit", api.commit)
    app.router.add_post("/v1/delete", api.delete)
    app.router.add_post("/v1/list", api.list)
    app.router.add_post("/v1/scan", api.scan)
    app.router.add_post("/v1/naming", api.naming)
    app.router.add_post("/v1/fences", api.fences)
    app.router.add_get("/v1/stat", api.stat)
    app.cleanup_ctx.append(api.lifetime)
    return app


class _Granter:
    """Adds a tenant's chunk grants to the plans it is answered (none for an admin, who
    needs none, nor on a server without a keyring)."""

    def __init__(self, auth: ServerAuth, ttl: float, clock: Callable[[], float] | None = None) -> None:
        self.keyring, self.ttl = auth.keyring, ttl
        self.clock = auth.clock if clock is None else clock

    def signed(self, plans: Iterable[ReadPlan | None], claims: Claims) -> list[ReadPlan | None]:
        if self.keyring is None or claims.admin:
            return list(plans)
        expires = min(int(self.clock() + self.ttl), claims.expires)
        return [None if plan is None else self._signed(plan, claims.tenant, expires) for plan in plans]

    def _signed(self, plan: ReadPlan, tenant: str, expires: int) -> ReadPlan:
        assert self.keyring is not None
        sign = self.keyring.sign_grant
        chunks = tuple(
            msgspec.structs.replace(c, grant=sign(tenant, c.block_id, c.offset, c.length, expires)) for c in plan.chunks
        )
        return msgspec.structs.replace(plan, chunks=chunks, grants_expire=expires)


class _Api:
    """The route handlers, bound to one store."""

    def __init__(self, store: MetadataStore, granter: _Granter) -> None:
        self.store = store
        self.granter = granter

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.store.aclose()

    async def plans(self, request: web.Request) -> web.Response:
        """The plans of up to 1000 paths; a tenant's are looked up and signed ``PLAN_UNIT`` at
        a time, its other requests taking their turns between (servers/_common/admission.py)."""
        body = await read_body(request, GetPlansRequest)
        _check_count("paths", body.paths, MAX_PATHS_PER_REQUEST)
        claims = _allowed(request, body.paths)
        plans: list[ReadPlan | None] = []
        unit = PLAN_UNIT if holds_slot(request) else max(1, len(body.paths))  # no tenants: one lookup, as ever
        for start in range(0, len(body.paths), unit):
            if start:
                await next_turn(request)
            plans += self.granter.signed(await self.store.get_plans(body.paths[start : start + unit]), claims)
        return reply(request, GetPlansResponse(plans=plans))

    async def commit(self, request: web.Request) -> web.Response:
        body = await read_body(request, CommitRequest)
        _check_count("ops", body.ops, MAX_OPS_PER_REQUEST)
        claims = _allowed(request, [op.path for op in body.ops])
        ops = [msgspec.structs.replace(op, plan=op.plan.unsigned()) for op in body.ops]  # grants are never stored
        if body.request_id is None:
            done = await self.store.commit_many(ops)
        else:
            done = await _retry_aware(self.store).commit_once(ops, validate_hex32(body.request_id, "request_id"))
        committed = self.granter.signed(done, claims)
        return reply(request, CommitResponse(plans=[p for p in committed if p is not None]))

    async def delete(self, request: web.Request) -> web.Response:
        body = await read_body(request, DeleteRequest)
        _allowed(request, [body.path])
        if body.request_id is None:
            deleted = await self.store.delete(body.path, body.if_version, kind=body.kind)
        else:
            request_id = validate_hex32(body.request_id, "request_id")
            deleted = await _retry_aware(self.store).delete_once(body.path, body.if_version, body.kind, request_id)
        return reply(request, DeleteResponse(deleted=deleted))

    async def list(self, request: web.Request) -> web.Response:
        body = await read_body(request, ListRequest)
        claims = _allowed_prefix(request, body.prefix)
        items, cursor = await self.store.list_page(body.prefix, body.start_after, body.limit)
        if not claims.all_buckets:  # "/a" also matches "/ab/...": keep the allowed buckets
            items = [info for info in items if claims.allows(bucket_of(info.path))]
        return reply(request, ListResponse(items=items, next_start_after=cursor))

    async def scan(self, request: web.Request) -> web.Response:
        require_admin(request)
        body = await read_body(request, ScanRequest)
        plans, cursor = await self.store.scan_page(body.start_after, body.limit)
        return reply(request, ScanResponse(plans=plans, next_start_after=cursor))

    async def naming(self, request: web.Request) -> web.Response:
        require_admin(request)  # the plans of every tenant
        body = await read_body(request, NamingRequest)
        plans, cursor = await self.store.naming_page(body.block_ids, body.start_after, body.limit)
        return reply(request, ScanResponse(plans=plans, next_start_after=cursor))

    async def fences(self, request: web.Request) -> web.Response:
        """gc's fences (admin only: a fence refuses every tenant's commits naming the block)."""
        require_admin(request)
        body = await read_body(request, FenceRequest)
        if body.action == "prune":
            return reply(request, FenceResponse(pruned=await self.store.prune_fences(body.older_than)))
        if body.action == "add":
            await self.store.fence_blocks(body.block_ids)
        else:
            await self.store.unfence_blocks(body.block_ids)
        return reply(request, FenceResponse())

    async def stat(self, request: web.Request) -> web.Response:
        path = request.query.get("path")
        if path is None:
            raise BadRequest("missing query parameter 'path'")
        _allowed(request, [path])
        return reply(request, (await self.store.get_plan(path)).info())


def _allowed(request: web.Request, paths: Iterable[str]) -> Claims:
    """The caller's claims, if they allow the bucket of every path (bad paths are left for
    the store to refuse with its own error)."""
    claims = claims_of(request)
    if claims.all_buckets:
        return claims
    for path in paths:
        if isinstance(path, str) and path.startswith("/") and not claims.allows(bucket := bucket_of(path)):
            raise Forbidden(f"tenant {claims.tenant!r} may not use bucket {bucket!r}")
    return claims


def _allowed_prefix(request: web.Request, prefix: str) -> Claims:
    claims = claims_of(request)
    if claims.all_buckets:
        return claims
    if validate_prefix(prefix) == "/":
        raise Forbidden(f"tenant {claims.tenant!r} may list only inside its buckets, not '/'")
    _allowed(request, [prefix])
    return claims


def _retry_aware(store: MetadataStore) -> RetryAwareStore:
    """``store``, if it can apply a write once per request id (a client with several
    api_urls sends one with every write, so that it may retry elsewhere)."""
    if not isinstance(store, RetryAwareStore):
        raise BadRequest(
            "this API server's metadata store cannot recognise a retried write (request_id): "
            "a client with several api_urls needs API servers over Redis (--metadata redis://...)"
        )
    return store


def _check_count(name: str, items: Sequence[object], limit: int) -> None:
    if len(items) > limit:
        raise BadRequest(f"{len(items)} {name} in one request; the limit is {limit}")


@web.middleware
async def _value_errors_as_bad_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stores raise plain ValueError for bad arguments (limit, if_version, cursor); coming
    from a client, those are bad requests, not server errors."""
    try:
        return await handler(request)
    except BlobError:
        raise
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=prog(f"{__package__}.api"), description="blobsdk metadata API server.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="SQLite database file (created if missing)")
    where.add_argument(
        "--metadata",
        metavar="URL",
        help=(
            "redis://HOST:PORT/DB: the metadata in Redis (or a Redis Cluster); "
            "redis+sentinel://HOST:PORT,.../SERVICE/DB: in the primary those Sentinels name"
        ),
    )
    parser.add_argument(
        "--grant-ttl",
        type=positive(float),
        default=GRANT_TTL_S,
        metavar="S",
        help=f"how long the chunk grants of a tenant's plans last (default {GRANT_TTL_S:g})",
    )
    parser.add_argument(
        "--tenant-slots",
        type=positive(int),
        default=TENANT_SLOTS,
        metavar="N",
        help=f"requests a tenant may run at once while alone; n tenants present share them (with --keys; default {TENANT_SLOTS})",
    )
    add_serve_args(parser)
    args = parser.parse_args(argv)
    setup_logging("api", args.log_level)
    try:
        faults = config_of_args(args, os.environ.get(FAULTS_ENV))
        auth = auth_of_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        store = metadata_store_of(args.metadata or args.db)
    except ValueError as exc:
        parser.error(f"--metadata: {exc}")
    app = make_app(
        store, auth, grant_ttl=args.grant_ttl, faults=faults, admin_token=args.admin_token, tenant_slots=args.tenant_slots
    )

    async def open_store(app: web.Application) -> None:
        await store.open()  # a bad --db or --metadata fails at start-up, not at the first request

    app.on_startup.append(open_store)
    serve(app, args.host, args.port, args.port_file, limits_of_args(args))


if __name__ == "__main__":
    main()
