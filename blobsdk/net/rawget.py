"""The data path's HTTP/1.1 GET: one request, its body received straight into the
caller's buffer.

Chunk reads are the SDK's hot loop, and aiohttp's client costs ~370 µs of CPU per 16 KiB
ranged GET on the reference 2-core machine (request objects, tracing hooks, per-chunk timer
rescheduling, a StreamReader, then a copy out of it).  On a CPU-bound client that is the
ceiling on reads per second and the floor under every batch's latency, which hedging can
then not cut.  This client does one thing: keep-alive GETs whose body length is known
(``Content-Length``) into a ``memoryview`` via :class:`asyncio.BufferedProtocol`, so the
kernel copies the body into its final place and no Python code touches it; ~60 µs per GET.
Everything else (metadata calls, PUTs, admin) stays on aiohttp.

Rules, so that no reply can be misread:
- A reply whose status is the expected one must carry exactly ``out``'s size of body
  (``Content-Length``, no chunked encoding), else Unavailable and the connection is closed;
  with ``up_to``, any size up to ``out``'s (the body fills the start of ``out``).
- A 4xx/5xx reply's body (at most ``MAX_ERROR_BODY``) becomes the blobsdk error it encodes
  (the endpoint's ``refusal`` translates it: blobsdk's own error bodies by default).
- A connection is reused only after a whole, well-formed reply; a cancelled or failed GET
  closes its connection.  A reused connection the server closed as the GET went out is retried
  once on a new one (a GET is idempotent), and only if no byte of a reply came back.
- Timeouts: ``connect`` bounds the connect; ``sock_read`` bounds each wait for the next
  bytes; ``total`` bounds the whole GET; ``stall_s`` (optional) bounds each wait for the next
  bytes once the reply's body has begun: a body that stops mid-transfer is ReplyStalled
  (a TimedOut) after that long, where ``sock_read`` must also allow for a server slow to
  begin its reply.  One timer per GET enforces all three.
- An interim reply (1xx other than 101: an L3 node's ``102 Processing`` while it reads a
  chunk through from L4, see servers/flash.py) is no reply: its head is skipped, counts as
  activity for ``sock_read``, and is told to the GET's ``on_interim`` callback.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp

from ..errors import BadRequest, BlobError, ReplyStalled, TimedOut, Unavailable, Unreachable
from .failures import SERVER, Role, error_for, no_answer, report_overload, unreachable
from .limiter import Permit

MAX_HEAD = 64 << 10  # status line + headers
MAX_ERROR_BODY = 1 << 20
Refusal = Callable[[int, bytes, str], BlobError]  # (status, body, url) of an error reply -> the error it means
MAX_IDLE = 64  # idle keep-alive connections kept per endpoint
_SCRATCH = 64 << 10  # receive buffer for heads and error bodies


class _Reply:
    """A parsed status line and headers (names lower-cased)."""

    __slots__ = ("headers", "keep_alive", "length", "status")

    def __init__(self, status: int, headers: dict[str, str], length: int, keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self.length = length
        self.keep_alive = keep_alive


class _Conn(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection, one GET at a time.

    States: between GETs ``_done`` is None.  A GET sets ``_done``; while the head is
    incomplete, bytes go to a scratch buffer; once it is parsed, ``get_buffer`` hands out
    the rest of the body's destination, so the body lands there directly.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = loop.create_future()  # done once the socket is closed
        self.closed = False
        self.peer_closed = False  # the server closed or reset the connection
        self.received_any = False  # a byte of the current reply arrived
        self._scratch = bytearray(_SCRATCH)
        self._head = bytearray()
        self._done: asyncio.Future[_Reply] | None = None
        self._reply: _Reply | None = None
        self._body: memoryview | None = None  # the current reply's body destination
        self._filled = 0
        self._expect = 200
        self._up_to = False
        self._out: memoryview | None = None
        self._error_body: bytearray | None = None
        self._on_interim: Callable[[], None] | None = None
        self._on_bytes: Callable[[], None] | None = None
        self.on_body: Callable[[], None] | None = None  # the GET's deadline, told when the body begins
        self.last_active = 0.0

    @property
    def in_body(self) -> bool:
        """Whether the current reply's head is in and its body is arriving."""
        return self._body is not None

    @property
    def filled(self) -> int:
        """Bytes of the current reply's body received so far."""
        return self._filled

    # --- asyncio.BufferedProtocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self._body is not None:
            return self._body[self._filled :]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = self._loop.time()
        if self._done is None:  # bytes nobody asked for: the stream is out of step
            self.fail(Unavailable("bytes arrived between replies"))
            return
        self.received_any = True
        if self._on_bytes is not None:
            self._on_bytes()
        if self._body is not None:
            self._filled += nbytes
            self._maybe_finish()
            return
        self._head += memoryview(self._scratch)[:nbytes]
        self._parse()

    def _parse(self) -> None:
        """Parse the head received so far: skip interim replies, then start the body."""
        while True:
            end = self._head.find(b"\r\n\r\n")
            if end < 0 and len(self._head) <= MAX_HEAD:
                return
            if end < 0 or end > MAX_HEAD:
                self.fail(Unavailable(f"reply head over {MAX_HEAD} bytes"))
                return
            try:
                reply = _parse_head(bytes(self._head[:end]))
                if _is_interim(reply.status):
                    del self._head[: end + 4]
                    if self._on_interim is not None:
                        self._on_interim()
                    continue
                self._start_body(reply, memoryview(self._head)[end + 4 :])
            except Unavailable as exc:
                self.fail(exc)
            return

    def eof_received(self) -> bool:
        self.peer_closed = True
        self.fail(Unavailable(f"connection closed by the server after {self._filled} body bytes"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer_closed = self.peer_closed or not self.closed  # not our own close()
        self.closed = True
        detail = f"{type(exc).__name__}: {exc}" if exc is not None else "closed by the server"
        self.fail(Unavailable(f"connection lost ({detail})"))
        if not self.lost.done():
            self.lost.set_result(None)

    # --- one GET -----------------------------------------------------------------------

    def send(
        self,
        request: bytes,
        out: memoryview,
        expect: int,
        up_to: bool = False,
        on_interim: Callable[[], None] | None = None,
        on_bytes: Callable[[], None] | None = None,
    ) -> asyncio.Future[_Reply]:
        assert self.transport is not None and self._done is None
        self._done = self._loop.create_future()
        self._out, self._expect, self._up_to, self._on_interim = out, expect, up_to, on_interim
        self._on_bytes = on_bytes
        self._head = bytearray()
        self._reply, self._body, self._filled, self._error_body = None, None, 0, None
        self.received_any = False
        self.last_active = self._loop.time()
        self.transport.write(request)
        return self._done

    def _start_body(self, reply: _Reply, rest: memoryview) -> None:
        """The head is parsed: pick where the body goes, and take the bytes already read."""
        assert self._out is not None
        if reply.status == self._expect:
            if reply.length > self._out.nbytes if self._up_to else reply.length != self._out.nbytes:
                expected = f"at most {self._out.nbytes}" if self._up_to else f"{self._out.nbytes}"
                raise Unavailable(f"Content-Length {reply.length}, expected {expected}")
            self._body = self._out[: reply.length]
        else:
            if reply.length > MAX_ERROR_BODY:
                raise Unavailable(f"HTTP {reply.status} with a {reply.length}-byte body")
            self._error_body = bytearray(reply.length)
            self._body = memoryview(self._error_body)
        self._reply = reply
        if rest.nbytes > self._body.nbytes:
            raise Unavailable("more bytes than the reply's Content-Length")
        self._body[: rest.nbytes] = rest
        self._filled = rest.nbytes
        self._head = bytearray()
        if self.on_body is not None:
            self.on_body()
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        assert self._body is not None and self._reply is not None and self._done is not None
        if self._filled < self._body.nbytes:
            return
        done, self._done, self._body, self._out, self._on_interim = self._done, None, None, None, None
        self._on_bytes = None
        if not self._reply.keep_alive:
            self.close()
        if not done.done():
            done.set_result(self._reply)

    def error_body(self) -> bytes:
        return bytes(self._error_body or b"")

    def fail(self, exc: Exception) -> None:
        done, self._done, self._body, self._on_interim, self._on_bytes = self._done, None, None, None, None
        self.close()
        if done is not None and not done.done():
            done.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _is_interim(status: int) -> bool:
    """A 1xx reply that another reply follows (101 Switching Protocols does not)."""
    return 100 <= status < 200 and status != 101


def _parse_head(head: bytes) -> _Reply:
    """Status and headers of a reply head (without its final blank line)."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or not code.isdigit() or rest[3:4] not in (b"", b" "):
        raise Unavailable(f"malformed status line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise Unavailable(f"malformed header line {line[:100]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    status = int(code)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise Unavailable(f"HTTP {status} reply is chunked; a data GET needs a Content-Length")
    length = headers.get("content-length")
    if length is None and status not in (204, 304) and not _is_interim(status):
        raise Unavailable(f"HTTP {status} reply has no Content-Length")
    if length is not None and not (length.isascii() and length.isdigit()):
        raise Unavailable(f"bad Content-Length {length!r}")
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == b"HTTP/1.1" or "keep-alive" in connection)
    return _Reply(status, headers, int(length or 0), keep_alive)


class RawGetEndpoint:
    """GETs to one server (``base_url``), over keep-alive connections of its own.

    ``token``: the bearer token the server wants.  ``timeout``: an aiohttp ClientTimeout
    (the session's), of which ``connect``/``sock_connect``, ``sock_read`` and ``total`` are
    used; ``stall_s``: the bound on a reply body's silences (None: only ``sock_read``).
    ``refusal``: what an error reply means (default: the blobsdk error its body encodes).
    ``role``: which server it is, for the error when nothing answers there
    (blobsdk/net/failures.py).  Close with :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: aiohttp.ClientTimeout,
        stall_s: float | None = None,
        refusal: Refusal = error_for,
        role: Role = SERVER,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"need an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._connect_s = timeout.sock_connect or timeout.connect
        self._read_s = timeout.sock_read
        self._total_s = timeout.total
        self._stall_s = stall_s
        common = f"Host: {parts.netloc.rpartition('@')[2]}\r\nAccept: application/msgpack\r\n"
        self._common = common + (f"Authorization: Bearer {token}\r\n" if token else "")
        self._idle: list[_Conn] = []
        self._closed = False
        self._refusal_of = refusal
        self.role = role

    async def get_into(
        self,
        route: str,
        out: memoryview,
        *,
        expect: int = 200,
        headers: Mapping[str, str] | None = None,
        permit: Permit | None = None,
        up_to: bool = False,
        on_interim: Callable[[], None] | None = None,
        fresh: bool = False,
        on_bytes: Callable[[], None] | None = None,
    ) -> dict[str, str]:
        """GET ``route``; its body (exactly ``out.nbytes``, or with ``up_to`` at most that:
        its ``content-length`` header says how many; status ``expect``) lands in ``out``.
        Returns the reply's headers (lower-case names).  An error reply raises the
        blobsdk error it encodes; anything else that is not the reply expected raises
        Unavailable.  ``permit``: the concurrency-limiter slot this GET holds; it is told
        when the server sheds the GET (429/503: ``overloaded``) or the GET times out
        (connect, ``sock_read``, ``total`` or ``stall_s``: ``dropped``).  ``on_interim`` is
        called on each interim (1xx) reply before the reply, ``on_bytes`` each time bytes of
        the reply arrive (its head or body: the server is not silent).  ``fresh``: on a new connection,
        not an idle one (a retry after a stall: the server behind an old one may be the
        one that stalled)."""
        if out.readonly:
            raise BadRequest("out must be a writable buffer")
        if self._closed:
            raise Unavailable(f"{self.base_url}: endpoint closed")
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        request = f"GET {self._prefix}{route} HTTP/1.1\r\n{self._common}{extra}\r\n".encode("latin-1")
        url = self.base_url + route
        try:
            started = asyncio.get_running_loop().time()
            what = f"GET {route.partition('?')[0]}"
            calls = (on_interim, on_bytes)
            reply, conn = await self._exchange(request, out, expect, up_to, started, calls, fresh, what)
        except Unreachable:
            raise  # says which server, where and why already
        except Unavailable as exc:
            if permit is not None and isinstance(exc, TimedOut):
                permit.dropped()
            raise type(exc)(f"GET {url}: {exc}") from exc.__cause__
        if reply.status == expect:
            return reply.headers
        raise self._refusal(reply, conn.error_body(), url, permit)

    async def _exchange(
        self,
        request: bytes,
        out: memoryview,
        expect: int,
        up_to: bool,
        started: float,
        calls: tuple[Callable[[], None] | None, Callable[[], None] | None] = (None, None),
        fresh: bool = False,
        what: str = "GET",
    ) -> tuple[_Reply, _Conn]:
        """Send ``request`` and wait for its whole reply; a stale idle connection that fails
        before any reply byte is retried once on a new connection.  ``total`` counts from
        ``started``, so it covers connecting and the retry.  ``calls``: the GET's
        ``on_interim`` and ``on_bytes``."""
        conn, reused = await self._connection(what, fresh)
        try:
            reply = await self._await_reply(conn, conn.send(request, out, expect, up_to, *calls), started)
        except Unavailable:
            if not (reused and conn.peer_closed and not conn.received_any):
                raise
            conn, _ = await self._connection(what, fresh=True)
            reply = await self._await_reply(conn, conn.send(request, out, expect, up_to, *calls), started)
        if not conn.closed and len(self._idle) < MAX_IDLE and not self._closed:
            self._idle.append(conn)
        else:
            conn.close()
        return reply, conn

    async def _await_reply(self, conn: _Conn, done: asyncio.Future[_Reply], started: float) -> _Reply:
        """The reply, within ``sock_read`` of inactivity (``stall_s`` in its body) and
        ``total`` since ``started``; the connection is closed unless the reply came back whole."""
        timer = _Deadline(asyncio.get_running_loop(), conn, done, started, self._read_s, self._total_s, self._stall_s)
        try:
            return await done
        except asyncio.CancelledError:
            conn.close()
            raise
        finally:
            timer.cancel()

    async def _connection(self, what: str, fresh: bool = False) -> tuple[_Conn, bool]:
        """An idle keep-alive connection (and True), or a new one (and False); ``what``: the
        request it is for ("GET /route"), for the error if none can be made."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_s):
                _, conn = await loop.create_connection(lambda: _Conn(loop), self._host, self._port, ssl=self._ssl)
        except TimeoutError as exc:
            raise no_answer(self.role, self.base_url, what) from exc
        except OSError as exc:
            error = unreachable(self.role, self.base_url, what, exc)
            raise error or Unavailable(f"{self.base_url}: cannot connect: {type(exc).__name__}: {exc}") from exc
        return conn, False

    def _refusal(self, reply: _Reply, body: bytes, url: str, permit: Permit | None) -> Exception:
        if reply.status < 400:
            return Unavailable(f"GET {url}: unexpected HTTP {reply.status}")
        error = self._refusal_of(reply.status, body, url)
        report_overload(permit, reply.status, error)
        return error

    async def aclose(self) -> None:
        """Close every idle connection (waiting until their sockets are); GETs still running
        close theirs when they end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        await asyncio.gather(*(conn.lost for conn in idle))


class _Deadline:
    """Fails a GET that waits ``read_s`` for bytes (``stall_s``, if shorter, once its body
    has begun) or runs ``total_s`` in all: one timer, re-armed only when it fires early
    (activity moved the inactivity deadline on).  With a stall bound its first look is
    ``stall_s`` in, so a body that begins before then (nearly every one) needs no timer of
    its own; one that begins later has the timer brought forward."""

    __slots__ = ("_conn", "_done", "_handle", "_loop", "_read_s", "_stall_s", "_total_at")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Conn,
        done: asyncio.Future[_Reply],
        started: float,
        read_s: float | None,
        total_s: float | None,
        stall_s: float | None = None,
    ) -> None:
        self._loop, self._conn, self._done = loop, conn, done
        self._read_s = read_s
        self._stall_s = stall_s if stall_s is not None and (read_s is None or stall_s < read_s) else None
        self._total_at = None if total_s is None else started + total_s
        self._handle: asyncio.TimerHandle | None = None
        when = self._next()
        if self._stall_s is not None:
            conn.on_body = self._body_began
            look = conn.last_active + self._stall_s
            when = look if when is None else min(when, look)
        if when is not None:
            self._handle = loop.call_at(when, self._fire)

    def _idle_s(self) -> float | None:
        """The silence allowed now: ``stall_s`` within a body, else ``read_s``."""
        return self._stall_s if self._stall_s is not None and self._conn.in_body else self._read_s

    def _next(self) -> float | None:
        idle_s = self._idle_s()
        read_at = None if idle_s is None else self._conn.last_active + idle_s
        candidates = [t for t in (read_at, self._total_at) if t is not None]
        return min(candidates) if candidates else None

    def _body_began(self) -> None:
        """The body's bound is ``stall_s`` from now on: look then, if the timer is later."""
        when = self._next()
        if when is not None and (self._handle is None or self._handle.when() > when):
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        if self._done.done():
            return
        when = self._next()
        if when is not None and when > self._loop.time():
            self._handle = self._loop.call_at(when, self._fire)
            return
        self._conn.fail(self._error())

    def _error(self) -> TimedOut:
        conn, stall_s = self._conn, self._stall_s
        error: TimedOut
        if stall_s is not None and conn.in_body and (self._total_at is None or self._loop.time() < self._total_at):
            error = ReplyStalled(f"the reply's body stalled after {conn.filled} bytes: none for {stall_s:g}s")
        else:
            error = TimedOut("timed out waiting for the server")
        error.__cause__ = TimeoutError()  # for the reader of a traceback
        return error

    def cancel(self) -> None:
        self._conn.on_body = None
        if self._handle is not None:
            self._handle.cancel()
