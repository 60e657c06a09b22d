"""Pieces every blobsdk server shares: body codecs, error mapping, auth, metrics, serving."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from blobsdk.auth import CLOCK_SKEW_S, Keyring
from blobsdk.errors import BadRequest, BlobError, PayloadTooLarge, UnsupportedEncoding
from blobsdk.net import ServerLimits, listening, progress_every
from blobsdk.wire import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    JSON,
    KEEPALIVE_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MSGPACK,
    ErrorBody,
)

from .auth import ADMIN_FAULTS_ROUTE, AUTH_KEY, PUBLIC_ROUTES, Handler, ServerAuth
from .logs import add_log_args
from .metrics import CLIENT_CLOSED, ServerMetrics

__all__ = ("ADMIN_FAULTS_ROUTE", "CLIENT_CLOSED", "PUBLIC_ROUTES", "Handler", "ServerMetrics")

T = TypeVar("T")
log = logging.getLogger("servers.http")


async def read_body(request: web.Request, kind: type[T], max_bytes: int = MAX_BODY_BYTES) -> T:
    """Decode a msgpack (default) or JSON request body into ``kind``; BadRequest if it is
    malformed or of the wrong shape, PayloadTooLarge if larger than ``max_bytes``."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"request body of {request.content_length} bytes exceeds {max_bytes}")
    body = bytearray()
    while len(body) <= max_bytes:  # read() returns what has arrived so far: loop
        piece = await read_piece(request, max_bytes + 1 - len(body))
        if not piece:
            break
        body += piece
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
    try:
        if request.content_type == JSON:
            return msgspec.json.decode(body, type=kind)
        return msgspec.msgpack.decode(body, type=kind)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"malformed request body: {exc}") from exc


