"""How every server bounds slow and idle clients (DESIGN §6): the servers of ``servers/``
and the peer server a client runs (``blobsdk/peer/server.py``), so it lives in the SDK.

:func:`serving` runs an app behind :class:`BoundedSite`, whose connections are
:class:`BoundedRequestHandler` (aiohttp's own protocol plus three bounds):

- a request head must be complete within ``header_timeout`` of its first byte, or the
  connection is closed; an idle connection (before its first request or after a response)
  is closed after ``keepalive_timeout`` (aiohttp's own keep-alive timer);
- a request body that gets no bytes for ``body_timeout`` while the server is ready to read
  it fails the handler's next read with BodyTimedOut (408); the connection then closes;
- past ``max_connections`` open connections a new one gets a 503 and is closed at once,
  while the open ones are served; refusals are logged once per ``LOG_INTERVAL_S``;
- a response that does not send the body it declared ends its connection at once (the
  transport is aborted): a streamed body the handler left short of its Content-Length (a
  file that shrank under the send), or a second response a middleware made after the first
  one's body began (an error mid-body, which aiohttp would write into that body).  A reader
  then sees the connection close, where it would wait for the missing bytes until its own
  timeout.  A handler that sends body bytes around aiohttp's writer (``loop.sendfile``)
  counts them with :func:`sent_past_writer`.

Request bodies are never inflated (``auto_decompress=False``; the error middleware answers
415 to a ``Content-Encoding``), and a malformed request is one log line per interval, not a
traceback each.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, cast

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from blobsdk.errors import BadRequest, BodyTimedOut
from blobsdk.wire import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    KEEPALIVE_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_PROGRESS_MS,
    MIN_PROGRESS_MS,
    PROGRESS_HEADER,
    ErrorBody,
    encode,
)

LOG_INTERVAL_S = 10.0  # at most one line per interval for refusals and for malformed requests
FD_RESERVE = 64  # open files kept free of connections (blocks, the database, logs)
# asyncio accepts up to ACCEPT_BACKLOG connections per loop tick, and a refused one holds its
# file until the 4th tick after (accept, transport, connection_made, close). Past the cap a
# flood keeps that many refused sockets open, so the cap leaves room for them too: if accept()
# ever fails with EMFILE, asyncio (3.11) logs a traceback for each of the burst's remaining
# accepts and leaves a retry timer for each (once measured: 155 MB of them in 35 s).
ACCEPT_BACKLOG = 100  # the listen backlog, and asyncio's accepts per tick
ACCEPT_IN_FLIGHT = 4 * ACCEPT_BACKLOG
BODY_CHECKS = 4  # the body watchdog looks this many times per body_timeout
logger = logging.getLogger("servers.http")


class ServerLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds on clients, in seconds and connections; ValueError if one is not positive."""

    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        check_positive_fields(self)


def check_positive_fields(config: msgspec.Struct) -> None:
    """ValueError naming the first field of ``config`` that is not positive."""
    for name in config.__struct_fields__:
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be positive, not {getattr(config, name)}")


def limits_of_args(args: Any) -> ServerLimits:
    """The ServerLimits of the flags :func:`servers._common.http.add_serve_args` adds."""
    return ServerLimits(
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keepalive_timeout=args.keepalive_timeout,
        max_connections=args.max_connections,
    )


