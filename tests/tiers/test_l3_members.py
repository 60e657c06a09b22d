"""blobsdk/tiers/_l3.py: the member set changed while reads run (``L3Tier.set_urls``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from blobsdk.chunks import rank
from blobsdk.config import HedgeConfig, L3Config
from blobsdk.tiers import L3Tier
from blobsdk.wire import CACHE_HEADER, ChunkRef
from tests.helpers import running_app
from tests.servers.test_flash import Env, chunks
from tests.tiers.test_l3 import env, flash_nodes
from tests.tiers.test_l4 import decode, pack

__all__ = ["env"]  # the fixture, imported to be used here

IN_TURN = HedgeConfig(enabled=False)  # one attempt at a time, no hang deadline: each step is the test's


@asynccontextmanager
async def gated_node(
    raws: dict[str, bytes], entered: asyncio.Event, release: asyncio.Event, status: int = 200, asked: list[str] | None = None
) -> AsyncIterator[str]:
    """A node that, on a chunk GET, notes its URL in ``asked``, sets ``entered``, waits for
    ``release``, then answers the right bytes (``raws`` by key) if ``status`` is 200, else
    ``status`` with no body."""

    async def chunk(request: web.Request) -> web.Response:
        (asked if asked is not None else []).append(str(request.url.origin()))
        entered.set()
        await release.wait()
        if status != 200:
            return web.Response(status=status)
        return web.Response(body=raws[request.match_info["key"]], headers={CACHE_HEADER: "hit"})

    app = web.Application()
    app.router.add_get("/v1/chunks/{key}", chunk)
    async with running_app(app) as url:
        yield url


async def stored(env: Env, n: int) -> tuple[list[ChunkRef], dict[str, bytes]]:
    await env.start(2)
    raws = [os.urandom(4096) for _ in range(n)]
    refs = await pack(env.blocks, raws)
    return refs, {ref.key: raw for ref, raw in zip(refs, raws, strict=True)}


async def test_added_and_removed_nodes_take_their_keys_and_stats_show_it(env: Env) -> None:
    refs = await chunks(env, 24)
    nodes = await flash_nodes(env, 4)
    urls = list(nodes)
    tier = L3Tier(env.session, urls[:3], L3Config(replicas=1), hedge=IN_TURN)
    await tier.set_urls([*urls[:3], urls[3] + "/"])  # a trailing slash names the same node
    assert tier.urls == urls
    for ref in refs:
        assert await tier.fetch(ref, decode) is not None
    for url, (node, _) in nodes.items():  # each chunk went to its first node of the four
        assert {r.key for r in refs if node.cache.contains(r.key)} == {r.key for r in refs if rank(r.key, urls)[0] == url}
    await tier.set_urls(urls[1:])
    assert tier.urls == urls[1:]
    assert all(tier.candidates(ref.key) == [rank(ref.key, urls[1:])[0]] for ref in refs)
    extra = tier.extra_stats()
    assert {k: extra[k] for k in ("nodes", "nodes_added", "nodes_removed", "nodes_down")} == {
        "nodes": 3,
        "nodes_added": 1,
        "nodes_removed": 1,
        "nodes_down": 0,
    }


async def test_a_read_in_flight_on_a_removed_node_finishes_with_its_bytes(env: Env) -> None:
    refs, raws = await stored(env, 1)
    (other,) = await flash_nodes(env, 1)
    entered, release = asyncio.Event(), asyncio.Event()
    async with gated_node(raws, entered, release) as gated:
        tier = L3Tier(env.session, [gated], hedge=IN_TURN)
        read = asyncio.create_task(tier.fetch(refs[0], decode))
        try:
            await entered.wait()  # the GET is at the node
            await tier.set_urls([other])
        finally:
            release.set()  # else the server waits for its handler on shutdown
        got = await read
    assert got is not None and bytes(got) == raws[refs[0].key]
    assert (tier.stats.hits, tier.stats.errors) == (1, 0)
    assert tier.urls == [other]


async def test_a_read_whose_nodes_were_all_removed_falls_through_and_marks_none_down(env: Env) -> None:
    refs, raws = await stored(env, 1)
    (other,) = await flash_nodes(env, 1)
    entered, release, asked = asyncio.Event(), asyncio.Event(), []
    async with (
        gated_node(raws, entered, release, status=503, asked=asked) as a,
        gated_node(raws, entered, release, status=503, asked=asked) as b,
    ):
        tier = L3Tier(env.session, [a, b], hedge=IN_TURN)
        first, _ = tier.candidates(refs[0].key)  # in the order the read asks them
        read = asyncio.create_task(tier.fetch(refs[0], decode))
        try:
            await entered.wait()
            await tier.set_urls([other])  # the read's second node is closed before it is asked
        finally:
            release.set()
        assert await read is None  # a miss: the read path goes on to L4
    assert asked == [first]  # the 503, then a refusal by the closed endpoint, not a request
    assert (tier.stats.misses, tier.stats.errors, tier.extra_stats()["nodes_down"]) == (1, 2, 0)
    assert tier.candidates(refs[0].key) == [other]


async def test_reads_running_across_an_add_and_a_remove_never_get_wrong_bytes(env: Env) -> None:
    refs, raws = await stored(env, 64)
    nodes = list(await flash_nodes(env, 4))
    tier = L3Tier(env.session, nodes[:3], L3Config(replicas=2))
    done = 0

    async def read(ref: ChunkRef) -> bytes | None:
        nonlocal done
        got = await tier.fetch(ref, decode)
        done += 1
        if done == 16:  # the other 48 reads are running: the set changes under them
            await tier.set_urls(nodes)
        elif done == 32:
            await tier.set_urls(nodes[1:])
        return None if got is None else bytes(got)

    results = await asyncio.gather(*(read(ref) for ref in refs))
    assert all(got is None or got == raws[ref.key] for ref, got in zip(refs, results, strict=True))
    assert tier.stats.corrupt == 0 and tier.urls == nodes[1:]
    again = [await tier.fetch(ref, decode) for ref in refs]
    assert all(got is not None and bytes(got) == raws[ref.key] for ref, got in zip(refs, again, strict=True))
