"""L4 block server: one directory of immutable blocks over HTTP, with HDD emulation.

Routes (block bytes travel raw; listings are msgpack, or JSON on request)::

    PUT    /v1/blocks/{id}    body = the block; 201 once durable; 400 if over --max-block-mb
    GET    /v1/blocks/{id}    200 whole block, or 206 for ``Range: bytes=first-last``
           [X-Blobsdk-Progress: MS]   interim 102 Processing every MS ms while it queues
    DELETE /v1/blocks/{id}    204, idempotent
    GET    /v1/blocks?start_after=&limit=    ListBlocksResponse, limit <= 10000

Tenancy (``--keys``; servers/_common/auth.py): any valid token may PUT a new block (an
existing one is never replaced); a GET by a tenant must be the exact ``Range`` of a chunk
grant the metadata API gave that tenant (else 403 ``forbidden``); DELETE and the listing are
for admins.

A Range that reaches past the block is answered 416 with ErrorBody code ``corrupt_data``
(the BlockStore contract: a plan never points past a block), not clipped as RFC 9110
would: the client must get exactly the bytes it asked for or an error.

HDD emulation, for benchmarks: each GET/PUT waits for one of ``spindles`` (FIFO; 0 =
unlimited), pays ``latency_ms`` once, then moves its bytes through one server-wide
bandwidth budget (a reservation-based token bucket shared by every transfer in both
directions, paced per 1 MiB piece, with no burst credit after idle time).  A GET that asks
(``X-Blobsdk-Progress: MS``, as ``HttpBlockStore`` does) hears ``102 Processing`` every MS ms
while it queues for a spindle: a spindle is held for the whole send, so on a full link a
read may wait seconds with no byte of its own, and its client must not take that for a hang.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from blobsdk.cli import ArgumentParser
from blobsdk.errors import BadRequest, PayloadTooLarge, RangeNotSatisfiable
from blobsdk.net import limits_of_args
from blobsdk.sources import BlockWriter, LocalBlockStore, validate_block_id
from blobsdk.wire import MAX_LIST_BLOCKS, ListBlocksResponse

from ._common import prog
from ._common.auth import ServerAuth, check_grant, require_admin
from ._common.faults import FAULTS_ENV, FaultConfig, config_of_args, fault_extensions
from ._common.hdd import Bandwidth, Spindles
from ._common.http import METRICS_KEY, add_serve_args, auth_of_args, base_app, progress_while, reply, serve
from ._common.logs import setup_logging

MiB = 1 << 20
OCTETS = "application/octet-stream"
PIECE = 1 << 20  # bytes read from disk and sent per step of a GET
BATCH = 1 << 20  # received bytes handed to the disk thread at once on a PUT
_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{0,19})")


class BlockServer:
    """The route handlers over one :class:`LocalBlockStore`."""

    def __init__(self, store: LocalBlockStore, *, spindles: Spindles, bandwidth: Bandwidth, max_block_bytes: int):
        self.store = store
        self.spindles = spindles
        self.bandwidth = bandwidth
        self.max_block_bytes = max_block_bytes

    async def put_block(self, request: web.Request) -> web.Response:
        block_id = validate_block_id(request.match_info["block_id"])
        declared = request.content_length
        if declared is not None and declared > self.max_block_bytes:
            raise self._too_large(declared)
        async with self.spindles, self.store.block_writer(block_id) as writer:
            received = await self._receive(request, writer)
            if declared is not None and received != declared:  # the client went away
                raise BadRequest(f"body ended after {received} of {declared} bytes")
            await writer.commit()
        return web.Response(status=201)

    async def get_block(self, request: web.Request) -> web.StreamResponse:
        block_id = validate_block_id(request.match_info["block_id"])
        wanted = parse_range(request.headers.get("Range"))
        first, last = (0, None) if wanted is None else wanted
        check_grant(request, block_id, first, -1 if last is None else last - first + 1)
        async with self._spindle(request):
            # One disk operation finds the size and reads the first piece (clipped to the
            # block: a range past its end is refused below, before anything is sent).
            piece, size = await self.store.read_clipped(block_id, first, _first_piece(first, last))
            if wanted is None:
                return await self._send(request, block_id, piece, 0, size, size, status=200)
            start, length = span_of(wanted, size, block_id)
            return await self._send(request, block_id, piece, start, length, size, status=206)

    @asynccontextmanager
    async def _spindle(self, request: web.Request) -> AsyncIterator[None]:
        """A spindle for ``request``; while it queues for one, ``102 Processing`` if asked
        (``X-Blobsdk-Progress``): the client then knows its read waits behind others here and
        is not hung.  (A spindle is held for the whole send, so on a full link a read may
        queue for seconds with no byte of its own, while the server serves other clients.)"""
        acquired = False
        try:
            async with progress_while(request):
                await self.spindles.__aenter__()
                acquired = True
            yield
        finally:
            if acquired:
                await self.spindles.__aexit__(None, None, None)

    async def delete_block(self, request: web.Request) -> web.Response:
        require_admin(request)
        await self.store.delete_block(request.match_info["block_id"])
        return web.Response(status=204)

    async def list_blocks(self, request: web.Request) -> web.Response:
        require_admin(request)
        start_after = request.query.get("start_after") or None
        if start_after is not None:
            validate_block_id(start_after)
        blocks, next_after = await self.store.list_page(start_after, parse_limit(request.query.get("limit")))
        return reply(request, ListBlocksResponse(blocks=blocks, next_start_after=next_after))

    async def _receive(self, request: web.Request, writer: BlockWriter) -> int:
        """Stream the body to disk in batches; returns its length.  Only one batch is in
        memory at a time, and the size limit is enforced as bytes arrive."""
        batch: list[bytes] = []
        batched = total = 0
        while piece := await _read_piece(request):
            total += len(piece)
            if total > self.max_block_bytes:
                raise self._too_large(total)
            batch.append(piece)
            batched += len(piece)
            if batched >= BATCH:
                await self._store_batch(writer, batch, batched)
                batch, batched = [], 0
        await self._store_batch(writer, batch, batched)
        return total

    async def _store_batch(self, writer: BlockWriter, batch: Sequence[bytes], nbytes: int) -> None:
        if batch:
            await self.bandwidth.take(nbytes)
            await writer.write(batch)

    async def _send(
        self, request: web.Request, block_id: str, piece: bytes, start: int, length: int, size: int, *, status: int
    ) -> web.StreamResponse:
        """Answer ``length`` bytes at ``start``, of which ``piece`` is the first (read before
        the headers go out, so a failure there is still a proper error reply): a span of one
        piece as a plain response, a longer one streamed one piece at a time."""
        headers = {"Content-Range": f"bytes {start}-{start + length - 1}/{size}"} if status == 206 else None
        if len(piece) == length:
            await self.bandwidth.take(length)
            return web.Response(body=piece, status=status, content_type=OCTETS, headers=headers)
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_type = OCTETS
        resp.content_length = length
        await resp.prepare(request)
        await self._stream(resp, block_id, start, length, piece)
        return resp

    async def _stream(self, resp: web.StreamResponse, block_id: str, start: int, length: int, piece: bytes) -> None:
        """Send ``piece`` (the bytes at ``start``), then the rest of the span, paced."""
        sent = 0
        while True:
            await self.bandwidth.take(len(piece))
            await resp.write(piece)
            sent += len(piece)
            if sent >= length:
                break
            piece = await self.store.read_range(block_id, start + sent, min(PIECE, length - sent))
        await resp.write_eof()

    def _too_large(self, nbytes: int) -> PayloadTooLarge:
        return PayloadTooLarge(f"block too large: {nbytes} bytes, the limit is {self.max_block_bytes}")


async def _read_piece(request: web.Request) -> bytes:
    """The next bytes of the body as they arrive (b"" at its end).  A client that hangs up
    mid-body is a BadRequest (its block is discarded), not a server error with a traceback."""
    try:
        return await request.content.readany()
    except ConnectionResetError as exc:
        raise BadRequest(f"client disconnected mid-body: {exc}") from exc


def _first_piece(first: int, last: int | None) -> int:
    """Bytes to read first for a span from ``first`` to ``last`` (None: the block's end)."""
    return PIECE if last is None else min(PIECE, last - first + 1)


def parse_range(header: str | None) -> tuple[int, int | None] | None:
    """``bytes=first-last`` or ``bytes=first-`` as (first, last or None); None if absent."""
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        raise BadRequest(f"unsupported Range {header!r}: want bytes=first-last")
    first, last = int(match[1]), int(match[2]) if match[2] else None
    if last is not None and last < first:
        raise BadRequest(f"invalid Range {header!r}: last byte before first")
    return first, last


def span_of(wanted: tuple[int, int | None], size: int, block_id: str) -> tuple[int, int]:
    """(start, length) of a parsed range inside a block of ``size`` bytes."""
    first, last = wanted
    last = size - 1 if last is None else last
    if first >= size or last >= size:
        raise RangeNotSatisfiable(f"range {first}-{last} is past the end of block {block_id} ({size} bytes)")
    return first, last - first + 1


def parse_limit(raw: str | None) -> int:
    try:
        limit = 1000 if raw is None else int(raw)
    except ValueError:
        raise BadRequest(f"limit must be an integer, got {raw!r}") from None
    if not 1 <= limit <= MAX_LIST_BLOCKS:
        raise BadRequest(f"limit must be between 1 and {MAX_LIST_BLOCKS}, got {limit}")
    return limit


def make_app(
    root: str | os.PathLike[str],
    *,
    auth: ServerAuth | None = None,
    latency_ms: float = 0.0,
    bandwidth_mbps: float = 0.0,
    spindles: int = 0,
    max_block_bytes: int = 512 * MiB,
    faults: FaultConfig | None = None,
    admin_token: str | None = None,
) -> web.Application:
    """The block server over directory ``root`` (see the module docstring for the
    emulation knobs; 0 means no emulation); ``auth``: who may do what (default: anyone
    anything).  ``faults`` and ``admin_token``: see
    servers/_common/faults.py."""
    if latency_ms < 0 or bandwidth_mbps < 0 or spindles < 0 or max_block_bytes < 1:
        raise ValueError("latency_ms, bandwidth_mbps and spindles must be >= 0, max_block_bytes >= 1")
    server = BlockServer(
        LocalBlockStore(root),
        spindles=Spindles(spindles, latency_ms / 1000.0),
        bandwidth=Bandwidth(bandwidth_mbps * 1e6),
        max_block_bytes=max_block_bytes,
    )
    app = base_app("blobsdk_blockstore", auth, extensions=fault_extensions(faults, admin_token))
    _install(app, server)
    return app


def _install(app: web.Application, server: BlockServer) -> None:
    app.router.add_put("/v1/blocks/{block_id}", server.put_block)
    app.router.add_get("/v1/blocks/{block_id}", server.get_block, allow_head=False)
    app.router.add_delete("/v1/blocks/{block_id}", server.delete_block)
    app.router.add_get("/v1/blocks", server.list_blocks, allow_head=False)
    metrics = app[METRICS_KEY]
    metrics.gauge(
        "queued_requests", "Block reads and writes waiting for a spindle (the queue depth).", lambda: server.spindles.queued
    )
    metrics.gauge("in_service_requests", "Block reads and writes a spindle is serving now.", lambda: server.spindles.in_service)
    metrics.counter(
        "bandwidth_bytes",
        "Block bytes moved through the bandwidth cap, either way (PUT bodies in, GET bodies out).",
        lambda: server.bandwidth.moved,
    )

    async def open_store(app: web.Application) -> None:
        await server.store.wait_open()  # a store of another format stops the server here, not on each request

    async def close_store(app: web.Application) -> None:
        await server.store.aclose()

    app.on_startup.append(open_store)
    app.on_cleanup.append(close_store)


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    setup_logging("blockstore", args.log_level)
    try:
        faults = config_of_args(args, os.environ.get(FAULTS_ENV))
        auth = auth_of_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    app = make_app(
        args.dir,
        auth=auth,
        latency_ms=args.latency_ms,
        bandwidth_mbps=args.bandwidth_mbps,
        spindles=args.spindles,
        max_block_bytes=args.max_block_mb * MiB,
        faults=faults,
        admin_token=args.admin_token,
    )
    serve(app, args.host, args.port, args.port_file, limits_of_args(args))


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog(f"{__package__}.blockstore"), description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="directory holding the blocks")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="emulated seek latency per request")
    parser.add_argument("--bandwidth-mbps", type=float, default=0.0, help="server-wide MB/s (1e6 B/s); 0 = unlimited")
    parser.add_argument("--spindles", type=int, default=0, help="concurrent data requests; 0 = unlimited")
    parser.add_argument("--max-block-mb", type=int, default=512, help="largest accepted block, MiB (default 512)")
    add_serve_args(parser)
    return parser


if __name__ == "__main__":
    main()
