"""One HTTP endpoint of a blobsdk server, seen from the client: msgpack requests, and every
aiohttp failure translated into the blobsdk exception tree at this boundary."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import msgspec

from ..config import Timeouts
from ..errors import BlobError, QuotaExceeded, TimedOut, Unavailable, error_from_code
from ..tail import Permit
from ..wire import MSGPACK, ErrorBody, encode
from .unreachable import SERVER, Role, no_answer, unreachable

T = TypeVar("T")

_error_decoder = msgspec.msgpack.Decoder(ErrorBody)

# Bytes aiohttp buffers per response before pausing the socket: chunk bodies are MiBs, and
# bigger pieces mean fewer Python-level iterations to copy them out.
READ_BUFSIZE = 1 << 20
OVERLOAD_STATUSES = frozenset({429, 503})  # answers that tell a concurrency limiter to back off


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
    server it is, for the error when nothing answers there (blobsdk/net/unreachable.py)."""

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


def report_overload(permit: Permit | None, status: int, error: BlobError) -> None:
    """Tell a request's concurrency-limiter slot that the server said it is overloaded (a
    tenant's byte quota is not overload)."""
    if permit is not None and status in OVERLOAD_STATUSES and not isinstance(error, QuotaExceeded):
        permit.overloaded()


def error_for(status: int, body: bytes, url: str) -> BlobError:
    """The blobsdk error an error reply encodes (an ErrorBody in msgpack or JSON); a reply
    without one is Unavailable for the statuses that mean "try again or elsewhere"."""
    try:
        err = _error_decoder.decode(body)
    except msgspec.DecodeError:
        try:
            err = msgspec.json.decode(body, type=ErrorBody)
        except msgspec.DecodeError:
            if status in (429, 502, 503, 504):
                return Unavailable(f"{url}: HTTP {status}")
            return BlobError(f"{url}: HTTP {status}: {body[:200]!r}")
    return error_from_code(err.code, err.message)
