"""How a client is assembled from its config: its stores, then its tiers and read/write paths.

Two steps, both on the client's one exit stack, so that whatever was opened is closed in
reverse order, also after a failure part-way:

- a :class:`Stores` object opens the metadata and block stores (:class:`Backends`):
  ``ClusterStores`` (the servers or object store the config names), ``LocalStores`` (the
  embedded SQLite + block directory of ``Client.local``) or ``GivenStores`` (stores the caller
  built, ``Client.from_stores``);
- :meth:`Assembled.start` builds over them the plan cache, the tiers named by the config (top
  to bottom: :data:`~blobsdk.stats.TIER_NAMES`), the read path, the prefetcher and the writer.

It is its own module so that the async API (blobsdk/client.py) reads as the API, and the
wiring of stores and tiers, which grows with every tier or backend, is read in one place.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import aiohttp

from ._arguments import wrong
from .cache import DiskCache, MemoryCache
from .config import ClientConfig, L2Config, s3_location
from .metadata import CachedMetadataStore, MetadataStore
from .net import LimiterRegistry, new_session
from .ops import Repairer
from .peer import tracker_servers
from .read import Prefetcher, ReadPath
from .runtime import BufferPool
from .sources import BlockStore, RecordsUnderReplicated
from .stats import TIER_NAMES, LatencyHistogram, TierStats
from .tail import ReplicaReader
from .tiers import L1Tier, L2Tier, L3Tier, L4Tier, PeerTier, Tier
from .write import KnownChunks, Writer

if TYPE_CHECKING:
    from .metadata import SharedPlanCache


@dataclass(frozen=True)
class Backends:
    """A client's open stores, and in cluster mode what its remote tiers share."""

    metadata: MetadataStore
    blocks: BlockStore
    session: aiohttp.ClientSession | None = None  # cluster mode: the one shared session
    limiters: LimiterRegistry | None = None  # cluster mode: one adaptive limit per endpoint
    shared_plans: SharedPlanCache | None = None  # with [read] shared_plan_cache_url: it is ``metadata``


@runtime_checkable
class Stores(Protocol):
    """Where a client's metadata and blocks are: ``open`` opens them, putting everything it
    opens on ``stack`` (closed with the client)."""

    async def open(self, stack: AsyncExitStack) -> Backends: ...


class ClusterStores:
    """The stores that ``config`` names (ValueError if none): the metadata API servers
    (``api_url`` or ``api_urls``) or Redis (``metadata_url``), and block servers (``block_urls``) or an
    object store (``source_url``)."""

    def __init__(self, config: ClientConfig) -> None:
        if not config.names_stores:  # __post_init__ saw to it that L4 is named with the metadata
            raise ValueError(
                "no stores configured: need api_url (or metadata_url) and block_urls (or source_url), or use Client.local(DIR)"
            )
        self.config = config

    async def open(self, stack: AsyncExitStack) -> Backends:
        cfg = self.config
        session = await stack.enter_async_context(new_session(cfg.timeouts))
        limiters = LimiterRegistry(cfg.limiter)
        metadata = await stack.enter_async_context(_metadata_store(cfg, session))
        shared = None
        if cfg.read.shared_plan_cache_url is not None:
            from .metadata import SharedPlanCache

            shared = SharedPlanCache(
                metadata, cfg.read.shared_plan_cache_url, ttl_seconds=cfg.read.shared_plan_cache_ttl_seconds, token=cfg.token
            )
            stack.push_async_callback(shared.aclose)  # closes Redis, then the store again (idempotent)
        blocks = await stack.enter_async_context(_block_store(cfg, session, limiters))
        return Backends(shared or metadata, blocks, session, limiters, shared)


def _metadata_store(cfg: ClientConfig, session: aiohttp.ClientSession) -> Any:
    """The metadata store ``cfg`` names, to enter (an async context manager)."""
    if cfg.metadata_url is not None:
        from .metadata import RedisMetadataStore

        return RedisMetadataStore(cfg.metadata_url)
    from .metadata import HttpMetadataStore

    assert cfg.api_servers
    return HttpMetadataStore(session, cfg.api_servers, cfg.token, timeouts=cfg.timeouts)


