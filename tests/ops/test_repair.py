"""blobsdk.ops.repair: read repair and scrub of L4 replicas, against real (in-loop) block servers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest

from blobsdk.client import Client
from blobsdk.config import L1Config, RepairConfig, WriteConfig
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.ops.repair import Copy, Repairer, check_block, live_chunks
from blobsdk.sources import HttpBlockStore, ReplicatedBlockStore, UnderReplicated
from blobsdk.sources.base import new_block_id
from blobsdk.testing.plans import make_plan
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef, CommitOp
from servers.blockstore import make_app
from tests.helpers import running_app

CHUNK = 4096
SMALL = WriteConfig(chunk_size=CHUNK, block_size=64 * CHUNK)


class Store:
    """Three in-loop block servers, SQLite metadata and a client over them (no L1)."""

    def __init__(self, tmp: Path, stack: AsyncExitStack) -> None:
        self.tmp, self.stack = tmp, stack

    async def start(self) -> Store:
        self.session = await self.stack.enter_async_context(aiohttp.ClientSession())
        urls = [await self.stack.enter_async_context(running_app(make_app(self.tmp / f"r{i}"))) for i in range(3)]
        self.servers = [HttpBlockStore(self.session, url) for url in urls]
        self.metadata = await self.stack.enter_async_context(SqliteMetadataStore(self.tmp / "meta.sqlite"))
        self.blocks = await self.stack.enter_async_context(ReplicatedBlockStore(self.servers))
        client = Client.from_stores(self.metadata, self.blocks, write=SMALL, l1=L1Config(capacity_bytes=0))
        self.client = await self.stack.enter_async_context(client)
        return self

    async def put(self, chunks: int = 6) -> tuple[bytes, list[ChunkRef]]:
        data = os.urandom(chunks * CHUNK)
        await self.client.put("/b/x", data)
        await self.blocks.settle()  # every replica holds it before a test inspects each one
        return data, list((await self.metadata.get_plan("/b/x")).chunks)

    def file(self, i: int, block_id: str) -> Path:
        (path,) = (self.tmp / f"r{i}").rglob(block_id)
        return path

    def corrupt(self, i: int, ref: ChunkRef) -> None:
        path = self.file(i, ref.block_id)
        data = bytearray(path.read_bytes())
        data[ref.offset + ref.length // 2] ^= 0xFF
        path.write_bytes(data)

    def snapshot(self) -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(self.tmp.glob("r*/**/*")) if p.is_file()}

    @property
    def l4(self) -> L4Tier:
        tier = self.client._open.readpath.tiers[-1]
        assert isinstance(tier, L4Tier)
        return tier

    async def repaired(self) -> dict[str, int | float]:
        repairer = self.client._open.repairer
        assert repairer is not None
        for _ in range(500):
            if repairer.idle:
                break
            await asyncio.sleep(0.01)
        return self.client.stats()["l4"]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with AsyncExitStack() as stack:
        yield await Store(tmp_path, stack).start()


def first_for(store: Store, refs: list[ChunkRef], i: int) -> list[ChunkRef]:
    """The chunks whose first candidate is replica ``i``."""
    name = store.servers[i].name
    return [r for r in refs if store.l4.candidates(r.key)[0].name == name]


async def test_a_corrupt_replica_costs_one_dropped_copy_and_is_rewritten(store: Store) -> None:
    data, refs = await store.put(chunks=24)
    (block_id,) = {r.block_id for r in refs}
    bad = max(range(3), key=lambda i: len(first_for(store, refs, i)))
    for ref in refs:
        store.corrupt(bad, ref)
    reads = first_for(store, refs, bad)[:6]
    assert len(reads) == 6  # before the fix every one of these dropped a corrupt copy
    for ref in reads:
        i = refs.index(ref)
        assert bytes(await store.client.get("/b/x", i * CHUNK, CHUNK)) == data[i * CHUNK : (i + 1) * CHUNK]
    stats = await store.repaired()
    assert stats["corrupt"] == 1
    assert (stats["repairs_queued"], stats["repairs_done"], stats["repairs_failed"]) == (1, 1, 0)
    good = (bad + 1) % 3
    assert store.file(bad, block_id).read_bytes() == store.file(good, block_id).read_bytes()


async def test_a_replica_that_missed_a_write_is_brought_back_by_a_read(store: Store) -> None:
    data, refs = await store.put()
    block_id = refs[0].block_id
    lagging = next(i for i in range(3) if first_for(store, refs, i))
    await store.servers[lagging].delete_block(block_id)
    i = refs.index(first_for(store, refs, lagging)[0])
    assert bytes(await store.client.get("/b/x", i * CHUNK, CHUNK)) == data[i * CHUNK : (i + 1) * CHUNK]
    stats = await store.repaired()
    assert (stats["errors"], stats["corrupt"], stats["repairs_done"], stats["replicas_demoted"]) == (1, 0, 1, 0)
    assert await store.servers[lagging].read_range(block_id, 0, len(data)) == data


async def test_no_copy_is_rewritten_without_a_wholly_verified_one(store: Store) -> None:
    """Replica a is bad in chunk 0, replica b in chunk 1, replica c lost the block: each
    chunk still reads, but no copy verifies whole, so nothing may be copied anywhere.  (a is
    chunk 0's first candidate, so reading it meets a bad copy and asks for a repair.)"""
    data, refs = await store.put()
    block_id = refs[0].block_id
    names = [s.name for s in store.servers]
    a = names.index(store.l4.candidates(refs[0].key)[0].name)
    b, c = (i for i in range(3) if i != a)
    store.corrupt(a, refs[0])
    store.corrupt(b, refs[1])
    await store.servers[c].delete_block(block_id)
    before = store.snapshot()
    got = bytearray()
    for _ in refs:  # one chunk at a time: each tries its replicas in their order at rest
        got += await store.client.get("/b/x", len(got), CHUNK)
    assert bytes(got) == data
    stats = await store.repaired()
    # Asked for (once per read that met a bad copy while no repair was pending), never done.
    assert stats["repairs_queued"] >= 1 and stats["repairs_failed"] == stats["repairs_queued"]
    assert stats["repairs_done"] == 0
    assert store.snapshot() == before
    report = await store.client.scrub()
    assert (report.copies_bad, report.copies_missing, report.copies_repaired, report.ok) == (2, 1, 0, False)
    assert report.unrepaired == [block_id] and store.snapshot() == before


async def test_scrub_repairs_bad_and_missing_copies_once(store: Store) -> None:
    data, refs = await store.put()
    block_id = refs[0].block_id
    store.corrupt(0, refs[3])
    await store.servers[1].delete_block(block_id)
    seen: list[tuple[int, int, int]] = []
    report = await store.client.scrub(progress=lambda *p: seen.append(p))
    assert (report.blocks_checked, report.copies_checked, report.copies_bad, report.copies_missing) == (1, 3, 1, 1)
    assert (report.copies_repaired, report.blocks_unrepaired, report.ok) == (2, 0, True)
    assert seen == [(1, 1, len(data))]
    for server in store.servers:
        assert await server.read_range(block_id, 0, len(data)) == data
    again = await store.client.scrub()
    assert (again.copies_bad, again.copies_missing, again.copies_repaired, again.ok) == (0, 0, 0, True)


async def test_scrub_dry_run_changes_nothing(store: Store) -> None:
    _, refs = await store.put()
    store.corrupt(2, refs[0])
    await store.servers[0].delete_block(refs[0].block_id)
    before = store.snapshot()
    report = await store.client.scrub(dry_run=True)
    assert (report.dry_run, report.copies_bad, report.copies_missing, report.copies_repaired, report.ok) == (True, 1, 1, 0, False)
    assert store.snapshot() == before


async def test_check_block_leaves_an_unreachable_replica_alone(store: Store, tmp_path: Path) -> None:
    data, refs = await store.put()
    gone = HttpBlockStore(store.session, "http://127.0.0.1:9")  # nothing listens on port 9
    outcome = await check_block(refs[0].block_id, refs, [*store.servers, gone], repair=True)
    assert outcome.found[gone.name] is Copy.UNREACHABLE and not outcome.whole
    assert outcome.named(Copy.GOOD) == [s.name for s in store.servers] and outcome.nbytes == 3 * len(data)
    await gone.aclose()


async def test_live_chunks_index_only_live_plans(store: Store) -> None:
    _, refs = await store.put()
    assert await live_chunks(store.metadata) == {refs[0].block_id: refs}
    assert await live_chunks(store.metadata, {"0" * 32}) == {}
    await store.client.delete("/b/x")
    assert await live_chunks(store.metadata) == {}


class _Counting(SqliteMetadataStore):
    """Counts the plans its pages hand out."""

    plans_read = 0

    async def scan_page(self, start_after=None, limit=1000):  # type: ignore[no-untyped-def]
        plans, cursor = await super().scan_page(start_after, limit)
        self.plans_read += len(plans)
        return plans, cursor

    async def naming_page(self, block_ids, start_after=None, limit=1000):  # type: ignore[no-untyped-def]
        plans, cursor = await super().naming_page(block_ids, start_after, limit)
        self.plans_read += len(plans)
        return plans, cursor


async def test_the_live_chunks_of_some_blocks_cost_the_plans_naming_them_not_every_plan(tmp_path: Path) -> None:
    """issue 27: a repair batch read every live plan to find its blocks' chunks (O(plans)
    per batch); it reads the plans naming them, through the store's reverse index."""
    async with _Counting(tmp_path / "m.sqlite") as metadata:
        ops = [CommitOp(path=f"/b/x{i}", plan=make_plan(f"/b/x{i}", seed=i % 100)) for i in range(1000)]
        await metadata.commit_many(ops)
        wanted = {f"{7:032x}", f"{42:032x}"}
        found = await live_chunks(metadata, wanted)
        assert metadata.plans_read == 20  # 10 plans name each block
        assert sorted(found) == sorted(wanted) and all(len(refs) == 2 for refs in found.values())
        metadata.plans_read = 0
        assert (await live_chunks(metadata))[f"{7:032x}"] == found[f"{7:032x}"]  # scrub's walk: the same chunks
        assert metadata.plans_read == 1000


# --- the repairer's bounds, without servers ----------------------------------------------


class _Hanging:
    """A metadata store whose walks and lookups never end (until cancelled)."""

    def __init__(self) -> None:
        self.walking = asyncio.Event()

    async def _hang(self) -> AsyncIterator[object]:
        self.walking.set()
        await asyncio.Event().wait()
        yield None

    def iter_plans(self) -> AsyncIterator[object]:
        return self._hang()

    def iter_naming(self, block_ids: object) -> AsyncIterator[object]:
        return self._hang()


async def test_reports_are_bounded_and_the_same_block_is_queued_once() -> None:
    repairer = Repairer(_Hanging(), [], RepairConfig(queue=2))  # type: ignore[arg-type]
    for block_id in ("a" * 32, "a" * 32, "b" * 32, "c" * 32, "d" * 32):
        repairer.report(block_id)
    assert (repairer.stats.repairs_queued, repairer.stats.repairs_dropped) == (2, 2)


async def test_closing_cancels_a_repair_in_progress() -> None:
    metadata = _Hanging()
    repairer = Repairer(metadata, [], RepairConfig())  # type: ignore[arg-type]
    async with repairer:
        repairer.report("a" * 32)
        await metadata.walking.wait()
        assert not repairer.idle
        task = repairer._task
    assert task is not None and task.done() and repairer._task is None
    await repairer.aclose()  # idempotent


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"queue": 0}, "repair.queue must be >= 1, got 0"),
        ({"batch": 0}, "repair.batch must be >= 1, got 0"),
        ({"concurrency": 0}, "repair.concurrency must be >= 1, got 0"),
        ({"demote_seconds": -1.0}, "repair.demote_seconds must be >= 0, got -1.0"),
    ],
)
def test_repair_config_bounds(bad: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        RepairConfig(**bad)  # type: ignore[arg-type]
    assert str(exc.value) == message


async def test_scrub_concurrency_must_be_positive(store: Store) -> None:
    from blobsdk.ops import scrub

    with pytest.raises(ValueError, match="concurrency must be >= 1, got 0"):
        await scrub(store.metadata, store.blocks, concurrency=0)


async def test_a_recorded_under_replicated_block_is_made_whole_without_a_read(store: Store) -> None:
    data, refs = await store.put()
    block_id = refs[0].block_id
    await store.servers[0].delete_block(block_id)  # as if block server 0 missed the write
    ledger = UnderReplicated()
    ledger.add(block_id)
    quick = RepairConfig(retry_seconds=0.01, retry_max_seconds=0.01)
    async with Repairer(store.metadata, store.servers, quick, under_replicated=ledger) as repairer:
        async with asyncio.timeout(10):  # waits on the list's state, not on time
            while ledger:
                await asyncio.sleep(0.01)
        assert (repairer.stats.repairs_done, repairer.stats.repairs_failed) == (1, 0)
    assert await store.servers[0].read_range(block_id, 0, len(data)) == data


async def test_an_uncommitted_block_stays_listed_while_a_write_may_still_commit_it(store: Store) -> None:
    block_id = new_block_id()
    await store.servers[1].write_block(block_id, [b"not committed yet"])
    ledger = UnderReplicated()
    ledger.add(block_id)
    now = time.time()
    young = Repairer(store.metadata, store.servers, under_replicated=ledger, write_horizon=600, clock=lambda: now)
    assert await young.repair_under_replicated() == 0
    assert ledger.blocks() == [block_id]  # its put may commit it any moment: then it is repaired
    late = Repairer(store.metadata, store.servers, under_replicated=ledger, write_horizon=600, clock=lambda: now + 601)
    assert await late.repair_under_replicated() == 0
    assert (ledger.blocks(), late.stats.repairs_unneeded) == ([], 1)  # garbage now: gc's


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"retry_seconds": 0.0}, "repair.retry_seconds must be > 0, got 0.0"),
        (
            {"retry_seconds": 5.0, "retry_max_seconds": 1.0},
            "[repair] retry_seconds must be at most retry_max_seconds, got 5.0 and 1.0",
        ),
        ({"retry_max_seconds": float("inf")}, "repair.retry_max_seconds must be finite, got inf"),
    ],
)
def test_repair_retry_bounds(bad: dict[str, float], message: str) -> None:
    config = {"retry_seconds": 5.0, "retry_max_seconds": 120.0, **bad}
    with pytest.raises(ValueError) as info:
        RepairConfig(**config)
    assert str(info.value) == message