async def read_piece(request: web.Request, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` more of the body, as they arrive (b"" at its end).  A client that
    hangs up mid-body is a BadRequest, not a server error with a traceback."""
    try:
        return await request.content.read(max_bytes)
    except ConnectionResetError as exc:
        raise BadRequest(f"client disconnected mid-body: {exc}") from exc


def reply(request: web.Request, obj: Any, status: int = 200) -> web.Response:
    """Encode ``obj`` as JSON if the client asked for it, else msgpack."""
    if JSON in request.headers.get("Accept", "") or request.content_type == JSON:
        return web.Response(body=msgspec.json.encode(obj), status=status, content_type=JSON)
    return web.Response(body=msgspec.msgpack.encode(obj), status=status, content_type=MSGPACK)


SEND_PIECE = 1 << 20
PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"


async def send_bytes(
    request: web.Request, data: bytes | bytearray | memoryview, *, content_type: str, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Answer with ``data``: up to 1 MiB (bytes or bytearray) as a plain response, sent with
    its headers in one write; more written in 1 MiB pieces: one large write() is slow on
    Python 3.11's selector transport, which memmoves its whole send buffer after every send."""
    if isinstance(data, (bytes, bytearray)) and len(data) <= SEND_PIECE:
        return web.Response(body=data, content_type=content_type, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_type = content_type
    response.content_length = len(data)
    await response.prepare(request)
    view = memoryview(data).cast("B")
    for i in range(0, len(view), SEND_PIECE):
        await response.write(view[i : i + SEND_PIECE])
    await response.write_eof()
    return response


async def with_progress(request: web.Request, work: Callable[[], Awaitable[T]]) -> T:
    """``work()``'s result; meanwhile, if the request asks for it (``X-Blobsdk-Progress: MS``,
    HTTP/1.1) and the work takes longer, an interim ``102 Processing`` every MS milliseconds,
    so the client knows the server is working on its request (an L3 node reading through a
    slow L4) and is not hung.  Sent as aiohttp sends ``100 Continue``, before the reply.  A
    malformed MS is BadRequest, before any work."""
    every = progress_every(request)
    if every is None:
        return await work()
    task = asyncio.ensure_future(work())
    try:
        while not (await asyncio.wait({task}, timeout=every))[0]:
            await request.writer.write(PROCESSING)
        return task.result()
    finally:
        if not task.done():  # this handler was cancelled (the client left): so is the work
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def progress_while(request: web.Request) -> AsyncIterator[None]:
    """While the body runs, if the request asks for it (``X-Blobsdk-Progress: MS``), an
    interim ``102 Processing`` every MS milliseconds: for a wait before the reply (a block
    server's spindle queue) that the work itself cannot be handed to :func:`with_progress`
    for.  Every interim reply is sent whole before this exits, so the reply's head never meets
    one half-written.  A malformed MS is BadRequest, before the body runs.  Nearly every body
    ends before the first beat is due: until then a loop timer stands for it, and the task
    that writes the beats is made only when one is due (a task made and cancelled per request
    was most of what the ask cost a block server that never queued)."""
    every = progress_every(request)
    if every is None:
        yield
        return
    beats: list[asyncio.Task[None]] = []
    timer = asyncio.get_running_loop().call_later(every, lambda: beats.append(asyncio.ensure_future(_beat(request, every))))
    try:
        yield
    finally:
        timer.cancel()
        for task in beats:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _beat(request: web.Request, every: float) -> None:
    """``102 Processing`` now and every ``every`` seconds after."""
    while True:
        await request.writer.write(PROCESSING)  # written to the transport whole, then drained
        await asyncio.sleep(every)


def error_reply(request: web.Request, exc: BlobError) -> web.Response:
    return reply(request, ErrorBody(code=exc.code, message=str(exc)), status=exc.http_status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map BlobError (and aiohttp's own 4xx) to an ErrorBody the client turns back into the
    same exception class.  A compressed request body is refused (415) before anything reads
    it: servers never inflate one (a small body can inflate to gigabytes)."""
    try:
        refuse_encoded(request)
        return await handler(request)
    except BlobError as exc:
        return error_reply(request, exc)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_reply(request, PayloadTooLarge(f"request body too large: {exc.text}"))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return reply(request, ErrorBody(code="http_error", message=exc.reason), status=exc.status)
        raise


def refuse_encoded(request: web.Request) -> None:
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedEncoding(f"request bodies with Content-Encoding {encoding!r} are not accepted; send them as they are")


METRICS_KEY = web.AppKey("metrics", ServerMetrics)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


class AppExtension(Protocol):
    """What a server adds to :func:`base_app` beyond the shared pieces (fault injection:
    ``servers._common.faults.fault_extensions``)."""

    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Runs inside the metrics middleware (what it answers is counted), outside error
        mapping and auth."""
        ...

    def install(self, app: web.Application) -> None:
        """Hook into ``app`` once its routes and metrics are in place."""
        ...


def base_app(
    server: str,
    auth: ServerAuth | None = None,
    client_max_size: int = MAX_BODY_BYTES,
    *,
    extensions: Sequence[AppExtension] = (),
) -> web.Application:
    """An Application with the shared middlewares, /healthz + /metrics routes and the
    caller's ``extensions``; ``auth`` (default: none) checks every request's token."""
    auth = ServerAuth() if auth is None else auth
    metrics = ServerMetrics(server)
    middlewares: list[Middleware] = [metrics.middleware, *(e.middleware for e in extensions), errors_middleware]
    if auth.required:  # no token, no middleware: every request passes through each one
        middlewares.append(auth.middleware)
    app = web.Application(middlewares=middlewares, client_max_size=client_max_size)
    app[METRICS_KEY] = metrics
    app[AUTH_KEY] = auth
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics.handle)
    for extension in extensions:
        extension.install(app)
    return app


def add_serve_args(parser: Any) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    parser.add_argument(
        "--token", default=None, help="accept this static bearer token as the admin of tenant 'default' (default: none)"
    )
    parser.add_argument(
        "--keys",
        type=Path,
        default=None,
        metavar="FILE",
        help="keyring file: accept signed tenant tokens and require chunk grants (blobsdk token keygen makes one)",
    )
    parser.add_argument(
        "--clock-skew",
        type=positive(float),
        default=CLOCK_SKEW_S,
        metavar="S",
        help=f"accept tokens and grants S seconds before and after their validity (default {CLOCK_SKEW_S:g})",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject faults, e.g. 'route=/v1/blocks;error_rate=0.1;latency_ms=5' (repeatable; "
        "rules of $BLOBSDK_FAULTS come first; see servers/_common/faults.py)",
    )
    parser.add_argument("--fault-seed", type=int, default=None, metavar="N", help="seed of the fault draws")
    parser.add_argument(
        "--admin-token", default=None, help="mount /admin/faults (GET/PUT/DELETE) behind this bearer token (default: not mounted)"
    )
    add_limit_args(parser)
    add_log_args(parser)


def auth_of_args(args: Any) -> ServerAuth:
    """The ServerAuth of the ``--token``, ``--keys`` and ``--clock-skew`` flags; ValueError
    for a bad keyring file."""
    keyring = None if args.keys is None else Keyring.load(args.keys)
    return ServerAuth(args.token, keyring, clock_skew=args.clock_skew)


def add_limit_args(parser: Any) -> None:
    """The flags of :class:`ServerLimits` (read them with ``limits_of_args``)."""
    seconds = {"type": positive(float), "metavar": "S"}
    parser.add_argument(
        "--header-timeout",
        default=HEADER_TIMEOUT_S,
        **seconds,
        help="close a connection whose request head is not complete S after its first byte",
    )
    parser.add_argument(
        "--body-timeout", default=BODY_TIMEOUT_S, **seconds, help="answer 408 to a request whose body gets no bytes for S seconds"
    )
    parser.add_argument(
        "--keepalive-timeout", default=KEEPALIVE_TIMEOUT_S, **seconds, help="close a connection idle for S seconds"
    )
    parser.add_argument(
        "--max-connections",
        type=positive(int),
        default=MAX_CONNECTIONS,
        metavar="N",
        help="refuse (503) connections past N open ones",
    )


def positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    def parse(raw: str) -> T:
        value = kind(raw)
        if not value > 0:  # type: ignore[operator]
            raise ValueError(raw)
        return value

    parse.__name__ = f"positive {kind.__name__}"  # argparse names the type in its error
    return parse


def serve(app: web.Application, host: str, port: int, port_file: Path | None = None, limits: ServerLimits | None = None) -> None:
    """Run ``app`` with ``limits`` (default: ServerLimits()) until SIGINT/SIGTERM; print and
    optionally write the bound port."""
    asyncio.run(_serve(app, host, port, port_file, limits))


async def _serve(app: web.Application, host: str, port: int, port_file: Path | None, limits: ServerLimits | None = None) -> None:
    async with listening(app, host, port, limits) as bound:
        freeze_startup_heap()
        _announce(host, bound, port_file)
        await _until_signalled()


def freeze_startup_heap() -> None:
    """Keep what is alive once a server has started (modules, the app, its stores) out of
    the collector's full collections, which then walk only what requests made since.  Else
    each one walks the whole start-up heap: ~20 ms of a stalled loop in the API server, about
    once a second under a flood of lookups, each a spike in every other request's latency."""
    gc.collect()
    gc.freeze()


def _announce(host: str, bound: int, port_file: Path | None) -> None:
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(bound))
        tmp.replace(port_file)
    log.info("serving on http://%s:%d", host, bound)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
