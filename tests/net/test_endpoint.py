"""blobsdk.net.endpoint: one server's control requests, data GETs and
concurrency limit, against a real block server on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from blobsdk.chunks.call import Call
from blobsdk.config import LimiterConfig
from blobsdk.errors import BlockNotFound, InsufficientStorage, TimedOut, error_from_code
from blobsdk.net.endpoint import Endpoint
from blobsdk.net.limiter import AdaptiveLimiter
from blobsdk.sources import HttpBlockStore
from blobsdk.sources.base import new_block_id
from servers.blockstore import make_app
from tests.helpers import running_app


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[aiohttp.ClientSession, str, str]]:
    """A session, a block server's URL and the id of a 10-byte block on it."""
    async with aiohttp.ClientSession() as session, running_app(make_app(tmp_path / "blocks")) as url:
        block = new_block_id()
        async with HttpBlockStore(session, url) as store:
            await store.write_block(block, [b"0123456789"])
        yield session, url, block


async def test_a_data_get_marks_its_attempt_queued_until_it_has_a_permit(served) -> None:
    session, url, block = served
    limiter = AdaptiveLimiter(url, LimiterConfig(initial=1, min_limit=1, max_limit=1))
    endpoint = Endpoint(session, url, limiter=limiter)
    attempt = Call()
    out = memoryview(bytearray(4))
    try:
        async with limiter.acquire():  # the only slot is taken
            get = asyncio.create_task(
                endpoint.get_into(f"/v1/blocks/{block}", out, expect=206, headers={"Range": "bytes=2-5"}, call=attempt)
            )
            await asyncio.sleep(0.05)
            assert attempt.serving is False and not endpoint.has_room
        await get
        assert attempt.serving is True and bytes(out) == b"2345"
    finally:
        await endpoint.aclose()


async def test_a_data_get_that_times_out_tells_its_permit() -> None:
    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await done.wait()  # never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    timeout = aiohttp.ClientTimeout(total=5, connect=1, sock_read=0.1)
    try:
        async with aiohttp.ClientSession() as session:
            endpoint = Endpoint(session, url, timeout=timeout)
            with pytest.raises(TimedOut, match="timed out waiting for the server"):
                await endpoint.get_into("/x", memoryview(bytearray(4)))
            await endpoint.aclose()
        assert endpoint.limiter.stats()["drops"] == 1
    finally:
        done.set()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.01)


async def test_a_control_error_reply_is_the_blobsdk_error_it_encodes(served) -> None:
    session, url, _ = served
    endpoint = Endpoint(session, url)
    with pytest.raises(BlockNotFound):
        await endpoint.read("GET", f"/v1/blocks/{new_block_id()}")
    await endpoint.aclose()


async def test_an_error_raised_by_the_callers_own_code_is_not_relabelled(served) -> None:
    session, url, block = served
    endpoint = Endpoint(session, url)
    with pytest.raises(ConnectionResetError, match=r"^the caller's own$"):
        async with endpoint.control.request("GET", f"/v1/blocks/{block}"):
            raise ConnectionResetError("the caller's own")  # an OSError: once relabelled Unavailable
    with pytest.raises(TimeoutError, match=r"^the caller's deadline$"):
        async with endpoint.control.request("GET", f"/v1/blocks/{block}"):
            raise TimeoutError("the caller's deadline")
    await endpoint.aclose()


def test_insufficient_storage_has_a_client_side_class() -> None:
    error = error_from_code("insufficient_storage", "cache full")
    assert type(error) is InsufficientStorage and str(error) == "cache full"
