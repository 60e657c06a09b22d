"""A child waiting at a peer for a chunk that peer is fetching gets a miss as soon as that
fetch ends without the chunk (blobsdk/peer/sharing.py, ``Expecting``), not when its
``wait_s`` runs out: a real cluster and tracker, as tests/tiers/test_peer.py (whose fixtures
these are), and the child's request over HTTP to the source's peer server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from aiohttp import web

from blobsdk.config import PeerConfig
from blobsdk.errors import Unavailable
from blobsdk.wire import MSGPACK, ErrorBody
from servers._common.http import progress_while
from tests.helpers import running_app
from tests.tiers.test_peer import Swarm, cluster, hits, peer_of, swarm, until, written
from tests.tiers.test_peer_ask_again import fetchers

__all__ = ["cluster", "swarm"]  # the fixtures, shared with test_peer.py

HOUR = 3600.0  # a wait no test outlives: a child freed only by it would fail the test


class StuckBlocks:
    """A block server whose reads wait, saying ``102 Processing`` as one whose spindles are
    busy does, until ``release``; then each fails (503)."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/blocks/{block_id}", self._read, allow_head=False)
        return app

    async def _read(self, request: web.Request) -> web.Response:
        self.reading.set()
        async with progress_while(request):
            await self.release.wait()
        body = msgspec.msgpack.encode(ErrorBody(code="unavailable", message="the disk failed"))
        return web.Response(body=body, status=503, content_type=MSGPACK)


@pytest.mark.parametrize("ending", ["fails", "is cancelled"])
async def test_a_child_waiting_at_a_source_whose_own_fetch_ends_without_the_chunk_falls_back_at_once(
    swarm: Swarm, ending: str
) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/failing", 1)
    (ref,) = (await writer.plan("/p/failing")).chunks
    stuck = StuckBlocks()
    async with running_app(stuck.app()) as blocks_url:
        try:
            source = await swarm.client(PeerConfig(wait_s=HOUR), block_urls=(blocks_url,))
            fetching = asyncio.create_task(source.get("/p/failing"))
            async with asyncio.timeout(30):
                await stuck.reading.wait()  # its peer tier missed (the tracker's first asker): now from L4
            child = await swarm.client(PeerConfig(wait_s=HOUR))  # asks for a 102 every quarter of its timeout_s
            reading = asyncio.create_task(child.get("/p/failing"))
            server = peer_of(source).sharing.server
            await until(lambda: server.counts["beats"] >= 1)  # the child waits at the source, hearing 102s
            if ending == "fails":
                stuck.release.set()
                with pytest.raises(Unavailable) as failed:
                    await fetching
                assert str(failed.value) == f"chunk {ref.key}: every replica failed; last error: the disk failed"
            else:
                fetching.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await fetching
            async with asyncio.timeout(60):  # its wait (an hour) would end far later
                assert await reading == data  # a miss at the source, then from L4
        finally:
            stuck.release.set()
    assert hits(child) == {"peer": 0, "l4": 1} and child.stats()["peer"]["errors"] == 0  # a 404 is no fault
    assert source.stats()["peer"]["uploads_missing"] == 1
    await until(lambda: fetchers(swarm) == 0)  # the source told the tracker it gave up
