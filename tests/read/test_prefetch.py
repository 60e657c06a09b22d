"""Deep prefetch (blobsdk/read/prefetch.py) into L1, L2 and L3, and dataloader readahead."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import pytest
from aiohttp import web

import blobsdk
from blobsdk.chunks.call import Priority
from blobsdk.cli.admin import dataset_bytes_done
from blobsdk.config import ClientConfig, L1Config, L2Config, LimiterConfig, WriteConfig
from blobsdk.errors import BadRequest, BlobNotFound, Unavailable
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.read.prefetch import PrefetchProgress
from servers import api, blockstore
from servers.cluster import start_cluster
from tests.helpers import in_a_forked_child, running_app, until, wait_for_child

SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)
CHUNK = 64 << 10


def blobs(n: int, size: int = 3 * CHUNK, prefix: str = "/ds/") -> dict[str, bytes]:
    return {f"{prefix}{i:04d}": os.urandom(size) for i in range(n)}


@pytest.fixture
async def stocked(tmp_path: Path) -> dict[str, bytes]:
    """A local store holding 12 blobs of 3 chunks each (written by a client since closed)."""
    data = blobs(12)
    async with blobsdk.Client.local(tmp_path / "store", write=SMALL) as c:
        await c.put_many(data.items())
    return data


def local(tmp_path: Path, **kw: object) -> blobsdk.Client:
    return blobsdk.Client.local(tmp_path / "store", write=SMALL, **kw)  # type: ignore[arg-type]


async def test_an_l1_prefetch_makes_the_reads_hits(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    async with local(tmp_path) as c:
        handle = c.prefetch(list(stocked), tier="l1")
        assert not handle.done
        progress = await handle
        assert progress == PrefetchProgress(
            chunks_done=36,
            chunks_total=36,
            bytes_done=36 * CHUNK,
            bytes_total=36 * CHUNK,
            dataset_chunks=36,
            dataset_bytes=36 * CHUNK,
        )
        assert handle.done and handle.failed == {} and handle.progress == progress
        l4_reads = c.stats()["l4"]["hits"]
        assert l4_reads == 36
        for path, data in stocked.items():
            assert await c.get(path) == data
        stats = c.stats()
        assert stats["l1"]["hits"] == 36 and stats["l4"]["hits"] == l4_reads  # every read a hit
        assert (await c.prefetch(list(stocked), tier="l1")).chunks_done == 36  # held already: nothing read
        assert c.stats()["l4"]["hits"] == l4_reads


async def test_an_l2_prefetch_fills_l2_only_and_outlives_the_client(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=64 << 20)
    async with local(tmp_path, l2=l2) as c:
        progress = await c.prefetch("/ds/", tier="l2")  # a prefix: every blob under it
        assert (progress.chunks_done, progress.chunks_total) == (36, 36)
        assert c.stats()["l1"]["cache_entries"] == 0  # not above the target tier
    async with local(tmp_path, l2=l2) as c:  # a new process's client: L1 empty
        for path, data in stocked.items():
            assert await c.get(path) == data
        stats = c.stats()
        assert stats["l2"]["hits"] == 36 and stats["l4"]["hits"] == 0


async def test_an_l2_prefetch_reads_nothing_another_process_put_in_l2_since_it_opened(
    tmp_path: Path, stocked: dict[str, bytes]
) -> None:
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=64 << 20)
    async with local(tmp_path, l2=l2) as c, local(tmp_path, l2=l2) as other:  # a DataLoader's two workers
        assert (await other.prefetch("/ds/", tier="l2")).chunks_done == 36
        progress = await c.prefetch("/ds/", tier="l2")
        assert (progress.chunks_done, progress.chunks_total) == (36, 36)
        stats = c.stats()
        assert stats["l4"]["hits"] == 0 and stats["l2"]["cache_entries"] == 36  # found and indexed, none read
        for path, data in stocked.items():
            assert await c.get(path) == data
        assert c.stats()["l2"]["hits"] == 36 and c.stats()["l4"]["hits"] == 0


async def test_the_byte_budget_bounds_what_one_prefetch_fetches(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    async with local(tmp_path, l1=L1Config(capacity_bytes=20 * CHUNK)) as c:
        progress = await c.prefetch(list(stocked), tier="l1")  # default budget: half of L1
        assert (progress.chunks_done, progress.chunks_skipped, progress.chunks_total) == (10, 26, 36)
        assert c.stats()["l1"]["cache_evictions"] == 0  # it evicted nothing it had prefetched
        # The budget went to the first 10 chunks in order: /ds/0003 has one of its three.
        progress = await c.prefetch(["/ds/0003", "/ds/0004"], tier="l1", max_bytes=CHUNK)
        assert (progress.chunks_done, progress.chunks_skipped) == (2, 4)  # 1 held + 1 new, 4 over


async def test_missing_paths_are_reported_and_the_rest_proceeds(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    async with local(tmp_path) as c:
        handle = c.prefetch(["/ds/0000", "/nope/a", "/ds/0001", "/empty/"], tier="l1")
        progress = await handle
        assert list(handle.failed) == ["/empty/", "/nope/a"] and isinstance(handle.failed["/nope/a"], BlobNotFound)
        assert isinstance(handle.failed["/empty/"], BlobNotFound) and str(handle.failed["/empty/"]) == "no blobs under '/empty/'"
        assert (progress.chunks_done, progress.chunks_total) == (6, 6)


async def test_unreadable_chunks_fail_their_paths_only(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    async with local(tmp_path) as c:
        plans = {path: await c.plan(path) for path in stocked}
        gone = plans["/ds/0003"].chunks[0].block_id
        (block,) = (tmp_path / "store" / "blocks").rglob(gone)
        block.unlink()  # the block holding /ds/0003's first chunk, and maybe its neighbours'
        handle = c.prefetch(list(stocked), tier="l1")
        progress = await handle
        lost = {path for path, plan in plans.items() if gone in plan.block_ids()}
        assert set(handle.failed) == lost and "/ds/0003" in lost and len(lost) < len(stocked)
        assert all(isinstance(e, BlobNotFound) for e in handle.failed.values())
        in_block = sum(ch.block_id == gone for plan in plans.values() for ch in plan.chunks)
        assert progress.chunks_done == 36 - in_block


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tier": "l3"}, ValueError, "tier 'l3' is not configured for this client; configured: 'l1'"),
        ({"tier": "l2"}, ValueError, "tier 'l2' is not configured for this client; configured: 'l1'"),
        ({"tier": "l4"}, ValueError, "tier must be one of 'l1', 'l2', 'l3', got 'l4'"),
        ({"tier": "l1", "pin_seconds": 5.0}, BadRequest, "pin_seconds applies to an l3 prefetch only"),
        ({"tier": "l1", "max_bytes": 0}, BadRequest, "max_bytes must be a positive int or None, got 0"),
        ({"tier": "l1", "max_bytes": 1.5}, BadRequest, "max_bytes must be a positive int or None, got 1.5"),
    ],
)
async def test_bad_arguments_are_refused_before_anything_starts(
    tmp_path: Path, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    async with local(tmp_path) as c:
        with pytest.raises(error, match="^" + re.escape(message) + "$"):
            c.prefetch(["/ds/0000"], **kwargs)  # type: ignore[arg-type]
        with pytest.raises(blobsdk.InvalidPath, match="must be absolute"):
            c.prefetch(["ds/0000"], tier="l1")


async def test_an_l1_prefetch_needs_an_l1(tmp_path: Path) -> None:
    async with local(tmp_path, l1=L1Config(capacity_bytes=0)) as c:
        with pytest.raises(ValueError, match=r"^tier 'l1' is not configured for this client; configured: none$"):
            c.prefetch("/a/b", tier="l1")


# --- cancellation -----------------------------------------------------------------------------


class SlowBlocks:
    """The block server's reads, held until ``release`` is set (a slow HDD)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: object) -> web.StreamResponse:
        if request.method == "GET" and request.path.startswith("/v1/blocks/"):
            self.started += 1
            await self.release.wait()
        return await handler(request)  # type: ignore[operator]


