from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from blobsdk.errors import BlockNotFound, PreconditionFailed, ReplyStalled, Unavailable
from blobsdk.sources import HttpBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.testing.sources import BlockReplicaTests
from servers.blockstore import make_app
from tests.helpers import running_app


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def store(tmp_path: Path, session: aiohttp.ClientSession) -> AsyncIterator[HttpBlockStore]:
    async with running_app(make_app(tmp_path / "blocks")) as url, HttpBlockStore(session, url) as s:
        yield s


class TestHttpBlockStore(BlockReplicaTests):
    pass


async def test_name_is_the_base_url(session: aiohttp.ClientSession) -> None:
    s = HttpBlockStore(session, "http://127.0.0.1:9/")
    assert s.name == "http://127.0.0.1:9" and s.replicas == (s,)


async def test_rewrite_with_another_size_is_refused(store: HttpBlockStore) -> None:
    block = new_block_id()
    await store.write_block(block, [b"abc"])
    with pytest.raises(PreconditionFailed):
        await store.write_block(block, [b"abcd"])


async def test_server_down_is_unavailable(session: aiohttp.ClientSession, tmp_path: Path) -> None:
    async with running_app(make_app(tmp_path)) as url:
        pass  # stopped: nothing listens on that port any more
    async with HttpBlockStore(session, url) as s:
        with pytest.raises(Unavailable):
            await s.read_range(new_block_id(), 0, 10)
        with pytest.raises(Unavailable):
            await s.write_block(new_block_id(), [b"x"])


async def test_many_pages_of_listing(store: HttpBlockStore) -> None:
    blocks = sorted(new_block_id() for _ in range(7))
    for b in blocks:
        await store.write_block(b, [b"x"])
    assert [i.block_id async for i in store.list_blocks(page_size=2)] == blocks


# --- servers that answer wrongly: the client must notice ----------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def liar(session: aiohttp.ClientSession, handler: Handler, stall_s: float | None = None) -> AsyncIterator[HttpBlockStore]:
    app = web.Application()
    app.router.add_get("/v1/blocks/{block_id}", handler)
    async with running_app(app) as url, HttpBlockStore(session, url, stall_s=stall_s) as store:
        yield store


async def truncated(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=206)
    resp.content_length = 1000
    await resp.prepare(request)
    await resp.write(b"x" * 10)
    request.transport.close()  # hang up 990 bytes early
    return resp


async def too_long(request: web.Request) -> web.Response:
    return web.Response(status=206, body=b"x" * 1001)


async def whole_block(request: web.Request) -> web.Response:
    return web.Response(status=200, body=b"x" * 1000)  # ignored the Range


async def chunked_longer(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=206)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(b"x" * 1500)
    await resp.write_eof()
    return resp


async def chunked_shorter(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=206)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(b"x" * 999)
    await resp.write_eof()
    return resp


async def not_found(request: web.Request) -> web.Response:
    return web.Response(status=404, body=b'{"code": "block_not_found", "message": "gone"}')


@pytest.mark.parametrize("handler", [truncated, too_long, whole_block, chunked_longer, chunked_shorter])
async def test_a_body_that_is_not_exactly_the_range_is_unavailable(session: aiohttp.ClientSession, handler: Handler) -> None:
    async with liar(session, handler) as s:
        with pytest.raises(Unavailable):
            await s.read_into(new_block_id(), 0, memoryview(bytearray(1000)))
        with pytest.raises(Unavailable):
            await s.read_range(new_block_id(), 0, 1000)


async def test_error_body_code_maps_to_block_not_found(session: aiohttp.ClientSession) -> None:
    async with liar(session, not_found) as s:
        with pytest.raises(BlockNotFound):
            await s.read_range(new_block_id(), 0, 10)


async def stalled_mid_body(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=206)
    resp.content_length = 1000
    await resp.prepare(request)
    await resp.write(b"x" * 400)
    await asyncio.Event().wait()  # nothing more: cancelled when the client hangs up
    return resp


async def test_a_body_that_stalls_mid_transfer_fails_after_the_stall_bound_not_sock_read(tmp_path: Path) -> None:
    """The block servers' reads share the S3 reads' stall bound (blobsdk/net/rawget.py): a
    body silent for ``stall_s`` fails that read (ReplyStalled, a TimedOut), which the L4 tier
    fails over, where it waited out the session's ``sock_read`` (30 s here) before."""
    timeout = aiohttp.ClientTimeout(total=60.0, sock_read=30.0)
    async with aiohttp.ClientSession(timeout=timeout) as session, liar(session, stalled_mid_body, stall_s=0.2) as s:
        begun = time.monotonic()
        with pytest.raises(ReplyStalled, match=r"^GET http://127\.0\.0\.1:\d+/v1/blocks/\w+: the reply's body stalled after 400"):
            await s.read_range(new_block_id(), 0, 1000)
        assert time.monotonic() - begun < 10.0  # a failure guard: the 0.2 s bound, not the 30 s sock_read
