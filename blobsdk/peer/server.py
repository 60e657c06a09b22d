"""The peer server a client runs when it has trackers: it serves the chunks of its
peer tier (``blobsdk/tiers/_peer.py``) to other clients of its tenant.

One route, ``GET /v1/chunks/{key}?<chunk ref>`` (``wire.chunk_query``), answering the chunk's
verified raw bytes.  Its rules, in the order they are checked:

- the query must be a valid chunk ref whose key is ``key`` (400);
- the peer must know its tenant, from a tracker's answer to its hello (503 until then);
- the request must carry a serve ticket (header ``X-Blobsdk-Ticket``, 401 without) that
  verifies with this peer's :class:`~blobsdk.auth.ServeKey` for its tenant and ``key``, and
  has not expired (403): a tracker signs one only for an asker whose chunk grant verified,
  so a peer never hands anyone bytes they could not read from L4;
- a request that finds ``max_uploads`` uploads sending is refused at once (429
  ``PeerBusy``), so the child moves on to its next source rather than queue here;
- the chunk comes from ``lookup``, which may wait (up to the peer tier's ``wait_s``) for a
  chunk this client is still fetching; None is 404, a stale tracker entry.  A child that
  waited is not refused afterwards: it queues for one of the ``max_uploads`` sends (the
  tracker's fan-out bounds how many wait per chunk).  A child that asks for it
  (``X-Blobsdk-Progress: MS``) hears ``102 Processing`` every MS ms while it waits, so it
  tells a source that is waiting on its own upstream from one that stopped or was cut off;
- each upload must be taken within ``timeout_s``: a child that stops reading loses it, and
  its connection is closed with the bytes still queued for it;
  and like every server (``blobsdk/net/serving.py``) it bounds header, body and idle time and
  its connection count.

The server holds no keyring and never sees a bearer token: a client's secrets stay its own.
Errors are the servers' ``ErrorBody`` in msgpack, so a child's endpoint maps them back to
the same exceptions (``blobsdk/net/endpoint.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import msgspec
from aiohttp import web

from ..auth import TICKET_HEADER, ServeKey
from ..config import PeerConfig
from ..errors import BadRequest, BlobError, BlobNotFound, PeerBusy, Unavailable
from ..net import end_connection, listening, progress_every
from ..wire import MSGPACK, ChunkRef, ErrorBody, ref_from_query

Lookup = Callable[[ChunkRef], Awaitable[memoryview | None]]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"


class PeerServer:
    """Serves ``lookup``'s chunks on ``config.host:config.port``; see the module docstring.
    ``tenant()`` is the tenant this peer is bound to (None until a tracker said)."""

    def __init__(self, config: PeerConfig, serve_key: ServeKey, lookup: Lookup, tenant: Callable[[], str | None]) -> None:
        self._config = config
        self._serve_key = serve_key
        self._lookup = lookup
        self._tenant = tenant
        self._stack: AsyncExitStack | None = None
        self.address = ""
        self.uploads = 0  # sending now
        self._sending = asyncio.Semaphore(config.max_uploads)
        self.counts: Counter[str] = Counter()

    async def start(self) -> str:
        """Listen; the address to advertise (``advertise``, else ``http://HOST:PORT`` as bound)."""
        app = web.Application(middlewares=[self._errors])
        app.router.add_get("/v1/chunks/{key}", self._chunk, allow_head=False)
        app.router.add_get("/healthz", _healthz, allow_head=False)
        stack = AsyncExitStack()
        try:
            port = await stack.enter_async_context(listening(app, self._config.host, self._config.port))
        except OSError as exc:
            raise Unavailable(f"[peer] cannot listen on {self._config.host}:{self._config.port}: {exc.strerror or exc}") from exc
        self._stack = stack
        host = f"[{self._config.host}]" if ":" in self._config.host else self._config.host
        self.address = (self._config.advertise or f"http://{host}:{port}").rstrip("/")
        return self.address

    async def aclose(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _chunk(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        ref = ref_from_query(request.query)
        if ref.key != key:
            raise BadRequest(f"the chunk reference in the query is not that of chunk {key}")
        tenant = self._tenant()
        if tenant is None:
            raise Unavailable("this peer has not registered with a tracker yet")
        self._serve_key.verify(request.headers.get(TICKET_HEADER), tenant, key, time.time())
        if self.uploads >= self._config.max_uploads:
            self.counts["refused"] += 1
            raise PeerBusy(f"peer busy: {self.uploads} uploads in flight, at most {self._config.max_uploads}")
        sending = False
        try:
            async with self._beating(request, progress_every(request)):
                raw = await self._lookup(ref)
                if raw is None:
                    self.counts["missing"] += 1
                    raise BlobNotFound(f"chunk {key}: this peer does not hold it (any more)")
                await self._sending.acquire()
                sending = True
            self.uploads += 1
            try:
                return await self._send(request, raw)
            finally:
                self.uploads -= 1
        finally:
            if sending:
                self._sending.release()

    @asynccontextmanager
    async def _beating(self, request: web.Request, every: float | None) -> AsyncIterator[None]:
        """While the body waits (for a chunk still landing here, then for an upload slot), an
        interim ``102 Processing`` every ``every`` seconds if the child asked for it: it then
        tells this peer's silence (stopped, cut off) from its wait, and leaves a silent one
        after its own ``timeout_s`` rather than at the end of ``wait_s``."""
        if every is None:
            yield
            return
        beat = asyncio.ensure_future(self._beat(request, every))
        try:
            yield
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)

    async def _beat(self, request: web.Request, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            await request.writer.write(PROCESSING)  # whole, so the reply's head never meets half of one
            self.counts["beats"] += 1

    async def _send(self, request: web.Request, raw: memoryview) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = raw.nbytes
        try:
            async with asyncio.timeout(self._config.timeout_s):
                await response.prepare(request)
                await response.write(raw)
                await response.write_eof()
        except (ConnectionResetError, TimeoutError):  # the child left (a hedge's loser) or stopped reading
            self.counts["aborted"] += 1
            end_connection(request)
            return response
        self.counts["uploads"] += 1
        self.counts["bytes_served"] += raw.nbytes
        return response

    @web.middleware
    async def _errors(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BlobError as exc:
            self.counts[f"answered_{exc.http_status}"] += 1
            body = msgspec.msgpack.encode(ErrorBody(code=exc.code, message=str(exc)))
            return web.Response(body=body, status=exc.http_status, content_type=MSGPACK)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")