@pytest.fixture
async def slow(tmp_path: Path) -> AsyncIterator[tuple[ClientConfig, SlowBlocks]]:
    gate = SlowBlocks()
    async with AsyncExitStack() as stack:
        api_url = await stack.enter_async_context(running_app(api.make_app(SqliteMetadataStore(tmp_path / "m.sqlite"))))
        app = blockstore.make_app(tmp_path / "blocks")
        app.middlewares.insert(0, gate.middleware)
        block_url = await stack.enter_async_context(running_app(app))
        yield ClientConfig(api_url=api_url, block_urls=(block_url,), write=SMALL), gate
        gate.release.set()  # let the servers stop


def _module_of(task: asyncio.Task[object]) -> str:
    frame = getattr(task.get_coro(), "cr_frame", None)
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def client_tasks() -> set[asyncio.Task[object]]:
    """The running tasks this test's client made (not the in-loop servers'), told by the module
    their coroutine runs in: a file path names the checkout's folder, which a clone may call
    ``blobsdk`` too (then aiohttp's own server tasks under ``blobsdk/.venv`` would count)."""
    return {
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and not t.done() and _module_of(t).partition(".")[0] == "blobsdk"
    }


async def test_cancel_leaves_nothing_running(slow: tuple[ClientConfig, SlowBlocks]) -> None:
    config, gate = slow
    gate.release.set()
    async with blobsdk.Client(config) as c:
        await c.put_many(blobs(20).items())
    gate.release.clear()
    before = client_tasks()
    async with blobsdk.Client(config) as c:
        handle = c.prefetch("/ds/", tier="l1")
        while gate.started == 0:
            await asyncio.sleep(0.01)
        handle.cancel()
        progress = await handle
        assert handle.done and progress.chunks_done == 0 and progress.chunks_total == 60
        await asyncio.sleep(0)
        assert client_tasks() <= before  # no prefetch worker, fetch or GET left
        leftover = c.prefetch("/ds/", tier="l1")  # closing the client cancels a running one
    assert leftover.done
    gate.release.set()


