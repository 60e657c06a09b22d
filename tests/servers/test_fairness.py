"""Tenants' fair shares of a server's request slots (servers/_common/admission.py), at the
API server and the L3 node, in this loop: who reaches the handler, in which order, held with
events (never timing)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from blobsdk.chunks import bucket_of
from blobsdk.metadata import HttpMetadataStore, SqliteMetadataStore
from blobsdk.wire import ChunkRef, ReadPlan, chunk_query
from servers import api
from servers._common import http
from servers._common.admission import GATE_KEY, TenantGate
from servers._common.metrics import sample_sum
from tests.helpers import Tenancy, auth_headers, running_app
from tests.servers.test_flash import TENANCY, TOK_A, TOK_B, CountingStore, Env, chunks, for_a, for_b


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        yield Env(tmp_path, session, stack)


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (in this loop) until ``condition`` holds; the test fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {condition}")
        await asyncio.sleep(0.005)


class HeldStore:
    """A store whose lookups of bucket ``flood`` wait for ``release``; every lookup's bucket
    is recorded as it arrives (the order in which requests reached the store)."""

    def __init__(self, inner: SqliteMetadataStore) -> None:
        self.inner = inner
        self.arrivals: list[str] = []
        self.lookups: list[tuple[str, int]] = []  # (first path, number of paths)
        self.release = asyncio.Event()

    async def get_plans(self, paths: Sequence[str]) -> list[ReadPlan | None]:
        bucket = bucket_of(paths[0])
        self.arrivals.append(bucket)
        self.lookups.append((paths[0], len(paths)))
        if bucket == "flood":
            await self.release.wait()
        return await self.inner.get_plans(paths)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def waiting(gate: TenantGate | None) -> int:
    return 0 if gate is None else gate.waiting()


async def test_a_flood_of_lookups_waits_behind_its_own_requests_not_in_front_of_another_tenants(tmp_path: Path) -> None:
    tenancy = Tenancy()
    store = HeldStore(SqliteMetadataStore(tmp_path / "meta.sqlite"))
    app = api.make_app(store, tenancy.auth(), tenant_slots=4)  # type: ignore[arg-type]
    async with running_app(app) as url, aiohttp.ClientSession() as session:
        flood = HttpMetadataStore(session, url, tenancy.token("flood", "flood"))
        victim = HttpMetadataStore(session, url, tenancy.token("victim", "victim"))
        flooding = [asyncio.create_task(flood.get_plans(["/flood/x"])) for _ in range(10)]
        gate = app.get(GATE_KEY)
        await until(lambda: len(store.arrivals) + waiting(gate) == 10)
        async with asyncio.timeout(10):  # a guard: the victim waits for none of the flood
            assert await victim.get_plans(["/victim/x"]) == [None]
        assert store.arrivals == ["flood"] * 4 + ["victim"]  # not behind the 6 the flood queued
        store.release.set()
        assert await asyncio.gather(*flooding) == [[None]] * 10


async def test_a_tenants_long_lookups_take_turns_unit_by_unit(tmp_path: Path) -> None:
    """Two requests of two units' paths from one tenant with one slot: their units alternate,
    and another tenant's lookup waits for one unit, not for a whole request."""
    tenancy, unit = Tenancy(), api.PLAN_UNIT
    store = HeldStore(SqliteMetadataStore(tmp_path / "meta.sqlite"))
    app = api.make_app(store, tenancy.auth(), tenant_slots=1)  # type: ignore[arg-type]
    async with running_app(app) as url, aiohttp.ClientSession() as session:
        flood = HttpMetadataStore(session, url, tenancy.token("flood", "flood"))
        victim = HttpMetadataStore(session, url, tenancy.token("victim", "victim"))
        gate = app[GATE_KEY]
        first = asyncio.create_task(flood.get_plans([f"/flood/a{i:04d}" for i in range(2 * unit)]))
        await until(lambda: len(store.lookups) == 1)
        second = asyncio.create_task(flood.get_plans([f"/flood/b{i:04d}" for i in range(2 * unit)]))
        await until(lambda: gate.waiting("flood") == 1)
        async with asyncio.timeout(10):
            assert await victim.get_plans(["/victim/x"]) == [None]
        store.release.set()
        assert await first == await second == [None] * 2 * unit
    assert store.lookups == [
        ("/flood/a0000", unit),
        ("/victim/x", 1),
        ("/flood/b0000", unit),
        (f"/flood/a{unit:04d}", unit),
        (f"/flood/b{unit:04d}", unit),
    ]