class Throttle:
    """Lets an event through at most once per ``interval`` seconds, counting the rest."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        self.interval = interval
        self.last = -interval
        self.hidden = 0

    def allow(self) -> int | None:
        """None if the last event let through is under ``interval`` old; else the number
        held back since it."""
        now = time.monotonic()
        if now - self.last < self.interval:
            self.hidden += 1
            return None
        self.last, hidden, self.hidden = now, self.hidden, 0
        return hidden


class RateLimitedLog(logging.LoggerAdapter[logging.Logger]):
    """The protocol's logger: a malformed request (aiohttp logs an HttpProcessingError with
    its traceback) becomes one line, at most one per interval, counting the ones held back.
    Everything else (a handler's traceback) passes unchanged."""

    def __init__(self, throttle: Throttle) -> None:
        super().__init__(logger, {})
        self.throttle = throttle

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if not isinstance(exc, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
        elif level >= logging.WARNING and (held := self.throttle.allow()) is not None:
            self.logger.warning(
                "malformed request (%s); %d more in the %.0f s before", _one_line(exc), held, self.throttle.interval
            )

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs


def _one_line(exc: HttpProcessingError) -> str:
    return " ".join(f"{type(exc).__name__}: {exc.message}".split())[:200]


class ConnectionGate:
    """Counts a site's open connections; refuses the ones past the cap."""

    def __init__(self, cap: int, throttle: Throttle) -> None:
        self.cap = cap
        self.open = 0
        self.throttle = throttle

    def admit(self) -> bool:
        if self.open < self.cap:
            self.open += 1
            return True
        if (held := self.throttle.allow()) is not None:
            logger.warning(
                "at the cap of %d connections: refused one, and %d more in the %.0f s before",
                self.cap,
                held,
                self.throttle.interval,
            )
        return False

    def release(self) -> None:
        self.open -= 1


def _refusal() -> bytes:
    body = encode(ErrorBody(code="unavailable", message="the server is at its connection cap"))
    head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/msgpack\r\nConnection: close\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


REFUSAL = _refusal()


class BoundedRequestHandler(RequestHandler):
    """aiohttp's protocol with the header and body timeouts and the connection cap."""

    __slots__ = ("_admitted", "_body", "_body_timer", "_gate", "_head_timer", "_in_flight", "_limits")

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        limits: ServerLimits,
        gate: ConnectionGate,
        log: RateLimitedLog,
    ) -> None:
        super().__init__(
            manager,
            loop=loop,
            keepalive_timeout=limits.keepalive_timeout,
            lingering_time=limits.body_timeout,  # an unread body is drained at most this long
            auto_decompress=False,
            access_log=None,  # type: ignore[arg-type]
            logger=cast(logging.Logger, log),  # duck-typed: aiohttp calls exception/debug/warning
        )
        self._limits = limits
        self._gate = gate
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None
        self._in_flight = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._gate.admit():
            cast(asyncio.Transport, transport).write(REFUSAL)
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._gate.release()
        self._stop_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if data and not self._in_flight and self._head_timer is None:  # the first byte of a head
            self._head_timer = self._loop.call_later(self._limits.header_timeout, self._head_timed_out)
        super().data_received(data)

    def dispatched(self, payload: StreamReader) -> None:
        """A request head was parsed and its handler is about to run."""
        self._stop_timers()
        self._in_flight = True
        if not payload.is_eof():
            self._body = payload
            self._watch_body(payload.total_bytes, self._loop.time())

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        self._stop_timers()
        try:
            if not _answered_whole(request, resp):
                end_connection(request)
                self.force_close()
            return await super().finish_response(request, resp, start_time)
        finally:
            self._in_flight = False
            if isinstance(request.content.exception(), BodyTimedOut):
                self.force_close()  # the rest of that body is not worth waiting for

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_flight:
            self.force_close()

    def _watch_body(self, seen: int, since: float) -> None:
        """Every body_timeout / BODY_CHECKS: a body that got no bytes for body_timeout while
        the transport was reading (not paused because the handler is behind) has stalled."""
        self._body_timer = None
        body, now = self._body, self._loop.time()
        if body is None or body.is_eof():
            return
        if body.total_bytes != seen or self.transport is None or not self.transport.is_reading():
            seen, since = body.total_bytes, now
        elif now - since >= self._limits.body_timeout:
            body.set_exception(BodyTimedOut(f"no request body bytes for {now - since:.1f} s (got {seen})"))
            return
        self._body_timer = self._loop.call_later(self._limits.body_timeout / BODY_CHECKS, self._watch_body, seen, since)

    def _stop_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None
        self._body = None


_STARTED = web.RequestKey("blobsdk_started_response", web.StreamResponse)


async def _note_started(request: web.Request, response: web.StreamResponse) -> None:
    """Remember the first response prepared for ``request`` (its head went out)."""
    if _STARTED not in request:
        request[_STARTED] = response


def _answered_whole(request: web.BaseRequest, resp: web.StreamResponse) -> bool:
    """False if the response whose head went out is not ``resp`` (a middleware answered an
    error after the body began), or is a streamed body shorter than its Content-Length.  A
    plain Response writes its whole body at the end (aiohttp does not count it down), and a
    bodiless one has none to send."""
    started = request.get(_STARTED)
    if started is None:
        return True
    if started is not resp:
        return False
    if isinstance(resp, (web.Response, web.FileResponse)) or _bodiless(request.method, resp.status):
        return True
    return not request.writer.length  # None: no length declared; 0: all of it written


def _bodiless(method: str, status: int) -> bool:
    return method == "HEAD" or status < 200 or status in (204, 304)


def sent_past_writer(request: web.BaseRequest, nbytes: int) -> None:
    """Count ``nbytes`` of body a handler sent around aiohttp's writer (``loop.sendfile``
    straight to the transport), so that a whole body is not taken for a short one."""
    writer = request.writer
    if writer.length is not None:
        writer.length = max(0, writer.length - nbytes)


def end_connection(request: web.BaseRequest) -> None:
    """Close ``request``'s connection now, dropping what is still queued for it: the end of
    a response that will not send the body it declared (or whose client stopped reading).
    A connection already closing (the client hung up, or a fault injected a cut) is left so."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.abort()


def _dispatching(factory: Any) -> Any:
    """``factory`` (the Server's request factory), telling the protocol first."""

    def make(message: Any, payload: StreamReader, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        protocol.dispatched(payload)
        return cast(web.BaseRequest, factory(message, payload, protocol, writer, task))

    return make


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered to leave FD_RESERVE + ACCEPT_IN_FLIGHT of the process's open-file
    limit free (so a flood of connections never makes accept() fail with EMFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if soft == resource.RLIM_INFINITY else max(1, min(wanted, soft - FD_RESERVE - ACCEPT_IN_FLIGHT))


class BoundedSite(web.BaseSite):
    """A TCP site whose connections are :class:`BoundedRequestHandler`."""

    __slots__ = ("_host", "_limits", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: ServerLimits) -> None:
        super().__init__(runner)
        self._host, self._port, self._limits = host, port, limits

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        server.request_factory = _dispatching(server.request_factory)
        limits = self._limits
        gate = ConnectionGate(connection_cap(limits.max_connections), Throttle())
        log = RateLimitedLog(Throttle())

        def protocol() -> BoundedRequestHandler:
            return BoundedRequestHandler(server, loop=loop, limits=limits, gate=gate, log=log)

        self._server = await loop.create_server(protocol, self._host, self._port, backlog=ACCEPT_BACKLOG)


@asynccontextmanager
async def listening(app: web.Application, host: str, port: int, limits: ServerLimits | None = None) -> AsyncIterator[int]:
    """Serve ``app`` on ``host:port`` (0: a free port) with ``limits``; yield the bound port.

    A handler whose client goes away is cancelled (aiohttp's default lets it run on): a GET
    queued for a block server's spindle gives its place up instead of seeking for nobody,
    which a hedged or failed-over read leaves behind on a busy HDD tier."""
    if _note_started not in app.on_response_prepare:  # an app served before has it (and is frozen)
        app.on_response_prepare.append(_note_started)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        await BoundedSite(runner, host, port, limits or ServerLimits()).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def progress_every(request: web.Request) -> float | None:
    """How often (seconds) a request wants ``102 Processing`` while it waits, None if it does
    not (``X-Blobsdk-Progress: MS``, asked of block servers, L3 nodes and peers alike); a
    malformed MS is BadRequest, its echo bounded.  A handler that may answer at once calls
    this first, so that the refusal does not depend on timing."""
    raw = request.headers.get(PROGRESS_HEADER)
    if raw is None or request.version < (1, 1):
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not MIN_PROGRESS_MS <= ms <= MAX_PROGRESS_MS:  # nan compares false: refused too
        raise BadRequest(f"{PROGRESS_HEADER} must be {MIN_PROGRESS_MS:g} to {MAX_PROGRESS_MS:g} ms, got {raw[:32]!r}")
    return ms / 1000