# --- priority -----------------------------------------------------------------------------------


async def test_a_foreground_read_goes_before_the_queued_prefetch_reads(tmp_path: Path) -> None:
    """Two reads in flight per block server at most (a fixed limit); the block server records
    the order it receives GETs.  A foreground read issued while a prefetch has dozens queued
    is among the next two the server sees, not behind them."""
    order: list[tuple[float, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: object) -> web.StreamResponse:
        if request.method == "GET" and request.path.startswith("/v1/blocks/"):
            order.append((time.perf_counter(), request.headers.get("Range", "")))
        return await handler(request)  # type: ignore[operator]

    async with AsyncExitStack() as stack:
        api_url = await stack.enter_async_context(running_app(api.make_app(SqliteMetadataStore(tmp_path / "m.sqlite"))))
        app = blockstore.make_app(tmp_path / "blocks", latency_ms=5, spindles=2)
        app.middlewares.insert(0, record)
        block_url = await stack.enter_async_context(running_app(app))
        fixed = LimiterConfig(initial=2, min_limit=2, max_limit=2)
        config = ClientConfig(api_url=api_url, block_urls=(block_url,), write=SMALL, limiter=fixed)
        async with blobsdk.Client(config) as c:
            await c.put_many(blobs(40).items())
            await c.put("/fg/x", os.urandom(CHUNK))
            (ref,) = (await c.plan("/fg/x")).chunks
            wanted = f"bytes={ref.offset}-{ref.offset + ref.length - 1}"
            handle = c.prefetch("/ds/", tier="l1")
            while len(order) < 10:
                await asyncio.sleep(0.002)
            issued = time.perf_counter()
            await c.get("/fg/x")
            progress = await handle
    seen_after = [r for t, r in order if t >= issued]
    position = next(i for i, r in enumerate(seen_after) if r == wanted)
    assert position <= 2, f"the foreground read was the server's {position + 1}th GET after it was issued"
    assert progress.chunks_done == 120  # the order, not the time, is the check: the machine's speed varies


async def _eventually(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_read_that_joins_a_queued_prefetch_fetch_promotes_it(tmp_path: Path) -> None:
    """A prefetch has chunks queued at the block server's limit (2 in flight, held by the
    server); a get of the last one queued joins that fetch (no second GET) and promotes it:
    once the server answers, it is among the next two GETs, ahead of the prefetch's chunks
    queued before it (without the promotion it would be the last)."""
    order: list[str] = []
    gate = asyncio.Event()

    @web.middleware
    async def held(request: web.Request, handler: object) -> web.StreamResponse:
        if request.method == "GET" and request.path.startswith("/v1/blocks/"):
            order.append(f"{request.path.rsplit('/', 1)[-1]} {request.headers.get('Range', '')}")
            await gate.wait()
        return await handler(request)  # type: ignore[operator]

    async with AsyncExitStack() as stack:
        api_url = await stack.enter_async_context(running_app(api.make_app(SqliteMetadataStore(tmp_path / "m.sqlite"))))
        app = blockstore.make_app(tmp_path / "blocks")
        app.middlewares.insert(0, held)
        block_url = await stack.enter_async_context(running_app(app))
        fixed = LimiterConfig(initial=2, min_limit=2, max_limit=2)
        config = ClientConfig(api_url=api_url, block_urls=(block_url,), write=SMALL, limiter=fixed)
        async with blobsdk.Client(config) as c:
            data = blobs(8, size=CHUNK)
            await c.put_many(data.items())
            refs = {path: (await c.plan(path)).chunks[0] for path in data}
            ranges = {path: f"{r.block_id} bytes={r.offset}-{r.offset + r.length - 1}" for path, r in refs.items()}
            limiter = c._open.limiters.get(block_url)  # type: ignore[union-attr]
            handle = c.prefetch("/ds/", tier="l1")
            await _eventually(lambda: len(order) == 2 and limiter.queued == 6)
            last = [path for path in data if ranges[path] not in order][-1]  # the prefetch queues in path order
            reader = asyncio.create_task(c.get(last))
            demands = c._open.readpath._demands
            await _eventually(lambda: demands[refs[last].key].priority is Priority.FOREGROUND)
            gate.set()
            assert await reader == data[last]
            await handle
    assert len(order) == 8  # the get joined the prefetch's fetch: one GET per chunk
    assert ranges[last] in order[2:4], f"the joined fetch was GET {order.index(ranges[last]) + 1} of 8"


# --- L3 -----------------------------------------------------------------------------------------


async def test_after_an_l3_prefetch_a_cold_client_reads_nothing_from_l4(tmp_path: Path) -> None:
    async with start_cluster(tmp_path, block_servers=2, l3_nodes=2, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=SMALL, l1=L1Config(capacity_bytes=0))
        data = blobs(10)
        async with blobsdk.Client(config) as c:
            await c.put_many(data.items())
            handle = c.prefetch(["/ds/", "/x/gone", "/ds/none/"], tier="l3", pin_seconds=60)
            progress = await handle
            assert list(handle.failed) == ["/ds/none/", "/x/gone"]
            assert str(handle.failed["/ds/none/"]) == "no blobs under '/ds/none/'"
            assert (progress.chunks_done, progress.chunks_total) == (60, 60)  # 30 chunks, 2 replicas each
            assert progress.dataset_chunks == 30 and progress.bytes_total == 2 * progress.dataset_bytes
            assert progress.bytes_done == progress.bytes_total == 60 * CHUNK
            assert c.stats()["l4"]["hits"] == 0  # the nodes read L4, not the client
        async with blobsdk.Client(config) as cold:
            for path, blob in data.items():
                assert await cold.get(path) == blob
            stats = cold.stats()
            assert stats["l3"]["hits"] == 30 and stats["l3"]["node_fills"] == 0 and stats["l4"]["hits"] == 0


async def test_an_l3_prefetch_of_compressed_chunks_ends_with_every_byte_done(tmp_path: Path) -> None:
    """The nodes count the bytes they copy as stored (lz4): so does the prefetch's total, or a
    finished prefetch of compressible data said a few percent done, and so did the CLI's bar."""
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=2, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=SMALL)
        async with blobsdk.Client(config) as c:
            await c.put_many((f"/z/{i}", bytes([i]) * (3 * CHUNK)) for i in range(4))  # lz4 shrinks each chunk
            plans = [await c.plan(f"/z/{i}") for i in range(4)]
            stored = sum(ref.length for plan in plans for ref in plan.chunks)
            progress = await c.prefetch("/z/", tier="l3")
    assert (progress.chunks_done, progress.chunks_total, progress.dataset_chunks) == (24, 24, 12)
    assert progress.bytes_done == progress.bytes_total == 2 * stored < progress.dataset_bytes == 12 * CHUNK
    assert dataset_bytes_done(progress) == progress.dataset_bytes


async def test_an_l3_prefetch_reports_chunks_no_node_could_store(tmp_path: Path) -> None:
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=1, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=SMALL)
        async with blobsdk.Client(config) as c:
            await c.put("/a/kept", os.urandom(CHUNK))
            await c.put("/a/lost", os.urandom(2 * CHUNK))
            plan = await c.plan("/a/lost")
            for f in (tmp_path / "blocks-0").rglob(plan.chunks[0].block_id):
                f.unlink()
            handle = c.prefetch("/a/", tier="l3")
            progress = await handle
        assert list(handle.failed) == ["/a/lost"] and isinstance(handle.failed["/a/lost"], Unavailable)
        assert "L3 prefetch of chunk" in str(handle.failed["/a/lost"]) and "failed on every node" in str(handle.failed["/a/lost"])
        assert (progress.chunks_done, progress.chunks_total) == (1, 3)


