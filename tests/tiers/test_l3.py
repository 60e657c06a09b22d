"""blobsdk/tiers/_l3.py: the L3 tier against real (in-loop) flash nodes over block servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from blobsdk.chunks import rank
from blobsdk.chunks.codec import decode_chunk
from blobsdk.config import HedgeConfig, L3Config
from blobsdk.tiers import HydrateJob, L3Tier
from blobsdk.tiers.base import Tier
from blobsdk.wire import CACHE_HEADER, ChunkRef
from servers.flash import FlashNode
from tests.helpers import running_app
from tests.servers.test_flash import CHUNK, TENANCY, TOK_A, CountingStore, Env, FakeClock, chunks, for_a
from tests.tiers.test_l4 import decode, pack


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        yield Env(tmp_path, session, stack)


async def flash_nodes(env: Env, n: int, **config: object) -> dict[str, tuple[FlashNode, AsyncExitStack]]:
    """``n`` flash nodes, each stoppable on its own: url -> (node, its stack)."""
    nodes = {}
    for i in range(n):
        stack = AsyncExitStack()
        env.stack.push_async_callback(stack.aclose)
        url, node = await env.node(f"flash{i}", stack=stack, **config)
        nodes[url] = (node, stack)
    return nodes


@asynccontextmanager
async def fake_node(answer: str, release: asyncio.Event | None = None) -> AsyncIterator[str]:
    """A node that answers every chunk GET wrongly: "zeros" (the right length, wrong
    bytes), "long"/"short" (one byte more or less), or "hang" (until ``release``)."""

    async def chunk(request: web.Request) -> web.Response:
        length = int(request.query["length"])
        if answer == "hang":
            assert release is not None
            await release.wait()
        sizes = {"zeros": length, "long": length + 1, "short": length - 1, "hang": length}
        return web.Response(body=bytes(sizes[answer]), headers={CACHE_HEADER: "hit"})

    app = web.Application()
    app.router.add_get("/v1/chunks/{key}", chunk)
    async with running_app(app) as url:
        yield url


async def test_serves_verified_bytes_and_counts_where_nodes_found_them(env: Env) -> None:
    await env.start(2)
    raws = [os.urandom(CHUNK) for _ in range(5)] + [b"squeeze me " * 3000]
    refs = await pack(env.blocks, raws, "auto")
    nodes = await flash_nodes(env, 3)
    tier = L3Tier(env.session, list(nodes), L3Config(replicas=2), hedge=HedgeConfig(enabled=False))  # exact counts
    assert isinstance(tier, Tier) and tier.name == "l3"
    for _ in range(2):
        assert [bytes(await tier.fetch(ref, decode)) for ref in refs] == raws
    assert (tier.stats.hits, tier.stats.misses, tier.stats.corrupt, tier.stats.errors) == (12, 0, 0, 0)
    extra = tier.extra_stats()
    assert {k: extra[k] for k in ("node_hits", "node_fills", "nodes_down")} == {"node_hits": 6, "node_fills": 6, "nodes_down": 0}
    assert extra["hedge_primaries"] == 12 and extra["hedge_hedges_sent"] == 0
    for ref in refs:  # each chunk was read through by its first node only
        holders = [url for url, (node, _) in nodes.items() if node.cache.contains(ref.key)]
        assert holders == [rank(ref.key, list(nodes))[0]]


async def test_a_dead_node_is_skipped_marked_down_and_retried_later(env: Env) -> None:
    refs = await chunks(env, 8)
    nodes = await flash_nodes(env, 3)
    clock = FakeClock()
    tier = L3Tier(env.session, list(nodes), L3Config(down_seconds=5.0), clock=clock)
    dead = rank(refs[0].key, list(nodes))[0]
    await nodes[dead][1].aclose()
    assert await tier.fetch(refs[0], decode) is not None
    assert (tier.stats.hits, tier.stats.errors, tier.extra_stats()["nodes_down"]) == (1, 1, 1)
    assert all(dead not in tier.candidates(ref.key) for ref in refs)
    for ref in refs:
        assert await tier.fetch(ref, decode) is not None
    assert tier.stats.errors == 1  # skipped, not asked again
    clock.now += 5.0
    assert dead in tier.candidates(refs[0].key)


async def test_a_node_serving_bad_bytes_is_never_believed(env: Env) -> None:
    await env.start(2)
    raws = [os.urandom(1000) for _ in range(32)]
    refs = await pack(env.blocks, raws)
    (good,) = await flash_nodes(env, 1)
    async with fake_node("zeros") as bad:
        tier = L3Tier(env.session, [bad, good])
        bad_first = [i for i, ref in enumerate(refs) if rank(ref.key, [bad, good])[0] == bad]
        assert bad_first  # 32 keys: all on one node has odds of 2**-32
        for i in bad_first:
            assert bytes(await tier.fetch(refs[i], decode)) == raws[i]
        assert (tier.stats.corrupt, tier.stats.errors, tier.stats.hits) == (len(bad_first), 0, len(bad_first))
        alone = L3Tier(env.session, [bad])
        assert await alone.fetch(refs[0], decode) is None
        assert (alone.stats.corrupt, alone.stats.misses, alone.stats.hits) == (1, 1, 0)


async def test_a_body_of_the_wrong_length_is_an_error_never_a_copy(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    for answer in ("long", "short"):
        async with fake_node(answer) as url:
            tier = L3Tier(env.session, [url])
            assert await tier.fetch(ref, decode) is None
            assert (tier.stats.errors, tier.stats.corrupt, tier.stats.misses) == (1, 0, 1)


async def test_all_nodes_down_misses_at_once_once_they_are_marked(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    release = asyncio.Event()
    async with fake_node("hang", release) as a, fake_node("hang", release) as b:
        try:
            tier = L3Tier(env.session, [a, b], timeout=aiohttp.ClientTimeout(total=0.2))
            begun = time.perf_counter()
            assert await tier.fetch(ref, decode) is None
            assert time.perf_counter() - begun >= 0.4  # both timed out
            begun = time.perf_counter()
            assert await tier.fetch(ref, decode) is None
            assert time.perf_counter() - begun < 0.05 and tier.candidates(ref.key) == []
            assert (tier.stats.errors, tier.stats.misses) == (2, 2)
        finally:
            release.set()  # else the servers wait for their hanging handlers on shutdown


async def test_a_node_reading_through_past_the_hang_deadline_is_waited_for_so_l4_reads_each_chunk_once(env: Env) -> None:
    """A node whose read-through waits behind a busy L4 (here: held by an event) says ``102
    Processing`` meanwhile, so the client does not take it for hung: no read misses and
    falls through to L4, which sees each chunk once, the node's read.  (Before, each read
    outlived its hang deadline, missed, and the client read the chunk from L4 itself while
    the node read it too, or cancelled its read half done.)  The hedger's clock is fake and
    moves on in steps shorter than the deadline, each once the node has spoken since: six
    deadlines pass, and the node is never silent for one only if it says 102."""
    refs = await chunks(env, 4)
    source = CountingStore(env.blocks)
    source.gate.clear()
    url, _ = await env.node(blocks=source)
    clock = FakeClock()
    tier = L3Tier(env.session, [url], L3Config(replicas=1), hedge=HedgeConfig(hang_min_ms=100, hang_max_ms=100), clock=clock)
    client_reads = 0

    async def read(ref: ChunkRef) -> bytes:
        nonlocal client_reads
        raw = await tier.fetch(ref, decode)
        if raw is not None:
            return bytes(raw)
        client_reads += 1  # a miss: the client reads L4 itself
        return await l4_bytes(ref)

    async def l4_bytes(ref: ChunkRef) -> bytes:
        assert env.blocks is not None
        return bytes(decode_chunk(ref, memoryview(await env.blocks.replicas[0].read_range(ref.block_id, ref.offset, ref.length))))

    readers = [asyncio.create_task(read(ref)) for ref in refs]
    while source.reads < len(refs):
        await asyncio.sleep(0.01)
    for _ in range(10):
        clock.now += 0.06
        with contextlib.suppress(TimeoutError):  # without a 102 it may never speak: go on
            async with asyncio.timeout(1.0):
                while tier.hedger.health.silent_since(url, 0.0) < clock.now:
                    await asyncio.sleep(0.005)
    source.gate.set()
    got = await asyncio.gather(*readers)
    assert got == [await l4_bytes(ref) for ref in refs]
    stats = tier.extra_stats()
    assert (source.reads, client_reads, tier.stats.misses) == (len(refs), 0, 0), sorted(stats.items())
    assert (stats["node_fills"], stats["hedge_hung_failovers"]) == (len(refs), 0)


async def test_a_tenant_sends_its_grants_and_a_refused_read_is_a_miss_not_an_error(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    nodes = await flash_nodes(env, 1, auth=TENANCY.auth())
    tier = L3Tier(env.session, list(nodes), token=TOK_A)
    assert await tier.fetch(for_a(ref), decode) is not None
    assert await tier.fetch(ref, decode) is None  # no grant: 403
    wrong = L3Tier(env.session, list(nodes), token="nope")
    assert await wrong.fetch(for_a(ref), decode) is None  # 401
    for t in (tier, wrong):
        assert (t.stats.errors, t.extra_stats()["nodes_down"]) == (1, 0)  # the node itself is fine


async def test_a_tenant_hydrates_with_its_grants(env: Env) -> None:
    refs = await chunks(env, 2)
    nodes = await flash_nodes(env, 1, auth=TENANCY.auth())
    tier = L3Tier(env.session, list(nodes), L3Config(replicas=1), token=TOK_A)
    (status,) = await tier.wait_hydrated(await tier.hydrate([for_a(r) for r in refs]), poll_seconds=0.01)
    assert (status.state, status.done) == ("done", 2)
    (refused,) = await tier.hydrate(refs)  # without grants
    assert refused.job_id is None and "Forbidden: a chunk grant (header X-Blobsdk-Grant) is needed" in (refused.error or "")


async def test_hydrate_fills_every_replica_and_reports_progress(env: Env) -> None:
    refs = await chunks(env, 6)
    nodes = await flash_nodes(env, 3)
    tier = L3Tier(env.session, list(nodes), L3Config(replicas=2))
    jobs = await tier.hydrate(refs + refs[:2], pin_seconds=60)
    statuses = await tier.wait_hydrated(jobs, poll_seconds=0.01)
    assert {s.state for s in statuses} == {"done"}
    assert sum(s.done for s in statuses) == 12 and sum(s.bytes for s in statuses) == 12 * CHUNK
    for ref in refs:
        holders = {url for url, (node, _) in nodes.items() if node.cache.contains(ref.key)}
        assert holders == set(rank(ref.key, list(nodes))[:2])
        assert await tier.fetch(ref, decode) is not None
    assert tier.extra_stats()["node_hits"] == 6 and tier.extra_stats()["node_fills"] == 0


async def test_hydrate_to_a_dead_node_reports_a_failed_job(env: Env) -> None:
    refs = await chunks(env, 4)
    nodes = await flash_nodes(env, 2)
    dead, alive = list(nodes)
    await nodes[dead][1].aclose()
    tier = L3Tier(env.session, [dead, alive], L3Config(replicas=2))
    jobs = await tier.hydrate(refs)
    by_url = {job.url: job for job in jobs}
    assert by_url[dead].job_id is None and f"{dead}: Unreachable: cannot reach an L3 node at " in (by_url[dead].error or "")
    failed = await tier.hydrate_status(by_url[dead])
    assert (failed.state, failed.failed) == ("failed", 4)
    (done,) = [s for s in await tier.wait_hydrated(jobs, poll_seconds=0.01) if s.state == "done"]
    assert done.done == 4


async def test_waiting_for_a_job_whose_node_died_fails_it(env: Env) -> None:
    refs = await chunks(env, 2)
    nodes = await flash_nodes(env, 1)
    (url,) = nodes
    await nodes[url][1].aclose()
    tier = L3Tier(env.session, [url])
    (status,) = await tier.wait_hydrated([HydrateJob(url, "0123456789abcdef", tuple(refs))])
    assert (status.state, status.total) == ("failed", 2) and ": Unreachable: cannot reach an L3 node at " in status.errors[0]


async def test_fill_is_a_no_op_and_nothing_is_owned(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    nodes = await flash_nodes(env, 1)
    tier = L3Tier(env.session, list(nodes))
    await tier.fill(ref, memoryview(b"ignored"))
    await tier.aclose()
    assert not next(iter(nodes.values()))[0].cache.contains(ref.key)
    assert not env.session.closed


def test_refs_round_trip_through_the_query() -> None:
    from urllib.parse import parse_qsl

    from blobsdk.wire import chunk_query, ref_from_query

    ref = ChunkRef(block_id="0" * 32, offset=7, length=9, raw_length=20, checksum=(1 << 64) - 1, codec="lz4")
    assert ref_from_query(dict(parse_qsl(chunk_query(ref)))) == ref
