"""L4 through one block server (``servers/blockstore.py``) over HTTP.

Block bytes travel raw: a PUT streams the caller's parts as the body, part by part, and a
ranged GET's body is received straight into the caller's buffer (``_rawget``: the data
path's lean GET; aiohttp for the rest).  A response that is not exactly the bytes asked
for is an error (Unavailable), never a short read.  A read asks the server for ``102
Processing`` while it queues there (``X-Blobsdk-Progress``; servers/blockstore.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlencode

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

from ..auth import GRANT_HEADER
from ..chunks import Call, validate_block_id
from ..errors import BadRequest
from ..net import BLOCK_SERVER, AdaptiveLimiter, Endpoint
from ..runtime import AsyncResource
from ..wire import PROGRESS_HEADER, BlockInfo, ListBlocksResponse
from .base import Buffer

OCTETS = "application/octet-stream"
LIST_PAGE = 1000
# A read queued behind others at the server hears ``102 Processing`` this often: twice
# within the shortest hang deadline by default (``[hedge] hang_min_ms``, 500), so a busy
# server's queue is never taken for a hang, nor hedged into.
PROGRESS_MS = "250"


class HttpBlockStore(AsyncResource):
    """A :class:`~blobsdk.sources.base.BlockStore` served by one L4 block server.

    Uses, and never closes, the caller's long-lived ``aiohttp.ClientSession`` (data reads
    use connections of their own, with the session's timeouts, closed by :meth:`aclose`);
    ``token`` is the server's bearer token, if it requires one.  Data reads go through
    ``limiter``, the endpoint's adaptive concurrency limit (writes are bounded by the
    writer instead); see :class:`~blobsdk.net.endpoint.Endpoint`.  ``stall_s``: a read whose
    body stops arriving for this long fails (ReplyStalled), and the L4 tier fails over.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        token: str | None = None,
        *,
        limiter: AdaptiveLimiter | None = None,
        stall_s: float | None = None,
    ) -> None:
        self.endpoint = Endpoint(session, base_url, token, limiter=limiter, stall_s=stall_s, role=BLOCK_SERVER)
        self._http = self.endpoint.control

    @property
    def name(self) -> str:
        return self.endpoint.base_url

    @property
    def limiter(self) -> AdaptiveLimiter:
        return self.endpoint.limiter

    @property
    def replicas(self) -> tuple[HttpBlockStore]:
        return (self,)

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        headers = {**self._http.headers, "Content-Type": OCTETS}
        async with self._http.request("PUT", _route(block_id), data=_PartsPayload(parts), headers=headers):
            pass  # 201: the server answers only once the block is durable

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        view = memoryview(out).cast("B")
        route = _route(block_id)
        if _check_span(offset, view.nbytes) == 0:
            return
        headers = {"Range": f"bytes={offset}-{offset + view.nbytes - 1}", PROGRESS_HEADER: PROGRESS_MS}
        if call is not None and call.grant:
            headers[GRANT_HEADER] = call.grant
        await self.endpoint.get_into(route, view, expect=206, headers=headers, call=call)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        _route(block_id)  # checked before the buffer is made, as read_into checks it
        buf = bytearray(_check_span(offset, length))
        await self.read_into(block_id, offset, memoryview(buf))
        return bytes(buf)

    async def delete_block(self, block_id: str) -> None:
        async with self._http.request("DELETE", _route(block_id)):
            pass

    async def list_blocks(self, page_size: int = LIST_PAGE) -> AsyncIterator[BlockInfo]:
        """Every block, sorted by id, fetched ``page_size`` at a time."""
        start_after = ""
        while True:
            query = urlencode({"start_after": start_after, "limit": page_size})
            page = await self._http.call("GET", f"/v1/blocks?{query}", None, ListBlocksResponse)
            for info in page.blocks:
                yield info
            if page.next_start_after is None:
                return
            start_after = page.next_start_after

    async def aclose(self) -> None:
        """Close the data-read connections (the session belongs to the caller)."""
        await self.endpoint.aclose()


class _PartsPayload(Payload):
    """A block's parts as one request body with a known length, written part by part (no
    joined copy).  Reusable: aiohttp may resend it on a fresh connection."""

    def __init__(self, parts: Sequence[Buffer]) -> None:
        views = [memoryview(p).cast("B") for p in parts]
        super().__init__(views, content_type=OCTETS)
        self._size = sum(v.nbytes for v in views)

    async def write(self, writer: AbstractStreamWriter) -> None:
        for view in self._value:
            await writer.write(view)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        await self.write(writer)  # our size is exact, so the length never cuts a part

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._value).decode(encoding, errors)


def _route(block_id: str) -> str:
    """The block's URL path, the id checked where it becomes one."""
    return f"/v1/blocks/{validate_block_id(block_id)}"


def _check_span(offset: int, length: int) -> int:
    if offset < 0 or length < 0:
        raise BadRequest(f"offset and length must not be negative, got {offset} and {length}")
    return length