async def test_a_cancelled_l3_prefetch_stops_its_jobs_on_the_nodes(tmp_path: Path) -> None:
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=1, latency_ms=200.0, spindles=1, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=SMALL)
        async with blobsdk.Client(config) as c:
            await c.put_many(blobs(10).items())
            handle = c.prefetch("/ds/", tier="l3")
            while handle.progress.chunks_total == 0:
                await asyncio.sleep(0.01)
            handle.cancel()
            await handle
            (node,) = (await c.node_stats())["l3"].values()
            assert node["jobs"] == {"running": 0, "kept": 1}  # type: ignore[index]
            assert handle.progress.chunks_done < handle.progress.chunks_total  # stopped part-way


# --- readahead ----------------------------------------------------------------------------------


async def stock(config: ClientConfig, gate: SlowBlocks, data: dict[str, bytes]) -> ClientConfig:
    """Write ``data`` with the gate open, close it; the config of a reader without L1."""
    gate.release.set()
    async with blobsdk.Client(config) as c:
        await c.put_many(data.items())
    gate.release.clear()
    return msgspec.structs.replace(config, l1=L1Config(capacity_bytes=0))


async def test_readahead_yields_in_order_and_keeps_depth_in_flight(slow: tuple[ClientConfig, SlowBlocks]) -> None:
    config, gate = slow
    data = blobs(30, size=CHUNK)
    async with blobsdk.Client(await stock(config, gate, data)) as c:
        reads = c.readahead(list(data), depth=5)
        first = asyncio.ensure_future(anext(reads))
        while gate.started < 5:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert gate.started == 5  # exactly depth reads ahead, none more
        gate.release.set()
        got = [await first] + [item async for item in reads]
        assert [p for p, _ in got] == list(data) and all(bytes(d) == data[p] for p, d in got)


