"""Metadata API server: getReadPlan, commit, delete, list and scan over a MetadataStore.

Routes (msgpack bodies; JSON with ``Content-Type: application/json``):

    POST /v1/plans   GetPlansRequest -> GetPlansResponse   (at most 1000 paths)
    POST /v1/commit  CommitRequest   -> CommitResponse     (at most 1000 ops, atomic)
    POST /v1/delete  DeleteRequest   -> DeleteResponse
    POST /v1/list    ListRequest     -> ListResponse
    POST /v1/scan    ScanRequest     -> ScanResponse
    GET  /v1/stat?path=...           -> BlobInfo
    GET  /healthz, /metrics

Run: ``python -m servers.api --db meta.sqlite [--host H] [--port P] [--token T]``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

from blobsdk.errors import BadRequest, BlobError
from blobsdk.metadata.base import MetadataStore
from blobsdk.metadata.http import MAX_OPS_PER_REQUEST, MAX_PATHS_PER_REQUEST
from blobsdk.metadata.sqlite import SqliteMetadataStore
from blobsdk.wire import (
    CommitRequest,
    CommitResponse,
    DeleteRequest,
    DeleteResponse,
    GetPlansRequest,
    GetPlansResponse,
    ListRequest,
    ListResponse,
    ScanRequest,
    ScanResponse,
)

from ._common.faults import FAULTS_ENV, FaultConfig, config_of_args, fault_extensions
from ._common.http import Handler, add_serve_args, base_app, read_body, reply, serve
from ._common.limits import limits_of_args


def make_app(
    store: MetadataStore,
    token: str | None = None,
    *,
    faults: FaultConfig | None = None,
    admin_token: str | None = None,
) -> web.Application:
    """The API app over ``store``.  The app owns the store: it is closed on app cleanup.
    ``faults`` and ``admin_token``: see servers/_common/faults.py."""
    app = base_app("blobsdk_api", token, extensions=fault_extensions(faults, admin_token))
    app.middlewares.append(_value_errors_as_bad_request)
    api = _Api(store)
    app.router.add_post("/v1/plans", api.plans)
    app.router.add_post("/v1/commit", api.commit)
    app.router.add_post("/v1/delete", api.delete)
    app.router.add_post("/v1/list", api.list)
    app.router.add_post("/v1/scan", api.scan)
    app.router.add_get("/v1/stat", api.stat)
    app.cleanup_ctx.append(api.lifetime)
    return app


class _Api:
    """The route handlers, bound to one store."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.store.aclose()

    async def plans(self, request: web.Request) -> web.Response:
        body = await read_body(request, GetPlansRequest)
        _check_count("paths", body.paths, MAX_PATHS_PER_REQUEST)
        return reply(request, GetPlansResponse(plans=await self.store.get_plans(body.paths)))

    async def commit(self, request: web.Request) -> web.Response:
        body = await read_body(request, CommitRequest)
        _check_count("ops", body.ops, MAX_OPS_PER_REQUEST)
        return reply(request, CommitResponse(plans=await self.store.commit_many(body.ops)))

    async def delete(self, request: web.Request) -> web.Response:
        body = await read_body(request, DeleteRequest)
        return reply(request, DeleteResponse(deleted=await self.store.delete(body.path, body.if_version)))

    async def list(self, request: web.Request) -> web.Response:
        body = await read_body(request, ListRequest)
        items, cursor = await self.store.list_page(body.prefix, body.start_after, body.limit)
        return reply(request, ListResponse(items=items, next_start_after=cursor))

    async def scan(self, request: web.Request) -> web.Response:
        body = await read_body(request, ScanRequest)
        plans, cursor = await self.store.scan_page(body.start_after, body.limit)
        return reply(request, ScanResponse(plans=plans, next_start_after=cursor))

    async def stat(self, request: web.Request) -> web.Response:
        path = request.query.get("path")
        if path is None:
            raise BadRequest("missing query parameter 'path'")
        return reply(request, (await self.store.get_plan(path)).info())


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
    parser = argparse.ArgumentParser(prog="python -m servers.api", description="blobsdk metadata API server.")
    parser.add_argument("--db", required=True, help="SQLite database file (created if missing)")
    add_serve_args(parser)
    args = parser.parse_args(argv)
    try:
        faults = config_of_args(args, os.environ.get(FAULTS_ENV))
    except ValueError as exc:
        parser.error(str(exc))
    store = SqliteMetadataStore(args.db)
    app = make_app(store, args.token, faults=faults, admin_token=args.admin_token)

    async def open_store(app: web.Application) -> None:
        await store.open()  # a bad --db fails at start-up, not at the first request

    app.on_startup.append(open_store)
    serve(app, args.host, args.port, args.port_file, limits_of_args(args))


if __name__ == "__main__":
    main()