def _block_store(cfg: ClientConfig, session: aiohttp.ClientSession, limiters: LimiterRegistry) -> Any:
    """The L4 store ``cfg`` names, to enter (an async context manager)."""
    if cfg.source_url is not None:
        from .sources import S3BlockStore

        bucket, prefix = s3_location(cfg.source_url)
        s3 = cfg.s3
        limiter, stall_s = limiters.get(cfg.source_url, by_latency=False), cfg.timeouts.stall
        return S3BlockStore(bucket, prefix, config=s3.options(), allow_http=s3.allow_http, stall_s=stall_s, limiter=limiter)
    from .sources import HttpBlockStore, ReplicatedBlockStore

    stall_s = cfg.timeouts.stall
    replicas = [HttpBlockStore(session, url, cfg.token, limiter=limiters.get(url), stall_s=stall_s) for url in cfg.block_urls]
    return ReplicatedBlockStore(replicas, write_quorum=cfg.write.write_quorum, noun="block servers")


class LocalStores:
    """Embedded: SQLite metadata in ``root/meta.sqlite``, blocks in ``root/blocks``."""

    def __init__(self, root: str | Path) -> None:
        if not isinstance(root, str | os.PathLike):
            raise wrong("Client.local: root", "a directory path", root)
        self.root = Path(root)

    async def open(self, stack: AsyncExitStack) -> Backends:
        from .metadata import SqliteMetadataStore
        from .sources import LocalBlockStore

        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        metadata = await stack.enter_async_context(SqliteMetadataStore(self.root / "meta.sqlite"))
        blocks = await stack.enter_async_context(LocalBlockStore(self.root / "blocks"))
        return Backends(metadata, blocks)


class GivenStores:
    """Stores the caller built, opened and closes."""

    def __init__(self, metadata: MetadataStore, blocks: BlockStore) -> None:
        self.backends = Backends(metadata, blocks)

    async def open(self, stack: AsyncExitStack) -> Backends:
        return self.backends


class Assembled:
    """What an open client holds: its stores, plan cache, tiers, read path and writer."""

    def __init__(
        self,
        backends: Backends,
        plans: CachedMetadataStore,
        readpath: ReadPath,
        writer: Writer,
        prefetcher: Prefetcher,
        executor: ThreadPoolExecutor,
        repairer: Repairer | None = None,
    ) -> None:
        self.blocks = backends.blocks
        self.repairer = repairer  # L4's background repair: the blocks reads report, the writes left under-replicated
        self.shared_plans = backends.shared_plans
        self.executor = executor
        self.saves: set[asyncio.Task[Any]] = set()  # checkpoint saves in the background
        self.known_chunks = KnownChunks()  # chunks the checkpoints' saves wrote or confirmed
        self.limiters = backends.limiters
        self.plans = plans
        self.metadata = plans  # every metadata call goes through the plan cache
        self.readpath = readpath
        self.writer = writer
        self.prefetcher = prefetcher
        self.l3 = next((t for t in readpath.tiers if isinstance(t, L3Tier)), None)

    @classmethod
    async def start(
        cls, stack: AsyncExitStack, backends: Backends, executor: ThreadPoolExecutor, config: ClientConfig
    ) -> Assembled:
        read = config.read
        plans = CachedMetadataStore(
            backends.metadata, ttl_seconds=read.plan_cache_ttl_seconds, max_entries=read.plan_cache_entries
        )
        buffers = BufferPool(read.parallel_chunks * config.write.chunk_size)  # a read's chunks in flight
        repairer = _repairer(backends, config)
        if repairer is not None:  # entered before the tiers: it outlives every read that reports to it
            await stack.enter_async_context(repairer)
        tiers = [await stack.enter_async_context(tier) for tier in _tiers(backends, config, buffers, repairer)]
        readpath = ReadPath(tiers, executor, read.parallel_chunks, buffers)
        stack.push_async_callback(readpath.aclose)  # no fetch outlives its tiers
        capacities = {"l1": config.l1.capacity_bytes, "l2": config.l2.capacity_bytes if config.l2 else 0}
        prefetcher = Prefetcher(plans, readpath, read.parallel_chunks, capacities)
        stack.push_async_callback(prefetcher.aclose)  # first out: no prefetch outlives the read path
        writer = Writer(plans, backends.blocks, config.write, executor)
        state = cls(backends, plans, readpath, writer, prefetcher, executor, repairer)
        stack.push_async_callback(state.finish_saves)  # first out: a save finishes before its stores close
        return state

    async def finish_saves(self) -> None:
        """Wait for the checkpoint saves still running (their errors are their handles')."""
        await asyncio.gather(*self.saves, return_exceptions=True)

    def stats(self) -> dict[str, dict[str, int | float]]:
        out: dict[str, dict[str, int | float]] = {name: {**TierStats().as_dict(), "enabled": False} for name in TIER_NAMES}
        for tier in self.readpath.tiers:
            out[tier.name] = {**tier.stats.as_dict(), "enabled": True, **tier.extra_stats()}
        if self.repairer is not None:
            out["l4"].update(self.repairer.figures())
        out["plan"] = self.plans.stats()
        if self.shared_plans is not None:
            out["shared_plan"] = {**self.shared_plans.stats()}
        if self.limiters is not None:
            out["limits"] = {url: stats["limit"] for url, stats in self.limiters.stats().items()}
        return out

    def latency_histograms(self) -> dict[str, LatencyHistogram]:
        return {tier.name: tier.stats.histogram() for tier in self.readpath.tiers}


