"""servers/flash.py: the L3 flash node over real (in-loop) block servers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import xxhash

from blobsdk.chunks import rank
from blobsdk.chunks.call import Call
from blobsdk.chunks.codec import decode_chunk
from blobsdk.net.rawget import RawGetEndpoint
from blobsdk.sources.base import BlockStore, Buffer
from blobsdk.wire import CACHE_HEADER, JSON, PROGRESS_HEADER, ChunkRef, ErrorBody, HydrateRequest, HydrateStatus, chunk_query
from servers import flash
from servers._common.auth import ServerAuth
from servers._common.metrics import sample_values
from servers.flash import FLASH_NODE, FlashConfig, FlashNode, make_app
from tests.helpers import ROOT, Tenancy, auth_headers, running_app, server_process
from tests.tiers.test_l4 import Replicas, pack

CHUNK = 10_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore:
    """The real replicated L4 store, its reads (of its first replica, which holds every
    settled write) counted and held while ``gate`` is clear."""

    def __init__(self, inner: BlockStore) -> None:
        self.inner = inner
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    @property
    def name(self) -> str:
        return f"counting[{self.inner.name}]"

    @property
    def replicas(self) -> tuple[CountingStore]:
        return (self,)

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        self.reads += 1
        await self.gate.wait()
        await self.inner.replicas[0].read_into(block_id, offset, out)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        raise AssertionError("the flash node reads into buffers")

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        await self.inner.write_block(block_id, parts)

    async def delete_block(self, block_id: str) -> None:
        await self.inner.delete_block(block_id)

    def list_blocks(self) -> Any:
        return self.inner.list_blocks()

    async def aclose(self) -> None:
        pass


class Env(Replicas):
    """Block servers plus flash nodes over them, all in this loop."""

    async def node(
        self,
        name: str = "flash",
        *,
        blocks: BlockStore | None = None,
        clock: Any = time.monotonic,
        stack: AsyncExitStack | None = None,
        **config: Any,
    ) -> tuple[str, FlashNode]:
        config.setdefault("capacity_bytes", 64 << 20)
        auth = config.pop("auth", None)
        cfg = FlashConfig(dir=str(self.tmp / name), block_urls=tuple(self.urls), **config)
        app = make_app(cfg, auth=auth, blocks=blocks, clock=clock)
        url = await (stack or self.stack).enter_async_context(running_app(app))
        return url, app[FLASH_NODE]

    async def get(
        self, url: str, ref: ChunkRef, token: str | None = None, key: str | None = None
    ) -> tuple[int, str | None, bytes]:
        route = f"{url}/v1/chunks/{key or ref.key}?{chunk_query(ref)}"
        async with self.session.get(route, headers=auth_headers(token, ref)) as resp:
            return resp.status, resp.headers.get(CACHE_HEADER), await resp.read()

    async def put(self, url: str, ref: ChunkRef, body: bytes, token: str | None = None, pin: float = 0) -> tuple[int, bytes]:
        route = f"{url}/v1/chunks/{ref.key}?{chunk_query(ref)}&pin_seconds={pin}"
        async with self.session.put(route, data=body, headers=auth_headers(token, ref)) as resp:
            return resp.status, await resp.read()

    async def hydrate(self, url: str, refs: list[ChunkRef], token: str | None = None, **extra: Any) -> HydrateStatus:
        status, body = await self.post_hydrate(url, refs, token, **extra)
        assert status == 202, body
        return msgspec.json.decode(body, type=HydrateStatus)

    async def post_hydrate(self, url: str, refs: list[ChunkRef], token: str | None = None, **extra: Any) -> tuple[int, bytes]:
        body = msgspec.json.encode(HydrateRequest(refs=refs, **extra))
        headers = {**auth_headers(token), "Content-Type": JSON, "Accept": JSON}
        async with self.session.post(f"{url}/v1/hydrate", data=body, headers=headers) as resp:
            return resp.status, await resp.read()

    async def status(self, url: str, job_id: str, token: str | None = None, method: str = "GET") -> HydrateStatus:
        async with self.session.request(method, f"{url}/v1/hydrate/{job_id}", headers=auth_headers(token)) as resp:
            assert resp.status == 200, await resp.read()
            return msgspec.msgpack.decode(await resp.read(), type=HydrateStatus)

    async def finished(self, url: str, job_id: str, token: str | None = None) -> HydrateStatus:
        for _ in range(500):
            status = await self.status(url, job_id, token)
            if status.finished:
                return status
            await asyncio.sleep(0.01)
        raise AssertionError(f"hydrate job {job_id} did not finish: {status}")

    async def stats(self, url: str, token: str | None = None) -> dict[str, Any]:
        async with self.session.get(f"{url}/stats", headers=auth_headers(token)) as resp:
            assert resp.status == 200
            return await resp.json()


def code_of(body: bytes) -> str:
    return msgspec.msgpack.decode(body, type=ErrorBody).code


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        yield Env(tmp_path, session, stack)


async def chunks(env: Env, n: int, size: int = CHUNK) -> list[ChunkRef]:
    """``n`` new random chunks in L4 (two block servers, started on first use)."""
    blocks = env.blocks or await env.start(2)
    return await pack(blocks, [os.urandom(size) for _ in range(n)])


# --- read-through -------------------------------------------------------------------------


async def test_a_miss_reads_through_then_hits(env: Env) -> None:
    await env.start(2)
    raws = [os.urandom(CHUNK), b"compressible " * 2000]
    refs = await pack(env.blocks, raws, "auto")
    url, _ = await env.node()
    for ref, raw in zip(refs, raws, strict=True):
        status, source, body = await env.get(url, ref)
        assert (status, source, len(body)) == (200, "miss", ref.length)
        assert bytes(decode_chunk(ref, memoryview(body))) == raw  # the stored form, maybe lz4
        assert (await env.get(url, ref))[:3] == (200, "hit", body)
    assert refs[1].codec == "lz4"
    stats = await env.stats(url)
    assert stats["requests"]["hits"] == 2 and stats["requests"]["misses"] == 2 and stats["requests"]["fills"] == 2
    assert stats["cache"]["entries"] == 2 and stats["l4"]["hits"] == 2


async def test_small_and_large_chunks_are_answered_alike(env: Env) -> None:
    refs = await chunks(env, 1, size=(1 << 20) + 1) + await chunks(env, 1)  # streamed in pieces, one reply
    url, _ = await env.node()
    for ref in refs:
        for source in ("miss", "hit"):
            async with env.session.get(f"{url}/v1/chunks/{ref.key}?{chunk_query(ref)}") as resp:
                assert (resp.status, resp.headers[CACHE_HEADER]) == (200, source)
                assert resp.headers["Content-Type"] == "application/octet-stream"
                assert resp.content_length == ref.length == len(await resp.read())


async def test_bad_keys_and_refs_are_400(env: Env) -> None:
    (ref, other) = await chunks(env, 2)
    url, _ = await env.node(max_chunk_bytes=CHUNK - 1)
    for key in ("xyz", other.key, "A" * 32):
        status, _, body = await env.get(url, ref, key=key)
        assert (status, code_of(body)) == (400, "bad_request"), key
    async with env.session.get(f"{url}/v1/chunks/{ref.key}?block_id={ref.block_id}") as resp:
        assert resp.status == 400
    status, _, body = await env.get(url, ref)  # longer than max_chunk_bytes
    assert (status, code_of(body)) == (400, "bad_request")


async def test_a_corrupt_l4_copy_is_skipped(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    first = env.urls.index(rank(ref.key, env.urls)[0])  # the replica the node reads first
    env.corrupt(first, ref)
    url, _ = await env.node()
    status, source, body = await env.get(url, ref)
    assert (status, source) == (200, "miss")
    decode_chunk(ref, memoryview(body))
    stats = await env.stats(url)
    assert stats["l4"]["corrupt"] == 1 and stats["l4"]["hits"] == 1


async def test_a_read_through_asked_for_progress_says_102_until_its_answer(env: Env) -> None:
    """``X-Blobsdk-Progress: MS``: while the read-through waits on L4 (held here), an interim
    ``102 Processing`` every MS ms, then the answer (the client's hedger then knows the node
    works and is not hung); a hit answers before any; an interval out of range is 400."""
    (ref,) = await chunks(env, 1)
    counting = CountingStore(env.blocks)
    counting.gate.clear()
    url, _ = await env.node(blocks=counting)
    route, out, heard = f"/v1/chunks/{ref.key}?{chunk_query(ref)}", bytearray(ref.length), asyncio.Event()
    count = 0

    def on_interim() -> None:
        nonlocal count
        count += 1
        if count == 3:
            heard.set()

    ep = RawGetEndpoint(url, timeout=aiohttp.ClientTimeout(total=30))
    try:
        reading = asyncio.create_task(ep.get_into(route, memoryview(out), headers={PROGRESS_HEADER: "10"}, on_interim=on_interim))
        async with asyncio.timeout(10):
            await heard.wait()
        counting.gate.set()
        assert (await reading)[CACHE_HEADER.lower()] == "miss" and counting.reads == 1
        stored = await env.blocks.replicas[0].read_range(ref.block_id, ref.offset, ref.length)
        assert bytes(out) == bytes(decode_chunk(ref, memoryview(stored)))
        count = 0
        headers = await ep.get_into(route, memoryview(out), headers={PROGRESS_HEADER: "60000"}, on_interim=on_interim)
        assert (headers[CACHE_HEADER.lower()], count) == ("hit", 0)
    finally:
        await ep.aclose()
    for bad in ("9", "60001", "soon", "nan"):
        async with env.session.get(f"{url}{route}", headers={PROGRESS_HEADER: bad}) as resp:
            error = msgspec.msgpack.decode(await resp.read(), type=ErrorBody)
        message = f"{PROGRESS_HEADER} must be 10 to 60000 ms, got {bad!r}"
        assert (resp.status, error.code, error.message) == (400, "bad_request", message)


async def test_every_l4_copy_bad_is_502_and_nothing_is_cached(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    env.corrupt(0, ref)
    env.corrupt(1, ref)
    url, node = await env.node()
    for _ in range(2):
        status, _, body = await env.get(url, ref)
        assert (status, code_of(body)) == (502, "corrupt_data")
    assert not node.cache.contains(ref.key) and (await env.stats(url))["cache"]["entries"] == 0


async def test_a_block_gone_from_l4_is_404(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    await env.blocks.delete_block(ref.block_id)
    url, _ = await env.node()
    status, _, body = await env.get(url, ref)
    assert (status, code_of(body)) == (404, "block_not_found")


async def test_concurrent_cold_reads_make_one_l4_read(env: Env) -> None:
    (ref,) = await chunks(env, 1, size=300_000)
    counting = CountingStore(env.blocks)
    counting.gate.clear()
    url, _ = await env.node(blocks=counting)
    readers = [asyncio.create_task(env.get(url, ref)) for _ in range(50)]
    while counting.reads == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # every request has arrived and joined the one load
    counting.gate.set()
    results = await asyncio.gather(*readers)
    assert counting.reads == 1
    assert {(status, len(body)) for status, _, body in results} == {(200, 300_000)}
    assert (await env.get(url, ref))[1] == "hit" and counting.reads == 1


async def test_a_chunk_larger_than_the_capacity_is_still_served(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, _ = await env.node(capacity_bytes=CHUNK // 2)
    for _ in range(2):
        status, source, body = await env.get(url, ref)
        assert (status, source, len(body)) == (200, "miss", CHUNK)
    status, body = await env.put(url, ref, body)
    assert (status, code_of(body)) == (507, "insufficient_storage")
    stats = await env.stats(url)
    assert stats["requests"]["fills_refused"] == 2 and stats["cache"]["entries"] == 0


@pytest.mark.parametrize(("hold_seconds", "kept"), [(50.0, "epoch"), (0.0, "scratch")])
async def test_the_hold_period_keeps_epoch_data_that_lru_would_evict(env: Env, hold_seconds: float, kept: str) -> None:
    scratch, epoch, newcomer = await chunks(env, 3)
    clock = FakeClock()
    url, node = await env.node(capacity_bytes=2 * CHUNK + CHUNK // 2, hold_seconds=hold_seconds, clock=clock)
    await env.get(url, scratch)  # cached at t=0
    clock.now += 100
    await env.get(url, epoch)  # cached at t=100, inside the hold period
    clock.now += 1
    assert (await env.get(url, scratch))[1] == "hit"  # now the most recently used
    clock.now += 1
    await env.get(url, newcomer)  # one of the two must go
    assert node.cache.contains(epoch.key) == (kept == "epoch")
    assert node.cache.contains(scratch.key) == (kept == "scratch")


# --- PUT ----------------------------------------------------------------------------------


async def test_put_stores_verified_bytes_only(env: Env) -> None:
    await env.start(1)
    (ref,) = await pack(env.blocks, [os.urandom(CHUNK)])
    body = await env.blocks.replicas[0].read_range(ref.block_id, ref.offset, ref.length)
    await env.blocks.delete_block(ref.block_id)  # from now on only the node has it
    url, _ = await env.node()
    bad = bytes([body[0] ^ 1]) + body[1:]
    assert (await env.put(url, ref, bad))[0] == 422
    assert code_of((await env.put(url, ref, bad))[1]) == "corrupt_data"
    status, err = await env.put(url, ref, body[:-1])
    assert (status, code_of(err)) == (400, "bad_request")
    assert (await env.put(url, ref, body))[0] == 201
    assert await env.get(url, ref) == (200, "hit", body)


# --- tenants and quotas -------------------------------------------------------------------

TENANCY = Tenancy()
QUOTAS = {"a": 2 * CHUNK + CHUNK // 2}
TOK_A, TOK_B, ADMIN = TENANCY.token("a"), TENANCY.token("b"), TENANCY.token("ops", admin=True)


def for_a(ref: ChunkRef) -> ChunkRef:
    return TENANCY.granted(ref, "a")


def for_b(ref: ChunkRef) -> ChunkRef:
    return TENANCY.granted(ref, "b")


async def tenant_node(env: Env, **config: Any) -> tuple[str, FlashNode]:
    return await env.node(auth=TENANCY.auth(), quotas=QUOTAS, **config)


async def test_bad_tokens_are_401_and_every_bad_grant_is_403(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, _ = await tenant_node(env)
    now = time.time()
    other = Tenancy()
    for token in (None, "nope", other.token("a"), TENANCY.token("a", ttl=60, now=now - 200), TOK_A[:-2] + "xx"):
        status, _, body = await env.get(url, for_a(ref), token)
        assert (status, code_of(body)) == (401, "unauthorized"), token
    wrong_range = msgspec.structs.replace(ref, grant=TENANCY.granted(msgspec.structs.replace(ref, offset=1), "a").grant)
    for bad in (ref, for_b(ref), wrong_range, TENANCY.granted(ref, "a", ttl=10, now=now - 100)):
        status, _, body = await env.get(url, bad, TOK_A)
        assert (status, code_of(body)) == (403, "forbidden"), bad.grant
    assert (await env.get(url, for_a(ref), TOK_A))[:2] == (200, "miss")
    assert (await env.get(url, ref, ADMIN))[:2] == (200, "hit")  # an admin needs no grant
    async with env.session.get(f"{url}/healthz") as resp:
        assert resp.status == 200
    async with env.session.get(f"{url}/stats") as resp:
        assert resp.status == 401


async def test_put_and_hydrate_need_a_grant_for_each_chunk(env: Env) -> None:
    refs = await chunks(env, 2)
    url, node = await tenant_node(env)
    stored = await env.blocks.replicas[0].read_range(refs[0].block_id, refs[0].offset, refs[0].length)
    status, body = await env.put(url, for_b(refs[0]), stored, TOK_A)
    assert (status, code_of(body)) == (403, "forbidden")
    status, body = await env.post_hydrate(url, [for_a(refs[0]), refs[1]], TOK_A)
    assert (status, msgspec.json.decode(body)["code"]) == (403, "forbidden")
    assert node.running_jobs() == 0 and not node.cache.contains(refs[0].key)
    job = await env.finished(url, (await env.hydrate(url, [for_a(r) for r in refs], TOK_A)).job_id, TOK_A)
    assert (job.state, job.done) == ("done", 2)
    for method in ("GET", "DELETE"):  # another tenant's job is unknown to B; an admin sees it
        async with env.session.request(method, f"{url}/v1/hydrate/{job.job_id}", headers=auth_headers(TOK_B)) as resp:
            assert (resp.status, code_of(await resp.read())) == (404, "not_found")
    assert (await env.status(url, job.job_id, ADMIN)).state == "done"


async def test_a_tenant_over_quota_is_429_while_others_still_write(env: Env) -> None:
    refs = await chunks(env, 6)
    url, node = await tenant_node(env)
    stored = [await env.blocks.replicas[0].read_range(r.block_id, r.offset, r.length) for r in refs]
    assert [(await env.put(url, for_a(refs[i]), stored[i], TOK_A, pin=600))[0] for i in (0, 1)] == [201, 201]
    status, body = await env.put(url, for_a(refs[2]), stored[2], TOK_A, pin=600)
    assert (status, code_of(body)) == (429, "quota_exceeded")
    assert (await env.put(url, for_b(refs[3]), stored[3], TOK_B))[0] == 201
    # A read-through for the tenant over quota is served, not stored, and counted.
    assert (await env.get(url, for_a(refs[4]), TOK_A))[:2] == (200, "miss")
    assert (await env.get(url, for_a(refs[4]), TOK_A))[:2] == (200, "miss")
    assert (await env.stats(url, ADMIN))["requests"]["quota_rejections"] == 2
    job = await env.finished(url, (await env.hydrate(url, [for_a(refs[5])], TOK_A)).job_id, TOK_A)
    assert (job.state, job.failed) == ("failed", 1) and "QuotaExceeded" in job.errors[0]
    assert node.cache.tenant_usage() == {"a": 2 * CHUNK, "b": CHUNK}


async def test_a_put_refused_for_the_quota_leaves_another_tenants_copy(env: Env) -> None:
    """A is at its quota with pinned chunks; its PUT of the chunk B has cached is 429, and B's
    next read is still a hit: a refused request changes nothing."""
    refs = await chunks(env, 3)
    url, node = await tenant_node(env)
    stored = [await env.blocks.replicas[0].read_range(r.block_id, r.offset, r.length) for r in refs]
    assert (await env.get(url, for_b(refs[0]), TOK_B))[:2] == (200, "miss")
    assert [(await env.put(url, for_a(refs[i]), stored[i], TOK_A, pin=600))[0] for i in (1, 2)] == [201, 201]
    status, body = await env.put(url, for_a(refs[0]), stored[0], TOK_A)
    assert (status, code_of(body)) == (429, "quota_exceeded")
    assert (await env.get(url, for_b(refs[0]), TOK_B))[:3] == (200, "hit", stored[0])
    assert node.cache.tenant_usage() == {"a": 2 * CHUNK, "b": CHUNK}


async def test_a_tenant_over_quota_evicts_its_own_unpinned_data(env: Env) -> None:
    refs = await chunks(env, 4)
    url, node = await tenant_node(env)
    await env.get(url, for_b(refs[0]), TOK_B)
    for ref in refs[1:]:
        assert (await env.get(url, for_a(ref), TOK_A))[:2] == (200, "miss")
    assert node.cache.tenant_usage() == {"a": 2 * CHUNK, "b": CHUNK}
    assert node.cache.contains(refs[0].key) and not node.cache.contains(refs[1].key)


async def test_a_tenant_cannot_store_its_own_bytes_under_a_real_chunks_key(env: Env) -> None:
    """B PUTs bytes of its own for a real block span it may read, with their checksum: that
    names another key, so A's read of the real chunk never sees B's bytes (issue 9)."""
    (ref,) = await chunks(env, 1)
    url, _ = await tenant_node(env)
    forged_bytes = b"x" * ref.length
    forged = msgspec.structs.replace(ref, checksum=xxhash.xxh3_64_intdigest(forged_bytes), codec="none", raw_length=ref.length)
    assert forged.key != ref.key
    assert (await env.put(url, for_b(forged), forged_bytes, TOK_B))[0] == 201
    status, source, body = await env.get(url, for_a(ref), TOK_A)
    assert (status, source) == (200, "miss") and bytes(decode_chunk(ref, memoryview(body))) != forged_bytes
    status, _, body = await env.get(url, for_a(forged), TOK_A, key=ref.key)  # the forged ref under the real key
    assert (status, code_of(body)) == (400, "bad_request")


async def test_a_tenant_sees_only_its_own_usage_in_stats(env: Env) -> None:
    refs = await chunks(env, 2)
    url, _ = await tenant_node(env)
    await env.get(url, for_a(refs[0]), TOK_A)
    await env.get(url, for_b(refs[1]), TOK_B)
    assert await env.stats(url, TOK_A) == {"tenant": "a", "tenants": {"a": CHUNK}, "quota_bytes": QUOTAS["a"]}
    assert await env.stats(url, TOK_B) == {"tenant": "b", "tenants": {"b": CHUNK}, "quota_bytes": None}
    assert (await env.stats(url, ADMIN))["tenants"] == {"a": CHUNK, "b": CHUNK}


async def test_a_static_token_is_the_admin_and_passes_without_grants(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, _ = await env.node(auth=TENANCY.auth("node-secret"))
    assert (await env.get(url, ref, "node-secret"))[:2] == (200, "miss")
    assert "cache" in await env.stats(url, "node-secret")


# --- hydrate ------------------------------------------------------------------------------


async def test_hydrate_runs_to_done_and_pinned_chunks_survive_eviction(env: Env) -> None:
    refs = await chunks(env, 10)
    url, _ = await env.node(capacity_bytes=4 * CHUNK + CHUNK // 2, hydrate_concurrency=2)
    accepted = await env.hydrate(url, refs[:2] + refs[:1])  # a duplicate counts once
    assert (accepted.state, accepted.total) == ("running", 2)
    job = await env.finished(url, accepted.job_id)
    assert (job.state, job.done, job.failed, job.bytes, job.errors) == ("done", 2, 0, 2 * CHUNK, [])
    for ref in refs[2:]:  # eviction pressure: four times what is left unpinned
        assert (await env.get(url, ref))[:2] == (200, "miss")
    for ref in refs[:2]:
        assert (await env.get(url, ref))[1] == "hit"
    assert (await env.stats(url))["jobs"] == {"running": 0, "kept": 1}


async def test_hydrate_of_cached_chunks_pins_them(env: Env) -> None:
    refs = await chunks(env, 4)
    clock = FakeClock()
    url, node = await env.node(capacity_bytes=2 * CHUNK + CHUNK // 2, clock=clock)
    await env.get(url, refs[0])
    job = await env.finished(url, (await env.hydrate(url, refs[:1], pin_seconds=30)).job_id)
    assert (job.state, job.done) == ("done", 1)
    for ref in refs[1:]:
        await env.get(url, ref)
    assert node.cache.contains(refs[0].key)
    clock.now += 31  # the pin expired: plain LRU again
    for ref in refs[1:]:
        await env.get(url, ref)
    assert not node.cache.contains(refs[0].key)


async def test_a_hydrate_with_bad_chunks_fails_them_and_stores_the_rest(env: Env) -> None:
    refs = await chunks(env, 3)
    env.corrupt(0, refs[1])
    env.corrupt(1, refs[1])
    url, node = await env.node()
    job = await env.finished(url, (await env.hydrate(url, refs)).job_id)
    assert (job.state, job.done, job.failed) == ("failed", 2, 1) and "CorruptData" in job.errors[0]
    assert [node.cache.contains(r.key) for r in refs] == [True, False, True]


async def test_unknown_jobs_are_404_and_cancel_stops_a_job(env: Env) -> None:
    refs = await chunks(env, 3)
    counting = CountingStore(env.blocks)
    counting.gate.clear()
    url, node = await env.node(blocks=counting)
    async with env.session.get(f"{url}/v1/hydrate/0123") as resp:
        assert (resp.status, code_of(await resp.read())) == (404, "not_found")
    job = await env.hydrate(url, refs)
    cancelled = await env.status(url, job.job_id, method="DELETE")
    assert (cancelled.state, cancelled.done) == ("cancelled", 0)
    assert node.running_jobs() == 0


async def test_app_cleanup_cancels_a_running_hydrate(env: Env) -> None:
    refs = await chunks(env, 5)
    counting = CountingStore(env.blocks)
    counting.gate.clear()
    async with AsyncExitStack() as stack:
        url, node = await env.node(blocks=counting, stack=stack)
        job_id = (await env.hydrate(url, refs)).job_id
        while counting.reads == 0:
            await asyncio.sleep(0.01)
        job = node.job(job_id)
    assert job.task is not None and job.task.cancelled()
    assert job.status().state == "cancelled" and job.status().done == 0 and job.job_id == job_id


async def test_invalid_hydrate_bodies_are_400(env: Env) -> None:
    await env.start(1)
    url, _ = await env.node()
    async with env.session.post(f"{url}/v1/hydrate", data=b"\x01not msgpack") as resp:
        assert (resp.status, code_of(await resp.read())) == (400, "bad_request")
    bad = {"refs": [{"block_id": "zz", "offset": 0, "length": 1, "raw_length": 1, "checksum": 0}]}
    async with env.session.post(f"{url}/v1/hydrate", json=bad) as resp:
        assert resp.status == 400


# --- observability and the command line ---------------------------------------------------


async def test_metrics_and_healthz(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, _ = await env.node(auth=ServerAuth("t0k"))
    await env.get(url, ref, "t0k")
    async with env.session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for name, value in (
        ("blobsdk_flash_cache_entries", 1),
        ("blobsdk_flash_cache_bytes", CHUNK),
        ("blobsdk_flash_chunk_misses_total", 1),
        ("blobsdk_flash_chunk_hits_total", 0),
        ("blobsdk_flash_hydrate_jobs_running", 0),
        ("blobsdk_flash_l4_corrupt_copies_total", 0),
        ("blobsdk_flash_l4_primaries_total", 1),
        ("blobsdk_flash_l4_replicas_demoted", 0),
    ):
        assert sample_values(text, name) == [({}, value)], name
    async with env.session.get(f"{url}/healthz") as resp:
        assert resp.status == 200


def test_config_rejects_invalid_settings(tmp_path: Path) -> None:
    ok = {"dir": str(tmp_path), "block_urls": ("http://b",), "capacity_bytes": 1}
    for bad in (
        {"block_urls": ()},
        {"capacity_bytes": 0},
        {"ttl_seconds": 0.0},
        {"min_free_ratio": 1.0},
        {"hydrate_concurrency": 0},
        {"quotas": {"a": -1}},
        {"quotas": {"": 1}},
        {"hold_seconds": -1.0},
    ):
        with pytest.raises(ValueError):
            FlashConfig(**{**ok, **bad})


def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "servers.flash", *args], cwd=ROOT, env=env, capture_output=True, timeout=60, check=False
    )


def test_help_and_a_bad_flag_as_a_process(tmp_path: Path) -> None:
    done = _run("--help")
    assert done.returncode == 0
    for flag in (
        b"--dir",
        b"--block-url",
        b"--capacity-mb",
        b"--hold-seconds",
        b"--ttl-seconds",
        b"--quota",
        b"--keys",
        b"--token",
    ):
        assert flag in done.stdout
    done = _run("--dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[-1] == (
        "python -m servers.flash: error: invalid flash config: "
        "block_urls must name at least one L4 block server (or source_url S3)"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--quota", "nocolon"], "--quota 'nocolon': want TENANT:MiB with a number of MiB >= 0"),
        (["--capacity-mb", "0"], "invalid flash config: capacity_bytes must be positive"),
        (["--quota", "a:lots"], "--quota 'a:lots': want TENANT:MiB with a number of MiB >= 0"),
        (["--quota", "a:-1"], "--quota 'a:-1': want TENANT:MiB with a number of MiB >= 0"),
        (["--keys", "{tmp}/missing.toml"], "cannot read keyring '{tmp}/missing.toml': No such file or directory"),
        (["--min-free-ratio", "2"], "invalid flash config: min_free_ratio must be in [0, 1)"),
        (["--tenant-slots", "0"], "invalid flash config: counts must be positive"),
        (["--report-burst", "0"], "invalid flash config: counts must be positive"),
        (["--report-rate", "0"], "invalid flash config: report_rate must be a positive number"),
        (["--report-rate", "inf"], "invalid flash config: report_rate must be a positive number"),
        (["--report-absorb-seconds", "-1"], "invalid flash config: report_absorb_seconds must be >= 0"),
    ],
)
def test_invalid_flags_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """In this process (one interpreter start per case cost ~2.5 s on a loaded machine): main()
    refuses before it sets up logging or serves anything."""
    base = ["--dir", str(tmp_path), "--block-url", "http://127.0.0.1:9"]
    with pytest.raises(SystemExit) as exit:
        flash.main([*base, *(f.format(tmp=tmp_path) for f in flags)])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m servers.flash: error: {message.format(tmp=tmp_path)}"


async def test_as_a_process_it_reads_through_and_checks_tenants(env: Env, tmp_path: Path) -> None:
    (ref,) = await chunks(env, 1)
    args = [
        "--dir",
        str(tmp_path / "proc"),
        "--capacity-mb",
        "1",
        "--quota",
        "a:0.5",
        "--keys",
        str(TENANCY.write_keys(tmp_path / "keys.toml")),
        *[a for u in env.urls for a in ("--block-url", u)],
    ]
    with server_process("servers.flash", *args, tmp=tmp_path) as (url, _):
        assert (await env.get(url, for_a(ref)))[0] == 401
        assert (await env.get(url, ref, TOK_A))[0] == 403
        for source in ("miss", "hit"):
            status, got, body = await env.get(url, for_a(ref), TOK_A)
            assert (status, got) == (200, source)
            decode_chunk(ref, memoryview(body))


@pytest.mark.parametrize("pin", [-1.0, float("nan"), float("inf")])
async def test_a_hydrate_pin_that_is_negative_or_not_finite_is_refused(env: Env, pin: float) -> None:
    (ref,) = await chunks(env, 1)
    url, node = await env.node()
    body = msgspec.msgpack.encode(HydrateRequest(refs=[ref], pin_seconds=pin))
    async with env.session.post(f"{url}/v1/hydrate", data=body) as resp:
        error = msgspec.msgpack.decode(await resp.read(), type=ErrorBody)
    assert (resp.status, error.code, error.message) == (
        400,
        "bad_request",
        f"pin_seconds must be a finite number >= 0, got {pin}",
    )
    assert node.running_jobs() == 0 and node.snapshot()["jobs"]["kept"] == 0


async def test_the_nodes_l4_hedges_look_at_the_limiters_its_reads_wait_for(env: Env) -> None:
    await env.start(2)
    _, node = await env.node()
    stores = node.l4.blocks.replicas
    assert [node.l4._limiters.get(s.name) for s in stores] == [s.limiter for s in stores]  # type: ignore[attr-defined]