async def test_readahead_bounds_the_bytes_ahead(slow: tuple[ClientConfig, SlowBlocks]) -> None:
    config, gate = slow
    data = blobs(10, size=CHUNK)
    async with blobsdk.Client(await stock(config, gate, data)) as c:
        reads = c.readahead(list(data), depth=8, max_bytes=3 * CHUNK)
        first = asyncio.ensure_future(anext(reads))
        async with asyncio.timeout(30):  # the three reads within the bound reach the server...
            while gate.started < 3:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # ...and a fourth would have by now (on a loaded machine, a miss, never a false failure)
        assert gate.started == 3
        gate.release.set()
        assert [p for p, _ in [await first] + [item async for item in reads]] == list(data)


async def test_readahead_raises_a_failure_at_its_turn_and_cancels_the_rest(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    async with local(tmp_path) as c:
        paths = ["/ds/0000", "/ds/0001", "/missing/x", "/ds/0002"]
        got: list[str] = []

        async def consume() -> None:
            async for path, data in c.readahead(paths, depth=4):
                got.append(path)
                assert data == stocked[path]

        with pytest.raises(BlobNotFound, match="no blob at '/missing/x'"):
            await consume()
        assert got == ["/ds/0000", "/ds/0001"]
        reads = c.readahead(iter(list(stocked)), depth=6)  # a generator of paths is fine
        async for _ in reads:
            break
        await reads.aclose()
        assert not client_tasks()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"depth": 0}, "depth must be an int >= 1, got 0"), ({"max_bytes": 0}, "max_bytes must be an int >= 1, got 0")],
)
async def test_readahead_arguments_are_checked(tmp_path: Path, kwargs: dict[str, int], message: str) -> None:
    async with local(tmp_path) as c:
        with pytest.raises(BadRequest, match=message):
            await anext(c.readahead(["/a/b"], **kwargs))


# --- the blocking client ------------------------------------------------------------------------


def test_sync_prefetch_and_readahead(tmp_path: Path) -> None:
    data = blobs(6)
    with blobsdk.SyncClient.local(tmp_path / "store", write=SMALL) as c:
        c.put_many(data.items())
        handle = c.prefetch(list(data), tier="l1")
        assert handle.wait() == PrefetchProgress(18, 18, 18 * CHUNK, 18 * CHUNK, 0, 18, 18 * CHUNK) and handle.done
        assert [(p, bytes(d)) for p, d in c.readahead(list(data), depth=2)] == list(data.items())
        assert c.stats()["l1"]["hits"] == 18
        assert c.plan("/ds/0000").size == 3 * CHUNK
        assert c.prefetch(list(data), tier="l1").cancel().chunks_total in (0, 18)