def stalled_put(env: Env, url: str, ref: ChunkRef, body: bytes, token: str, go: asyncio.Event) -> asyncio.Task[int]:
    """A PUT whose body stops after 10 bytes until ``go``: it holds its request slot."""

    async def parts() -> AsyncIterator[bytes]:
        yield body[:10]
        await go.wait()
        yield body[10:]

    async def put() -> int:
        route = f"{url}/v1/chunks/{ref.key}?{chunk_query(ref)}"
        async with env.session.put(route, data=parts(), headers=auth_headers(token, ref)) as resp:
            return resp.status

    return asyncio.create_task(put())


async def test_at_the_l3_node_a_tenant_over_its_share_waits_while_another_is_served(env: Env) -> None:
    refs = await chunks(env, 3)
    url, node = await env.node(auth=TENANCY.auth(), tenant_slots=1)
    gate = node.gate
    assert gate is not None
    for ref, token in ((for_a(refs[0]), TOK_A), (for_b(refs[1]), TOK_B)):
        assert (await env.get(url, ref, token))[:2] == (200, "miss")
    stored = await env.blocks.replicas[0].read_range(refs[2].block_id, refs[2].offset, refs[2].length)
    go = asyncio.Event()
    put = stalled_put(env, url, for_a(refs[2]), stored, TOK_A, go)
    await until(lambda: gate.running("a") == 1)
    a_get = asyncio.create_task(env.get(url, for_a(refs[0]), TOK_A))
    await until(lambda: gate.waiting("a") == 1)  # behind a's own request
    async with asyncio.timeout(10):
        assert (await env.get(url, for_b(refs[1]), TOK_B))[:2] == (200, "hit")
    assert not a_get.done()
    go.set()
    assert await put == 201
    assert (await a_get)[:2] == (200, "hit")
    async with env.session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    assert sample_sum(text, "blobsdk_flash_tenant_requests_queued_total") == 1
    assert sample_sum(text, "blobsdk_flash_tenant_requests_waiting") == 0


async def test_a_read_through_gives_its_slot_back_while_it_waits_on_l4(env: Env) -> None:
    refs = await chunks(env, 2)
    assert env.blocks is not None
    counting = CountingStore(env.blocks)
    url, _ = await env.node(auth=TENANCY.auth(), tenant_slots=1, blocks=counting)
    assert (await env.get(url, for_a(refs[1]), TOK_A))[:2] == (200, "miss")
    counting.gate.clear()
    miss = asyncio.create_task(env.get(url, for_a(refs[0]), TOK_A))
    await until(lambda: counting.reads == 2)
    async with asyncio.timeout(10):  # the tenant's one slot is not held by its read-through
        assert (await env.get(url, for_a(refs[1]), TOK_A))[:2] == (200, "hit")
    counting.gate.set()
    assert (await miss)[:2] == (200, "miss")


async def test_a_node_without_a_keyring_gates_nothing(env: Env) -> None:
    refs = await chunks(env, 2)
    url, node = await env.node(tenant_slots=1)
    assert node.gate is None
    assert (await env.get(url, refs[0]))[:2] == (200, "miss")
    stored = await env.blocks.replicas[0].read_range(refs[1].block_id, refs[1].offset, refs[1].length)
    go = asyncio.Event()
    put = stalled_put(env, url, refs[1], stored, "", go)
    async with asyncio.timeout(10):  # one tenant, "default", with 1 slot: gated, this would wait
        assert (await env.get(url, refs[0]))[:2] == (200, "hit")
    go.set()
    assert await put == 201


async def test_an_admin_passes_the_gate(env: Env) -> None:
    refs = await chunks(env, 2)
    url, node = await env.node(auth=TENANCY.auth("node-secret"), tenant_slots=1)
    gate = node.gate
    assert gate is not None
    stored = await env.blocks.replicas[0].read_range(refs[1].block_id, refs[1].offset, refs[1].length)
    go = asyncio.Event()
    put = stalled_put(env, url, for_a(refs[1]), stored, TOK_A, go)
    await until(lambda: gate.running("a") == 1)
    async with asyncio.timeout(10):
        assert (await env.get(url, refs[0], "node-secret"))[:2] == (200, "miss")
    assert gate.admitted == 1  # a's PUT only
    go.set()
    assert await put == 201


async def test_a_served_app_keeps_its_start_up_heap_out_of_full_collections(tmp_path: Path) -> None:
    """A full collection over a server's whole start-up heap stalls its loop for every
    tenant; the served app freezes what start-up left alive."""
    gc.unfreeze()
    port_file = tmp_path / "port"
    serving = asyncio.create_task(http._serve(web.Application(), "127.0.0.1", 0, port_file))
    try:
        await until(port_file.exists)
        assert gc.get_freeze_count() > 0
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        gc.unfreeze()
