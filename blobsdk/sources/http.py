"""L4 through one block server (``servers/blockstore.py``) over HTTP.

Block bytes travel raw: a PUT streams the caller's parts as the body, part by part, and a
ranged GET is copied piece by piece straight into the caller's buffer.  A response that is
not exactly the bytes asked for is an error (Unavailable), never a short read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Self
from urllib.parse import urlencode

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

from .._http import HttpEndpoint, read_exactly
from ..errors import Unavailable
from ..limiter import AdaptiveLimiter
from ..wire import BlockInfo, ListBlocksResponse
from .base import Buffer, validate_block_id

OCTETS = "application/octet-stream"
LIST_PAGE = 1000


class HttpBlockStore:
    """A :class:`~blobsdk.sources.base.BlockStore` served by one L4 block server.

    Uses, and never closes, the caller's long-lived ``aiohttp.ClientSession``; ``token`` is
    the server's bearer token, if it requires one.  Data reads go through ``limiter``, the
    endpoint's adaptive concurrency limit (writes are bounded by the writer instead).
    """

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, token: str | None = None, *, limiter: AdaptiveLimiter | None = None
    ) -> None:
        self._http = HttpEndpoint(session, base_url, token)
        self.limiter = limiter if limiter is not None else AdaptiveLimiter(self._http.base_url)

    @property
    def name(self) -> str:
        return self._http.base_url

    @property
    def replicas(self) -> tuple[HttpBlockStore]:
        return (self,)

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        headers = {**self._http.headers, "Content-Type": OCTETS}
        async with self._http.request("PUT", _route(block_id), data=_PartsPayload(parts), headers=headers):
            pass  # 201: the server answers only once the block is durable

    async def read_into(self, block_id: str, offset: int, out: memoryview) -> None:
        view = memoryview(out).cast("B")
        if _check_span(block_id, offset, view.nbytes) == 0:
            return
        async with self._get_range(block_id, offset, view.nbytes) as resp:
            await read_exactly(resp, view)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        if _check_span(block_id, offset, length) == 0:
            return b""
        async with self._get_range(block_id, offset, length) as resp:
            data = await resp.read()
        if len(data) != length:
            raise Unavailable(f"{resp.url}: got {len(data)} bytes, asked for {length}")
        return data

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
        """Nothing to release: the session belongs to the caller."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @asynccontextmanager
    async def _get_range(self, block_id: str, offset: int, length: int) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET of exactly ``length`` bytes at ``offset``, its headers checked."""
        headers = {**self._http.headers, "Range": f"bytes={offset}-{offset + length - 1}"}
        async with (
            self.limiter.acquire(size=length) as permit,
            self._http.request("GET", _route(block_id), headers=headers, permit=permit) as resp,
        ):
            if resp.status != 206:
                raise Unavailable(f"{resp.url}: expected 206 Partial Content, got {resp.status}")
            if resp.content_length is not None and resp.content_length != length:
                raise Unavailable(f"{resp.url}: Content-Length {resp.content_length}, asked for {length}")
            yield resp


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
    return f"/v1/blocks/{validate_block_id(block_id)}"


def _check_span(block_id: str, offset: int, length: int) -> int:
    validate_block_id(block_id)
    if offset < 0 or length < 0:
        raise ValueError(f"offset and length must not be negative, got {offset} and {length}")
    return length