def _repairer(backends: Backends, config: ClientConfig) -> Repairer | None:
    """The repairer of L4's copies, over a store of more than one replica (with one, a read
    that met a bad copy has nothing to mend it from); it works through the under-replicated
    list of a store that keeps one."""
    blocks = backends.blocks
    if len(blocks.replicas) < 2:
        return None
    ledger = blocks.under_replicated if isinstance(blocks, RecordsUnderReplicated) else None
    return Repairer(
        backends.metadata, blocks.replicas, config.repair, under_replicated=ledger, write_horizon=config.write.max_write_seconds
    )


def _tiers(backends: Backends, config: ClientConfig, buffers: BufferPool, repairer: Repairer | None) -> Iterator[Tier]:
    """The read path's tiers, top to bottom, for ``config`` (each is entered by the caller,
    as it is built, so a failure part-way closes the ones before it)."""
    if config.l1.capacity_bytes > 0:
        yield L1Tier(MemoryCache(config.l1.capacity_bytes, ttl_seconds=config.l1.ttl_seconds, name="l1"))
    if config.l2 is not None:
        yield _l2_tier(config.l2)
    if config.tracker_urls and backends.session is not None:
        trackers = tracker_servers(backends.session, config.tracker_urls, config.token, timeout_s=config.peer.tracker_timeout_s)
        yield PeerTier(backends.session, trackers, config.peer, hedge=config.hedge, limiters=LimiterRegistry(config.limiter))
    if config.l3_urls and backends.session is not None:
        yield L3Tier(
            backends.session,
            config.l3_urls,
            config.l3,
            token=config.token,
            hedge=config.hedge,
            limiters=backends.limiters,
            buffers=buffers,
        )
    yield L4Tier(
        ReplicaReader(
            backends.blocks,
            hedge=config.hedge,
            limiters=backends.limiters,
            repair=config.repair,
            buffers=buffers,
            report=repairer,
        )
    )


def _l2_tier(cfg: L2Config) -> L2Tier:
    cache = DiskCache(
        cfg.dir, capacity_bytes=cfg.capacity_bytes, min_free_ratio=cfg.min_free_ratio, ttl_seconds=cfg.ttl_seconds, name="l2"
    )
    return L2Tier(cache)
