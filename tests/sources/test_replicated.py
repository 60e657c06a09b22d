from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from blobsdk.chunks.call import Call
from blobsdk.errors import BlockNotFound, ClientClosed, Unavailable
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.ops import collect_garbage
from blobsdk.sources import HttpBlockStore, LocalBlockStore, ReplicatedBlockStore, UnderReplicated
from blobsdk.sources._replicated import majority, resolve_quorum
from blobsdk.sources.base import BlockReplica, BlockStore, Buffer, new_block_id
from blobsdk.testing.sources import BlockStoreTests, listed
from blobsdk.wire import BlockInfo
from servers.blockstore import make_app
from tests.helpers import running_app


class BlockServers:
    """In-loop block servers, each one stoppable on its own; a server's PUTs can be held
    behind ``gate`` (an Event) to play a replica that is slow to acknowledge."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.urls: list[str] = []
        self.gate = asyncio.Event()
        self._stacks: list[AsyncExitStack] = []

    async def start(self, *, gated: bool = False) -> str:
        app = make_app(self.tmp_path / f"replica{len(self.urls)}")
        if gated:
            app.middlewares.append(self._hold_puts)
        stack = AsyncExitStack()
        self.urls.append(await stack.enter_async_context(running_app(app)))
        self._stacks.append(stack)
        return self.urls[-1]

    async def stop(self, i: int) -> None:
        await self._stacks[i].aclose()

    async def aclose(self) -> None:
        self.gate.set()  # a held PUT would keep its server from shutting down
        for stack in self._stacks:
            await stack.aclose()

    @web.middleware
    async def _hold_puts(self, request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        if request.method == "PUT":
            await self.gate.wait()
        return await handler(request)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[BlockServers]:
    cluster = BlockServers(tmp_path)
    try:
        yield cluster
    finally:
        await cluster.aclose()


async def replicated(
    servers: BlockServers, session: aiohttp.ClientSession, n: int = 3, gated: int | None = None, **kwargs: object
) -> ReplicatedBlockStore:
    for i in range(n):
        await servers.start(gated=i == gated)
    return ReplicatedBlockStore([HttpBlockStore(session, url) for url in servers.urls], **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def store(servers: BlockServers, session: aiohttp.ClientSession) -> AsyncIterator[ReplicatedBlockStore]:
    async with await replicated(servers, session) as s:
        yield s


class TestReplicatedBlockStore(BlockStoreTests):
    @pytest.fixture
    async def store(self, servers: BlockServers, session: aiohttp.ClientSession) -> AsyncIterator[ReplicatedBlockStore]:
        async with await replicated(servers, session, write_quorum="all") as s:  # each write on every replica: read back
            yield s


async def test_it_is_write_only_the_l4_tier_reads_its_replicas(store: ReplicatedBlockStore) -> None:
    assert isinstance(store, BlockStore) and not isinstance(store, BlockReplica)
    assert not hasattr(store, "read_into") and not hasattr(store, "read_range")
    assert all(isinstance(r, BlockReplica) for r in store.replicas)


async def test_replicas_are_the_stores_in_order(tmp_path: Path) -> None:
    stores = [LocalBlockStore(tmp_path / str(i)) for i in range(3)]
    async with ReplicatedBlockStore(stores) as s:
        assert s.replicas == tuple(stores)
        assert all(name in s.name for name in (x.name for x in stores))
        nested = ReplicatedBlockStore([s])
        assert nested.replicas == tuple(stores)  # flattened


async def test_a_write_lands_on_every_replica(store: ReplicatedBlockStore) -> None:
    block = new_block_id()
    await store.write_block(block, [b"everywhere"])
    await store.settle()  # the third copy may land after the quorum's answer
    for replica in store.replicas:
        assert await replica.read_range(block, 0, 10) == b"everywhere"


@pytest.mark.parametrize("quorum", [0, 4, -1, True, "most"])
async def test_quorum_must_fit_the_replicas(tmp_path: Path, quorum: object) -> None:
    stores = [LocalBlockStore(tmp_path / str(i)) for i in range(3)]
    message = f'write_quorum {quorum!r} must be between 1 and 3 (the replicas), or "all"'
    with pytest.raises(ValueError) as info:
        ReplicatedBlockStore(stores, write_quorum=quorum)  # type: ignore[arg-type]
    assert str(info.value) == message
    for s in stores:
        await s.aclose()


@pytest.mark.parametrize(("replicas", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
async def test_the_default_quorum_is_a_majority(tmp_path: Path, replicas: int, quorum: int) -> None:
    stores = [LocalBlockStore(tmp_path / str(i)) for i in range(replicas)]
    async with ReplicatedBlockStore(stores) as s:
        assert s.write_quorum == quorum == majority(replicas)
    assert resolve_quorum("all", replicas) == replicas and resolve_quorum(1, replicas) == 1


async def test_no_stores_is_value_error() -> None:
    with pytest.raises(ValueError):
        ReplicatedBlockStore([])


async def test_writes_meet_a_quorum_of_two_with_one_server_down(servers: BlockServers, session: aiohttp.ClientSession) -> None:
    async with await replicated(servers, session, write_quorum=2) as s:
        await servers.stop(1)
        block = new_block_id()
        await s.write_block(block, [b"two of three"])
        assert await s.replicas[0].read_range(block, 0, 12) == b"two of three"  # with replica 2: the quorum


async def test_writes_needing_every_replica_fail_with_one_server_down(
    servers: BlockServers, session: aiohttp.ClientSession
) -> None:
    async with await replicated(servers, session, write_quorum="all") as s:
        await servers.stop(1)
        with pytest.raises(Unavailable) as info:
            await s.write_block(new_block_id(), [b"all three"])
        assert servers.urls[1].removeprefix("http://") in str(info.value)
        assert servers.urls[0].removeprefix("http://") not in str(info.value)


async def test_everything_fails_when_every_server_is_down(servers: BlockServers, session: aiohttp.ClientSession) -> None:
    async with await replicated(servers, session, write_quorum=1) as s:
        block = new_block_id()
        await s.write_block(block, [b"x"])
        for i in range(3):
            await servers.stop(i)
        with pytest.raises(Unavailable):
            await s.write_block(new_block_id(), [b"x"])
        with pytest.raises(Unavailable):
            await s.delete_block(block)


async def test_quorum_returns_before_a_slow_replica_which_close_then_awaits(
    servers: BlockServers, session: aiohttp.ClientSession
) -> None:
    s = await replicated(servers, session, gated=2, write_quorum=2)
    block = new_block_id()
    async with asyncio.timeout(10):  # without the early return this would hang on the gate
        await s.write_block(block, [b"late copy"])
    async with HttpBlockStore(session, servers.urls[2]) as slow:
        with pytest.raises(BlockNotFound):
            await slow.read_range(block, 0, 9)
        servers.gate.set()
        await s.aclose()  # the write still running is owned: close waits for it
        assert await slow.read_range(block, 0, 9) == b"late copy"


class HeldWrites:
    """A replica on a slow disk: its writes start only once ``gate`` opens."""

    def __init__(self, inner: LocalBlockStore, gate: asyncio.Event) -> None:
        self.inner, self.gate = inner, gate

    name = property(lambda self: self.inner.name)
    replicas = property(lambda self: (self,))

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        await self.gate.wait()
        await self.inner.write_block(block_id, parts)

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        await self.inner.read_into(block_id, offset, out, call=call)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        return await self.inner.read_range(block_id, offset, length)

    async def delete_block(self, block_id: str) -> None:
        await self.inner.delete_block(block_id)

    def list_blocks(self) -> AsyncIterator[BlockInfo]:
        return self.inner.list_blocks()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_caller_may_reuse_its_buffers_once_the_quorum_answered(tmp_path: Path) -> None:
    gate = asyncio.Event()
    slow = HeldWrites(LocalBlockStore(tmp_path / "slow"), gate)
    assert isinstance(slow, BlockStore)
    s = ReplicatedBlockStore([LocalBlockStore(tmp_path / "a"), LocalBlockStore(tmp_path / "b"), slow], write_quorum=2)
    block, buf = new_block_id(), bytearray(b"original")
    await s.write_block(block, [buf, memoryview(buf)[:3]])
    buf[:] = b"reused!!"
    gate.set()
    await s.aclose()  # waits for the slow write
    async with LocalBlockStore(tmp_path / "slow") as check:
        assert await check.read_range(block, 0, 11) == b"originalori"


async def test_close_cancels_writes_that_outlive_the_close_timeout(servers: BlockServers, session: aiohttp.ClientSession) -> None:
    s = await replicated(servers, session, gated=0, write_quorum=2, close_timeout=0.05)
    await s.write_block(new_block_id(), [b"x"])
    async with asyncio.timeout(10):  # the gate never opens: only a cancel lets close return
        await s.aclose()
    with pytest.raises(ClientClosed):
        await s.write_block(new_block_id(), [b"x"])


async def test_list_is_the_sorted_union_without_duplicates(store: ReplicatedBlockStore) -> None:
    shared, only0, only2 = new_block_id(), new_block_id(), new_block_id()
    await store.write_block(shared, [b"s"])
    await store.replicas[0].write_block(only0, [b"00"])
    await store.replicas[2].write_block(only2, [b"222"])
    assert await listed(store) == sorted([(shared, 1), (only0, 2), (only2, 3)])


async def test_a_listing_with_a_replica_down_fails_rather_than_shrinks(
    servers: BlockServers, session: aiohttp.ClientSession
) -> None:
    async with await replicated(servers, session, write_quorum=1) as s:
        await s.write_block(new_block_id(), [b"x"])
        await servers.stop(1)
        with pytest.raises(Unavailable):
            await listed(s)


async def test_a_write_acked_with_a_server_down_is_recorded_under_replicated(
    servers: BlockServers, session: aiohttp.ClientSession
) -> None:
    async with await replicated(servers, session) as s:  # default quorum: 2 of 3
        whole = new_block_id()
        await s.write_block(whole, [b"three copies"])
        await s.settle()
        await servers.stop(1)
        short = new_block_id()
        await s.write_block(short, [b"two copies"])  # acked: a majority holds it
        assert await s.replicas[0].read_range(short, 0, 10) == b"two copies"  # with replica 2: the quorum
        assert s.under_replicated.blocks() == [short]
        assert (s.under_replicated.recorded, s.under_replicated.dropped) == (1, 0)


class FailsLate(HeldWrites):
    """A replica whose writes fail once ``gate`` opens: one that times out after the quorum
    already answered."""

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        await self.gate.wait()
        raise Unavailable(f"{self.name}: timed out")


async def test_a_lagging_write_that_fails_after_the_ack_is_recorded(tmp_path: Path) -> None:
    gate = asyncio.Event()
    late = FailsLate(LocalBlockStore(tmp_path / "late"), gate)
    async with ReplicatedBlockStore([LocalBlockStore(tmp_path / "a"), late, LocalBlockStore(tmp_path / "b")]) as s:
        block = new_block_id()
        await s.write_block(block, [b"acked"])
        assert block not in s.under_replicated  # the third write is still running
        gate.set()
        await s.settle()
        assert s.under_replicated.blocks() == [block]


async def test_a_write_without_its_quorum_is_not_acked_nor_recorded(
    servers: BlockServers, session: aiohttp.ClientSession
) -> None:
    async with await replicated(servers, session) as s:
        await servers.stop(0)
        await servers.stop(2)
        block = new_block_id()
        with pytest.raises(Unavailable) as info:
            await s.write_block(block, [b"one copy"])
        assert str(info.value).startswith("a write needs 2 of the 3 replicas and 2 failed: connection refused at 127.0.0.1:")
        assert len(s.under_replicated) == 0  # never committed: gc's, not the repairer's


class WatchedDeletes(HeldWrites):
    """A slow-disk replica that tells when it is asked to delete."""

    def __init__(self, inner: LocalBlockStore, gate: asyncio.Event) -> None:
        super().__init__(inner, gate)
        self.deleting = asyncio.Event()

    async def delete_block(self, block_id: str) -> None:
        self.deleting.set()
        await self.inner.delete_block(block_id)


async def test_a_delete_waits_for_the_blocks_lagging_writes(tmp_path: Path) -> None:
    gate = asyncio.Event()
    slow = WatchedDeletes(LocalBlockStore(tmp_path / "slow"), gate)
    async with ReplicatedBlockStore([LocalBlockStore(tmp_path / "a"), slow, LocalBlockStore(tmp_path / "b")]) as s:
        block = new_block_id()
        await s.write_block(block, [b"late copy"])  # acked by two; the slow one's write is held
        delete = asyncio.create_task(s.delete_block(block))
        for _ in range(10):  # loop steps, no I/O: before, the delete reached every replica in 2
            await asyncio.sleep(0)
        assert not slow.deleting.is_set()  # before: deleted, then the held write landed a copy
        gate.set()
        await delete
        assert slow.deleting.is_set() and await listed(s) == []


async def test_writes_past_their_quorum_hold_at_most_max_lagging_bytes(tmp_path: Path) -> None:
    gate = asyncio.Event()
    stopped = HeldWrites(LocalBlockStore(tmp_path / "stopped"), gate)  # like a SIGSTOPped server
    stores = [LocalBlockStore(tmp_path / "a"), stopped, LocalBlockStore(tmp_path / "b")]
    async with ReplicatedBlockStore(stores, max_lagging_bytes=10) as s:
        first, second = new_block_id(), new_block_id()
        await s.write_block(first, [b"12345"])
        await s.write_block(second, [b"123", b"45678"])  # 13 bytes held: the oldest write goes
        gate.set()
        await s.settle()
        assert s.under_replicated.blocks() == [first]  # cancelled: a missing copy, for repair
        assert await listed(stopped) == [(second, 8)]  # before: both landed, 13 bytes pinned till then


def test_the_under_replicated_list_is_bounded() -> None:
    ledger = UnderReplicated(capacity=2)
    a, b, c = (new_block_id() for _ in range(3))
    for block in (a, b, a, c):
        ledger.add(block)
    assert (ledger.blocks(), ledger.recorded, ledger.dropped) == ([a, b], 2, 1)
    ledger.discard(a)
    ledger.add(c)
    assert ledger.blocks() == [b, c]


def _old_block_id() -> str:
    """A block id minted an hour ago: past any gc grace."""
    return f"{int((time.time() - 3600) * 1000):012x}{os.urandom(10).hex()}"


async def test_gc_deletes_an_under_replicated_block_everywhere_and_refuses_with_a_server_down(
    servers: BlockServers, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with await replicated(servers, session) as s, SqliteMetadataStore(tmp_path / "meta.sqlite") as metadata:
        short, elsewhere = _old_block_id(), _old_block_id()
        for i in (0, 2):  # a copy on two of three: what a write acked by a majority leaves
            await s.replicas[i].write_block(short, [b"garbage"])
        report = await collect_garbage(metadata, s, grace=10, max_write_seconds=5)
        assert (report.blocks_scanned, report.blocks_deleted) == (1, 1)  # the replica lacking it is no failure
        assert await listed(s) == []
        await s.write_block(elsewhere, [b"more garbage"])
        await s.settle()
        await servers.stop(1)
        with pytest.raises(Unavailable):  # its copies cannot be listed: nothing is deleted anywhere
            await collect_garbage(metadata, s, grace=10, max_write_seconds=5)
        for i in (0, 2):
            assert await s.replicas[i].read_range(elsewhere, 0, 12) == b"more garbage"
