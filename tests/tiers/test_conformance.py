"""Every tier passes the Tier conformance suite (tests/tiers/conformance.py): L1 over a
MemoryCache, L2 over a DiskCache, the peer tier fetching from another peer found through
in-process fake trackers, L3 against a real in-loop flash node, L4 over a local block store
and over two HTTP block servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from blobsdk.cache import DiskCache, MemoryCache
from blobsdk.sources import LocalBlockStore
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L1Tier, L2Tier, L3Tier, L4Tier, PeerTier
from blobsdk.wire import ChunkRef
from servers._common.faults import FAULTS_KEY, FaultConfig, FaultInjector, FaultRule
from servers.flash import FlashConfig, make_app
from tests.helpers import running_app
from tests.tiers.test_l4 import Replicas

from .conformance import Chunks, TierTests, flip_byte
from .fake_trackers import FakeTrackers

CACHE_KEYS = frozenset({"cache_entries", "cache_bytes", "cache_capacity_bytes", "cache_evictions"})
HEDGE_KEYS = frozenset({"hedge_primaries", "hedge_hedges_sent"})
CORRUPT_CHUNK_GETS = FaultConfig(rules=(FaultRule(route="/v1/chunks", methods=("GET",), corrupt_rate=1.0),))


# --- L1 ---------------------------------------------------------------------------------------


@dataclass
class L1Harness:
    cache: MemoryCache
    tier: L1Tier

    async def hold(self, chunks: Chunks) -> None:
        for ref, raw in zip(chunks.refs, chunks.raws, strict=True):
            assert self.cache.put_nowait(ref.key, raw)

    async def corrupt(self, ref: ChunkRef) -> None:
        raise AssertionError("L1 has no stored copy to corrupt")


class TestL1Tier(TierTests):
    name = "l1"
    keeps_fills = True
    peeks = True
    no_stored_copy = "L1 holds only raw bytes verified before they were filled: no stored copy can go bad"
    extra_keys = CACHE_KEYS

    @pytest.fixture
    async def harness(self) -> L1Harness:
        cache = MemoryCache(64 << 20)
        return L1Harness(cache, L1Tier(cache))  # the tier owns the cache: leaving it closes it


# --- L2 ---------------------------------------------------------------------------------------


@dataclass
class L2Harness:
    cache: DiskCache
    tier: L2Tier

    async def hold(self, chunks: Chunks) -> None:
        for ref, raw in zip(chunks.refs, chunks.raws, strict=True):
            assert await self.cache.put(ref.key, raw)

    async def corrupt(self, ref: ChunkRef) -> None:
        """Flip the last byte of the chunk file (root/<key[:2]>/<key>: header, payload)."""
        path = self.cache.root / ref.key[:2] / ref.key
        flip_byte(path, path.stat().st_size - 1)


class TestL2Tier(TierTests):
    name = "l2"
    keeps_fills = True
    extra_keys = CACHE_KEYS | {"fills_dropped", "fill_failures"}

    @pytest.fixture
    async def harness(self, tmp_path: Path) -> L2Harness:
        cache = DiskCache(tmp_path / "l2", capacity_bytes=64 << 20, min_free_ratio=0)
        return L2Harness(cache, L2Tier(cache))  # the tier owns the cache: entering it opens it


# --- peer -------------------------------------------------------------------------------------


@dataclass
class PeerHarness:
    """The tier under test and a second peer, the holder, both on one fake tracker
    deployment: what the holder serves is what the tier reads."""

    tier: PeerTier
    holder: PeerTier
    trackers: FakeTrackers

    async def hold(self, chunks: Chunks) -> None:
        """The holder serves ``chunks`` (as chunks it read from L3/L4) and has announced them."""
        for ref, raw in zip(chunks.refs, chunks.raws, strict=True):
            await self.holder.fill(ref, memoryview(raw))
        await self.trackers.until_held(self.holder.peer_id, [ref.key for ref in chunks.refs])

    async def corrupt(self, ref: ChunkRef) -> None:
        """The holder's copy goes bad in its memory (a peer holds no other)."""
        serving = self.holder.sharing.serving
        bad = bytearray(serving[ref.key])
        bad[len(bad) // 2] ^= 0xFF
        serving[ref.key] = memoryview(bad)


class TestPeerTier(TierTests):
    name = "peer"
    extra_keys = frozenset(
        {"serving_entries", "serving_bytes", "uploads", "bytes_served", "uploads_refused", "uploads_missing"}
        | {"tracker_errors", "tracker_timeouts", "tracker_nonsense", "bad_sources", "disallowed", "reported"}
        | {"not_kept", "held", "over_budget", "asked_again", "busy_waits", "reannounced"}
    )
    extra_prefixes = ("hedge_",)

    @pytest.fixture
    async def harness(self) -> AsyncIterator[PeerHarness]:
        trackers = FakeTrackers()
        async with aiohttp.ClientSession() as session, PeerTier(session, trackers.connect) as holder:
            yield PeerHarness(PeerTier(session, trackers.connect), holder, trackers)


# --- L3 ---------------------------------------------------------------------------------------


@dataclass
class L3Harness:
    """One real flash node over one block server; the node's fault injection corrupts."""

    tier: L3Tier
    replicas: Replicas
    faults: FaultInjector

    async def hold(self, chunks: Chunks) -> None:
        assert self.replicas.blocks is not None
        await self.replicas.blocks.write_block(chunks.block_id, chunks.stored)

    async def corrupt(self, ref: ChunkRef) -> None:
        """From now on the node flips a byte of every chunk it sends (its flash copy and L4
        stay good: the node verifies both itself)."""
        self.faults.configure(CORRUPT_CHUNK_GETS)


L3_MEMBERS = ("nodes", "nodes_added", "nodes_removed")  # L3's member set and how it changed


class TestL3Tier(TierTests):
    name = "l3"
    extra_keys = frozenset({"node_hits", "node_fills", "bad_copies_reported", "nodes_down", *L3_MEMBERS}) | HEDGE_KEYS
    extra_prefixes = ("hedge_",)

    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[L3Harness]:
        async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
            replicas = Replicas(tmp_path, session, stack)
            await replicas.start(1)
            config = FlashConfig(
                dir=str(tmp_path / "flash"), block_urls=tuple(replicas.urls), capacity_bytes=64 << 20, min_free_ratio=0
            )
            app = make_app(config, faults=FaultConfig())  # an injector that does nothing until told
            url = await stack.enter_async_context(running_app(app))
            yield L3Harness(L3Tier(session, [url]), replicas, app[FAULTS_KEY])


# --- L4 ---------------------------------------------------------------------------------------


@dataclass
class L4LocalHarness:
    tier: L4Tier
    store: LocalBlockStore

    async def hold(self, chunks: Chunks) -> None:
        await self.store.write_block(chunks.block_id, chunks.stored)

    async def corrupt(self, ref: ChunkRef) -> None:
        flip_byte(self.store.block_path(ref.block_id), ref.offset + ref.length // 2)


@dataclass
class L4HttpHarness:
    tier: L4Tier
    replicas: Replicas

    async def hold(self, chunks: Chunks) -> None:
        assert self.replicas.blocks is not None
        await self.replicas.blocks.write_block(chunks.block_id, chunks.stored)

    async def corrupt(self, ref: ChunkRef) -> None:
        for i in range(len(self.replicas.urls)):
            self.replicas.corrupt(i, ref)


class L4Tests(TierTests):
    name = "l4"
    last = True
    extra_keys = HEDGE_KEYS | {"replicas_demoted"}
    extra_prefixes = ("hedge_", "repairs_")  # repairs_*: only with metadata (blobsdk/ops/repair.py)


class TestL4TierOverALocalStore(L4Tests):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[L4LocalHarness]:
        async with LocalBlockStore(tmp_path / "blocks") as store:
            yield L4LocalHarness(L4Tier(ReplicaReader(store)), store)


class TestL4TierOverTwoBlockServers(L4Tests):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[L4HttpHarness]:
        async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
            replicas = Replicas(tmp_path, session, stack)
            blocks = await replicas.start(2)
            yield L4HttpHarness(L4Tier(ReplicaReader(blocks)), replicas)
