"""Read-your-writes through the API server when a plan answer arrives late (issue 20 item 1):
the API server's answers to POST /v1/plans are held until the test lets them go, so the
client's own put or delete commits between the server reading the plan and the client
receiving it.  Deterministic: events, no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from aiohttp import web

import blobsdk
from blobsdk.config import ClientConfig
from blobsdk.errors import BlobNotFound
from blobsdk.metadata import SqliteMetadataStore
from servers import api, blockstore
from tests.helpers import running_app


class LatePlans:
    """Holds the next answer of POST /v1/plans (computed when asked) until ``release``."""

    def __init__(self) -> None:
        self.armed = False
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    @web.middleware
    async def middleware(self, request: web.Request, handler: object) -> web.StreamResponse:
        response = await handler(request)  # type: ignore[operator]
        if self.armed and request.method == "POST" and request.path == "/v1/plans":
            self.armed = False
            self.asked.set()
            await self.release.wait()
        return response  # type: ignore[no-any-return]


@pytest.fixture
async def late(tmp_path: Path) -> AsyncIterator[tuple[ClientConfig, LatePlans]]:
    gate = LatePlans()
    async with AsyncExitStack() as stack:
        app = api.make_app(SqliteMetadataStore(tmp_path / "m.sqlite"))
        app.middlewares.insert(0, gate.middleware)
        api_url = await stack.enter_async_context(running_app(app))
        block_url = await stack.enter_async_context(running_app(blockstore.make_app(tmp_path / "blocks")))
        yield ClientConfig(api_url=api_url, block_urls=(block_url,)), gate
        gate.release.set()


async def test_a_late_plan_answer_never_hides_the_clients_own_put(late: tuple[ClientConfig, LatePlans]) -> None:
    config, gate = late
    async with blobsdk.Client(config) as other, blobsdk.Client(config) as me:
        await other.put("/b/x", b"old")  # not in my plan cache
        gate.armed = True
        reading = asyncio.ensure_future(me.get("/b/x"))
        await gate.asked.wait()  # the server answered version 1 ...
        assert (await me.put("/b/x", b"new")).version == 2  # ... my put commits version 2 ...
        gate.release.set()  # ... and then the answer arrives
        assert await reading == b"new"
        assert await me.get("/b/x") == b"new" and (await me.stat("/b/x")).version == 2


async def test_a_late_plan_answer_never_resurrects_the_clients_own_delete(late: tuple[ClientConfig, LatePlans]) -> None:
    config, gate = late
    async with blobsdk.Client(config) as other, blobsdk.Client(config) as me:
        await other.put("/b/x", b"old")
        gate.armed = True
        reading = asyncio.ensure_future(me.get("/b/x"))
        await gate.asked.wait()
        await me.delete("/b/x")
        gate.release.set()
        with pytest.raises(BlobNotFound, match=r"^no blob at '/b/x'$"):
            await reading
        with pytest.raises(BlobNotFound, match=r"^no blob at '/b/x'$"):
            await me.get("/b/x")
