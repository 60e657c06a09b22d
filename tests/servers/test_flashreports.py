"""servers/flashreports.py: bad-copy reports collapsed per chunk and rate-limited per tenant,
counted by the re-verifications (full reads) they cost the node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from blobsdk.wire import ChunkRef, ErrorBody
from servers.flash import FlashNode
from servers.flashreports import ReportCounters
from tests.servers.test_flash import TOK_A, TOK_B, Env, FakeClock, chunks, for_a, for_b, tenant_node
from tests.servers.test_flashsend import entry_file, report, rot


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        yield Env(tmp_path, session, stack)


def count_full_reads(node: FlashNode) -> list[str]:
    """The keys of the node's cache reads from now on (a re-verification is one)."""
    reads: list[str] = []
    get = node.cache.get

    async def counted(key: str, **kw: Any) -> Any:
        reads.append(key)
        return await get(key, **kw)

    node.cache.get = counted  # type: ignore[method-assign]
    return reads


async def cached(env: Env, url: str, refs: list[ChunkRef], token: str | None = None) -> None:
    """Each chunk filled and verified by a read (later hits are sent unread)."""
    for ref in refs:
        assert (await env.get(url, ref, token))[:2] == (200, "miss")
        assert (await env.get(url, ref, token))[:2] == (200, "hit")


async def test_reports_of_one_chunk_are_collapsed_into_one_verification(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    clock = FakeClock()
    url, node = await env.node(clock=clock, report_absorb_seconds=10)
    await cached(env, url, [ref])
    reads = count_full_reads(node)
    answers = await asyncio.gather(*(report(env, url, ref) for _ in range(20)))
    assert answers == [(200, b'{"dropped": false}')] * 20
    for _ in range(20):  # found good just now: absorbed
        assert await report(env, url, ref) == (200, b'{"dropped": false}')
    assert reads == [ref.key]
    clock.now += 10.5
    assert await report(env, url, ref) == (200, b'{"dropped": false}')
    assert reads == [ref.key] * 2
    assert (await env.stats(url))["reports"] == {"rechecked": 2, "absorbed": 39, "refused": 0}


async def test_a_report_after_the_absorbing_time_catches_a_file_that_rotted_since(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    clock = FakeClock()
    url, node = await env.node(clock=clock, report_absorb_seconds=10)
    await cached(env, url, [ref])
    assert await report(env, url, ref) == (200, b'{"dropped": false}')
    rot(entry_file(node, ref), keep_mtime=True)
    assert await report(env, url, ref) == (200, b'{"dropped": false}')  # absorbed: not read
    assert node.cache.contains(ref.key)
    clock.now += 10.5
    assert await report(env, url, ref) == (200, b'{"dropped": true}')
    assert not node.cache.contains(ref.key) and node.cache.stats()["corrupt"] == 1


async def test_reports_are_rate_limited_per_tenant_and_one_refused_does_nothing(env: Env) -> None:
    refs = await chunks(env, 6)
    clock = FakeClock()
    url, node = await tenant_node(env, clock=clock, report_rate=1.0, report_burst=3)
    await cached(env, url, [for_b(r) for r in refs[:5]], TOK_B)
    await cached(env, url, [for_a(refs[5])], TOK_A)
    reads = count_full_reads(node)
    answers = [await report(env, url, for_b(ref), TOK_B) for ref in refs[:5]]
    assert [status for status, _ in answers] == [200, 200, 200, 429, 429]
    error = msgspec.msgpack.decode(answers[3][1], type=ErrorBody)
    assert (error.code, error.message) == ("unavailable", "tenant 'b' reported more bad copies than 1 a second: not checked")
    assert reads == [r.key for r in refs[:3]]  # the refused ones read nothing
    assert await report(env, url, for_a(refs[5]), TOK_A) == (200, b'{"dropped": false}')  # a's own bucket
    clock.now += 1.0
    assert await report(env, url, for_b(refs[3]), TOK_B) == (200, b'{"dropped": false}')
    assert reads == [r.key for r in (*refs[:3], refs[5], refs[3])]
    assert node.reports.counters == ReportCounters(rechecked=5, absorbed=0, refused=2)


async def test_a_report_of_a_chunk_the_node_does_not_hold_costs_no_token(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, node = await tenant_node(env, clock=FakeClock(), report_rate=1.0, report_burst=1)
    reads = count_full_reads(node)
    for _ in range(5):
        assert await report(env, url, for_a(ref), TOK_A) == (200, b'{"dropped": false}')
    assert reads == [] and node.reports.counters.absorbed == 5
