"""One server as the SDK sees it, owned together for one base URL:

- **control requests** (msgpack calls, PUTs, deletes, stats) over the caller's long-lived
  ``aiohttp.ClientSession`` (:func:`new_session`), every aiohttp failure translated into the
  blobsdk exception tree at this boundary (:class:`HttpEndpoint`: all that an API server or
  a tracker is to a client);
- **data GETs** on keep-alive connections of their own, the body received straight into the
  caller's buffer (:class:`~blobsdk.net.rawget.RawGetEndpoint`);
- **the server's adaptive concurrency limit** (:class:`~blobsdk.net.limiter.AdaptiveLimiter`),
  which every data GET waits for.

:class:`Endpoint` is the three, for every client of a block server, an L3 node or a peer.  A
data GET that is one attempt of a hedged read is handed that attempt's
:class:`~blobsdk.chunks.call.Call`: it queues at the limiter at its demand's priority, marked
queued while it waits for a permit and in service once it has one, so the hedger never hedges
a read that is only waiting its turn in this client; an interim ``102 Processing`` from the
server is its ``progress()``, and every arrival of the reply's bytes its ``receiving()``.  The
permit is told, by the GET itself, when the server sheds the request or it times out.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import msgspec

from ..chunks import Call
from ..config import Timeouts
from ..errors import BlobError, TimedOut, Unavailable
from ..wire import MSGPACK, encode
from .failures import SERVER, Role, error_for, no_answer, unreachable
from .limiter import AdaptiveLimiter
from .rawget import RawGetEndpoint

T = TypeVar("T")

# Bytes aiohttp buffers per response before pausing the socket: chunk bodies are MiBs, and
# bigger pieces mean fewer Python-level iterations to copy them out.
READ_BUFSIZE = 1 << 20


def client_timeout(t: Timeouts) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=t.total, connect=t.connect, sock_connect=t.connect, sock_read=t.sock_read)


def new_session(timeouts: Timeouts, limit: int = 256) -> aiohttp.ClientSession:
    """The one long-lived session a client owns (call inside the running loop)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=64, ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector, timeout=client_timeout(timeouts), auto_decompress=False, read_bufsize=READ_BUFSIZE
    )


class HttpEndpoint:
    """A base URL plus the shared session and optional bearer token; ``role`` says which
    server it is, for the error when nothing answers there (blobsdk/net/failures.py)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str | None = None, *, role: Role = SERVER) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.role = role
        self.headers: dict[str, str] = {"Accept": MSGPACK}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    async def call(self, method: str, route: str, body: Any, kind: type[T], *, max_bytes: int | None = None, **kwargs: Any) -> T:
        """Send a msgpack body, decode a msgpack answer into ``kind``; an answer of more
        than ``max_bytes`` (None: no bound) is Unavailable, never read whole."""
        data = None if body is None else io.BytesIO(encode(body))  # bytes > 1 MiB make aiohttp warn
        headers = self.headers if data is None else {**self.headers, "Content-Type": MSGPACK}
        payload = await self.read(method, route, data=data, headers=headers, max_bytes=max_bytes, **kwargs)
        try:
            return msgspec.msgpack.decode(payload, type=kind)
        except msgspec.DecodeError as exc:
            raise Unavailable(f"{self.base_url}{route}: malformed response: {exc}") from exc

    async def post(self, route: str, body: Any, kind: type[T]) -> T:
        """:meth:`call` with POST: every request to a metadata API server."""
        return await self.call("POST", route, body, kind)

    async def read(self, method: str, route: str, *, max_bytes: int | None = None, **kwargs: Any) -> bytes:
        """A request's whole answer body (non-2xx answers raised as blobsdk errors); one of
        more than ``max_bytes`` (None: no bound) is Unavailable."""
        url = self.base_url + route
        async with self.request(method, route, **kwargs) as resp:
            try:
                if max_bytes is None:
                    return await resp.read()
                return await _bounded_body(resp, max_bytes, f"{method} {url}")
            except TimeoutError as exc:  # aiohttp's total timeout, while the body arrived
                raise TimedOut(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    @asynccontextmanager
    async def request(
        self, method: str, route: str, *, headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A raw request whose non-2xx answers are raised as blobsdk errors.  What goes
        wrong while it is sent and answered is translated into the blobsdk tree; inside the
        caller's block only aiohttp's own errors are (reading the body), never the
        caller's."""
        url = self.base_url + route
        async with AsyncExitStack() as stack:
            try:
                resp = await stack.enter_async_context(
                    self.session.request(method, url, headers=headers or self.headers, **kwargs)
                )
                if resp.status >= 400:
                    raise await _error_of(resp, url)
            except BlobError:
                raise  # some are OSErrors too (BlobNotFound, Unauthorized)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise self._translated(method, route, exc) from exc
            try:
                yield resp
            except aiohttp.ClientError as exc:
                raise self._translated(method, route, exc) from exc

    def _translated(self, method: str, route: str, exc: BaseException) -> Unavailable:
        what = f"{method} {route.partition('?')[0]}"
        error = unreachable(self.role, self.base_url, what, exc) if isinstance(exc, aiohttp.ClientConnectorError) else None
        if error is not None:
            return error
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return no_answer(self.role, self.base_url, what)
        cls = TimedOut if isinstance(exc, TimeoutError) else Unavailable
        return cls(f"{method} {self.base_url}{route}: {type(exc).__name__}: {exc}")


