"""An S3 endpoint that throttles and stalls: moto's S3 server (servers/s3d.py) behind a small
aiohttp proxy, in the test's own loop, that injects on ranged GETs what S3 does under load
and moto cannot fake.

- :meth:`S3FaultProxy.throttle`: every ranged GET that arrives within ``seconds`` of the
  first one after the call is refused (503 SlowDown by default, or 429, or 500
  InternalError), with S3's XML error body;
- ``stall``: the ranged GETs of these arrival numbers (1 for the first) send their head and
  half their body, then nothing, until the client hangs up.  ``garbage``: that half is not
  the object's bytes but 0xEE, so a retry that left any of it in the reader's buffer shows.

Every other request goes to moto as it came (moto checks no signature), and its answer
comes back whole.  ``outcomes`` records each ranged GET: "throttled", "stalled" or the
status moto answered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import AsyncExitStack

import aiohttp
from aiohttp import web
from yarl import URL

from tests.helpers import running_app

FORWARDED = ("Range", "If-Match", "Authorization", "x-amz-date", "x-amz-content-sha256")
ANSWERED = ("Content-Range", "Content-Type", "ETag", "Last-Modified")
GARBAGE = 0xEE


def s3_error(status: int, code: str) -> web.Response:
    body = f"<Error><Code>{code}</Code><Message>injected by the test</Message></Error>".encode()
    return web.Response(status=status, body=body, content_type="application/xml")


class S3FaultProxy:
    """See the module docstring.  ``async with S3FaultProxy(moto.endpoint) as proxy``:
    ``proxy.url`` is the endpoint to read from."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self.stall: set[int] = set()
        self.garbage = False
        self.outcomes: list[str] = []
        self.arrived = 0  # ranged GETs so far
        self._throttle: tuple[float, int, str] | None = None  # seconds, status, code
        self._throttle_until: float | None = None
        self._released = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._stack = AsyncExitStack()

    def throttle(self, seconds: float, status: int = 503, code: str = "SlowDown") -> None:
        """Refuse every ranged GET from the next one on, for ``seconds``."""
        self._throttle, self._throttle_until = (seconds, status, code), None

    def count(self, outcome: str) -> int:
        return Counter(self.outcomes)[outcome]

    async def __aenter__(self) -> S3FaultProxy:
        async with AsyncExitStack() as stack:
            self._session = await stack.enter_async_context(aiohttp.ClientSession(auto_decompress=False))
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            app.on_shutdown.append(self._release)
            self.url = await stack.enter_async_context(running_app(app))
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _release(self, app: web.Application) -> None:
        self._released.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET" or "Range" not in request.headers:
            return await self._forward(request)
        self.arrived += 1
        number = self.arrived
        refusal = self._refusal()
        if refusal is not None:
            self.outcomes.append("throttled")
            return refusal
        status, headers, body = await self._upstream(request)
        if number in self.stall and status == 206:
            self.outcomes.append("stalled")
            return await self._stalled(request, headers, body)
        self.outcomes.append(str(status))
        return web.Response(status=status, body=body, headers=headers)

    def _refusal(self) -> web.Response | None:
        if self._throttle is None:
            return None
        seconds, status, code = self._throttle
        now = asyncio.get_running_loop().time()
        if self._throttle_until is None:
            self._throttle_until = now + seconds
        return s3_error(status, code) if now < self._throttle_until else None

    async def _upstream(self, request: web.Request) -> tuple[int, dict[str, str], bytes]:
        assert self._session is not None
        headers = {k: request.headers[k] for k in FORWARDED if k in request.headers}
        async with self._session.get(URL(self.upstream + request.raw_path, encoded=True), headers=headers) as answer:
            body = await answer.read()
            return answer.status, {k: answer.headers[k] for k in ANSWERED if k in answer.headers}, body

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        url = URL(self.upstream + request.raw_path, encoded=True)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(request.method, url, headers=headers, data=await request.read()) as answer:
            body = await answer.read()
            kept = {k: answer.headers[k] for k in ANSWERED if k in answer.headers}
            return web.Response(status=answer.status, body=body, headers=kept)

    async def _stalled(self, request: web.Request, headers: dict[str, str], body: bytes) -> web.StreamResponse:
        """The head and half the body (or as many bytes of garbage), then nothing until the
        client hangs up (its handler is cancelled then) or the server shuts down."""
        answer = web.StreamResponse(status=206, headers=headers)
        answer.content_length = len(body)
        await answer.prepare(request)
        half = len(body) // 2
        await answer.write(bytes([GARBAGE]) * half if self.garbage else body[:half])
        await self._released.wait()
        return answer