def test_a_sync_readahead_reads_from_when_it_is_made_and_close_cancels_it(tmp_path: Path) -> None:
    data = blobs(6)
    with blobsdk.SyncClient.local(tmp_path / "store", write=SMALL, l1=L1Config(capacity_bytes=0)) as c:
        c.put_many(data.items())
        reads = c.readahead(list(data), depth=2)
        until(lambda: c.stats()["l4"]["hits"] == 6)  # two blobs read before any next()
        time.sleep(0.05)
        assert c.stats()["l4"]["hits"] == 6  # and no more: depth 2
        reads.close()
        assert list(reads) == []
        assert c._loop is not None
        assert asyncio.run_coroutine_threadsafe(other_tasks(), c._loop.loop).result() == set()  # nothing left
        with c.readahead(list(data), depth=2) as again:
            assert [(p, bytes(d)) for p, d in again] == list(data.items())


async def other_tasks() -> set[asyncio.Task[object]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


def test_a_forked_child_gets_a_fresh_client(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put("/a/b", b"from the parent")
        pid = os.fork()
        if pid == 0:  # the child: the parent's loop thread does not exist here
            code = 1
            try:
                code = 0 if bytes(c.get("/a/b")) == b"from the parent" else 2
                c.put("/a/c", b"from the child")
            finally:
                os._exit(code)
        assert wait_for_child(pid) == 0
        assert bytes(c.get("/a/c")) == b"from the child"  # the parent's client still works


def test_what_a_sync_client_started_before_a_fork_says_so_in_the_child_instead_of_hanging(tmp_path: Path) -> None:
    """A readahead the parent started runs on the parent's loop thread, which the child does not
    have: its next() there is NotForkSafe, saying what to do (it used to wait for ever), and
    closing it there is a no-op.  The client itself opens afresh in the child; closed there, it
    is closed; the parent's readahead and client go on."""
    data = blobs(4, size=CHUNK)
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put_many(data.items())
        reads = c.readahead(list(data), depth=2)

        def child() -> object:
            with pytest.raises(blobsdk.NotForkSafe) as started_in_the_parent:
                next(reads)
            reads.close()
            got = bytes(c.get("/ds/0001")) == data["/ds/0001"]
            c.close()
            with pytest.raises(blobsdk.ClientClosed) as closed:
                c.get("/ds/0001")
            return str(started_in_the_parent.value), got, str(closed.value)

        started_before_fork = (
            "this was started by a SyncClient in the process this one was forked from (a readahead, prefetch, listing, "
            "checkpoint save or Checkpoints handle), on that process's loop thread, which fork() does not copy: start it "
            "again in this process (the SyncClient's own methods open a client here)"
        )
        closed = "SyncClient is not open: use `with client:`"
        assert in_a_forked_child(child) == (started_before_fork, True, closed)
        assert [(p, bytes(d)) for p, d in reads] == list(data.items())
        assert bytes(c.get("/ds/0002")) == data["/ds/0002"]


def test_a_sync_client_a_forked_child_never_used_closes_there_at_once(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put("/a/b", b"parent")

        def child() -> object:
            c.close()  # the parent's loop thread and client: set aside, not closed
            with pytest.raises(blobsdk.ClientClosed) as closed:
                c.get("/a/b")
            return str(closed.value)

        assert in_a_forked_child(child) == "SyncClient is not open: use `with client:`"
        assert bytes(c.get("/a/b")) == b"parent"


async def test_chunks_the_tier_would_not_keep_count_as_skipped(tmp_path: Path, stocked: dict[str, bytes]) -> None:
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=CHUNK // 2)  # smaller than one chunk
    async with local(tmp_path, l2=l2) as c:
        progress = await c.prefetch("/ds/", tier="l2", max_bytes=64 << 20)
        assert (progress.chunks_done, progress.chunks_skipped, progress.chunks_total) == (0, 36, 36)


def test_a_sync_client_refuses_calls_from_its_own_loop_thread(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put("/a/b", b"x")

        async def from_inside() -> None:
            c.get("/a/b")

        assert c._loop is not None
        with pytest.raises(RuntimeError, match="cannot be used from its own loop thread"):
            asyncio.run_coroutine_threadsafe(from_inside(), c._loop.loop).result(timeout=10)
