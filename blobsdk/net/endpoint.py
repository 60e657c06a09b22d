"""One server as the SDK's data path sees it: the three things every client of a block
server, an L3 node or (later) a peer needs, owned together for one base URL.

- control requests (msgpack calls, PUTs, deletes, stats) over the caller's long-lived
  ``aiohttp.ClientSession`` (:class:`~blobsdk.net.rpc.HttpEndpoint`);
- data GETs on keep-alive connections of its own, the body received straight into the
  caller's buffer (:class:`~blobsdk.net.rawget.RawGetEndpoint`);
- the server's adaptive concurrency limit (:class:`~blobsdk.net.limiter.AdaptiveLimiter`), which
  every data GET waits for.

A data GET that is one attempt of a hedged read is handed that attempt's
:class:`~blobsdk.chunks.call.Call`: it queues at the limiter at its demand's priority, marked
queued while it waits for a permit and in service once it has one, so the hedger never hedges
a read that is only waiting its turn in this client; an interim ``102 Processing`` from the
server is its ``progress()``, and every arrival of the reply's bytes its ``receiving()``.  The
permit is told, by the GET itself, when the server sheds the request or it times out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import aiohttp

from ..chunks import Call
from .limiter import AdaptiveLimiter
from .rawget import RawGetEndpoint
from .rpc import HttpEndpoint
from .unreachable import SERVER, Role

T = TypeVar("T")


class Endpoint:
    """One server's control requests, data GETs and concurrency limit.

    Uses, and never closes, ``session``; ``token`` is the server's bearer token; ``limiter``
    defaults to a limiter of its own; ``timeout`` bounds each request (default: the
    session's); ``stall_s`` bounds a data GET's body's silences (None: only the timeout's
    ``sock_read``; see blobsdk/net/rawget.py); ``role``: which server it is, for the error
    when nothing answers there (blobsdk/net/unreachable.py).  :meth:`aclose` closes the data
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