async def _bounded_body(resp: aiohttp.ClientResponse, max_bytes: int, what: str) -> bytes:
    """The body, unless it is (or says it is) longer than ``max_bytes``: then Unavailable."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise Unavailable(f"{what}: an answer of {resp.content_length} bytes, at most {max_bytes} expected")
    body = bytearray()
    async for piece in resp.content.iter_chunked(READ_BUFSIZE):
        body += piece
        if len(body) > max_bytes:
            raise Unavailable(f"{what}: an answer of more than {max_bytes} bytes expected at most")
    return bytes(body)


async def _error_of(resp: aiohttp.ClientResponse, url: str) -> BlobError:
    return error_for(resp.status, await resp.read(), url)


class Endpoint:
    """One server's control requests, data GETs and concurrency limit.

    Uses, and never closes, ``session``; ``token`` is the server's bearer token; ``limiter``
    defaults to a limiter of its own; ``timeout`` bounds each request (default: the
    session's); ``stall_s`` bounds a data GET's body's silences (None: only the timeout's
    ``sock_read``; see blobsdk/net/rawget.py); ``role``: which server it is, for the error
    when nothing answers there (blobsdk/net/failures.py).  :meth:`aclose` closes the data
    connections.  ``control``, ``data`` and ``limiter`` are its three parts; every data GET
    goes through :meth:`get_into`, which takes the permit and reads through ``data``.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        token: str | None = None,
        *,
        limiter: AdaptiveLimiter | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        stall_s: float | None = None,
        role: Role = SERVER,
    ) -> None:
        self.control = HttpEndpoint(session, base_url, token, role=role)
        self.base_url = self.control.base_url
        self.limiter = limiter if limiter is not None else AdaptiveLimiter(self.base_url)
        data_timeout = timeout if timeout is not None else session.timeout
        self.data = RawGetEndpoint(base_url, token, timeout=data_timeout, stall_s=stall_s, role=role)
        self._request_args: dict[str, Any] = {} if timeout is None else {"timeout": timeout}

    @property
    def has_room(self) -> bool:
        """Whether a data GET would get a permit at once (where a hedge may go)."""
        return self.limiter.has_room

    async def call(self, method: str, route: str, body: Any, kind: type[T]) -> T:
        """A msgpack request and its decoded answer (see ``HttpEndpoint.call``)."""
        return await self.control.call(method, route, body, kind, **self._request_args)

    async def read(self, method: str, route: str, **kwargs: Any) -> bytes:
        """A control request's whole answer body."""
        return await self.control.read(method, route, **self._request_args, **kwargs)

    async def get_into(
        self,
        route: str,
        out: memoryview,
        *,
        expect: int = 200,
        headers: Mapping[str, str] | None = None,
        call: Call | None = None,
    ) -> dict[str, str]:
        """A data GET whose body lands in ``out`` (see ``RawGetEndpoint.get_into``), once
        the limiter admits it."""
        async with self.limiter.acquire(call, size=out.nbytes) as permit:
            if call is None:
                return await self.data.get_into(route, out, expect=expect, headers=headers, permit=permit)
            return await self.data.get_into(
                route, out, expect=expect, headers=headers, permit=permit, on_interim=call.progress, on_bytes=call.receiving
            )

    async def aclose(self) -> None:
        """Close the data connections (the session belongs to the caller)."""
        await self.data.aclose()
