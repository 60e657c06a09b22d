"""Client (async) and SyncClient (blocking, on a background loop thread).

A client is a MetadataStore plus a BlockStore plus the read and write paths over them.
``Client(config, stores=...)`` is the one constructor: ``config`` holds every setting and a
:class:`Stores` object says where the stores are: ``ClusterStores`` (the default: the API
server and block servers ``config`` names), ``LocalStores`` (``Client.local(dir)``, the
embedded default: SQLite + a local block directory, no servers) or ``GivenStores``
(``Client.from_stores``).  Every resource, tier and task is opened in ``__aenter__`` on one
exit stack and closed by it in ``__aexit__``/``aclose``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

import aiohttp

from . import gc as gc_module
from . import readahead as readahead_module
from . import repair as repair_module
from ._buffers import BufferPool
from ._forksafe import Executor, LoopThread
from ._here import Held
from ._http import new_session
from .cache.disk import DiskCache
from .cache.memory import MemoryCache
from .checkpoint import Checkpoints, Manifest, Part, Pending
from .config import ClientConfig, L1Config, L2Config, ReadConfig, WriteConfig, s3_location
from .errors import BlobError, ClientClosed, Forbidden, NotForkSafe
from .index import PARALLEL_OBJECTS, IndexProgress, IndexReport, index_s3, s3_source
from .limiter import LimiterRegistry, Priority, request_priority
from .metadata.base import MetadataStore
from .metadata.cache import CachedMetadataStore
from .paths import listing_prefix, validate_path
from .prefetch import Prefetch, Prefetcher, PrefetchProgress
from .readahead import READAHEAD_BYTES, READAHEAD_DEPTH
from .readpath import ReadPath
from .sources.base import BlockStore, Buffer
from .stats import LatencyHistogram, TierStats
from .tiers.base import Tier
from .tiers.l1 import L1Tier
from .tiers.l2 import L2Tier
from .tiers.l3 import L3Tier
from .tiers.l4 import L4Tier
from .tiers.peer import PeerTier
from .wire import BlobInfo, ReadPlan
from .writer import Progress, Writer

if TYPE_CHECKING:
    from .metadata.shared import SharedPlanCache

T = TypeVar("T")
STARTED_BEFORE_FORK = (
    "this was started by a SyncClient in the process this one was forked from (a readahead, prefetch, listing, "
    "checkpoint save or Checkpoints handle), on that process's loop thread, which fork() does not copy: start it "
    "again in this process (the SyncClient's own methods open a client here)"
)
Item = tuple[str, Buffer]


@dataclass(frozen=True)
class Backends:
    """A client's open stores, and in cluster mode what its remote tiers share."""

    metadata: MetadataStore
    blocks: BlockStore
    session: aiohttp.ClientSession | None = None  # cluster mode: the one shared session
    limiters: LimiterRegistry | None = None  # cluster mode: one adaptive limit per endpoint
    shared_plans: SharedPlanCache | None = None  # with [read] shared_plan_cache_url: it is ``metadata``


class Stores(Protocol):
    """Where a client's metadata and blocks are: ``open`` opens them, putting everything it
    opens on ``stack`` (closed with the client)."""

    async def open(self, stack: AsyncExitStack) -> Backends: ...


class ClusterStores:
    """The stores that ``config`` names (ValueError if none): the metadata API server
    (``api_url``) or Redis (``metadata_url``), and block servers (``block_urls``) or an
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
            from .metadata.shared import SharedPlanCache

            shared = SharedPlanCache(
                metadata, cfg.read.shared_plan_cache_url, ttl_seconds=cfg.read.shared_plan_cache_ttl_seconds, token=cfg.token
            )
            stack.push_async_callback(shared.aclose)  # closes Redis, then the store again (idempotent)
        blocks = await stack.enter_async_context(_block_store(cfg, session, limiters))
        return Backends(shared or metadata, blocks, session, limiters, shared)


def _metadata_store(cfg: ClientConfig, session: aiohttp.ClientSession) -> Any:
    """The metadata store ``cfg`` names, to enter (an async context manager)."""
    if cfg.metadata_url is not None:
        from .metadata.redis import RedisMetadataStore

        return RedisMetadataStore(cfg.metadata_url)
    from .metadata.http import HttpMetadataStore

    assert cfg.api_url is not None
    return HttpMetadataStore(session, cfg.api_url, cfg.token)


def _block_store(cfg: ClientConfig, session: aiohttp.ClientSession, limiters: LimiterRegistry) -> Any:
    """The L4 store ``cfg`` names, to enter (an async context manager)."""
    if cfg.source_url is not None:
        from .sources.s3 import S3BlockStore

        bucket, prefix = s3_location(cfg.source_url)
        s3 = cfg.s3
        return S3BlockStore(bucket, prefix, config=s3.options(), allow_http=s3.allow_http, limiter=limiters.get(cfg.source_url))
    from .sources.http import HttpBlockStore
    from .sources.replicated import ReplicatedBlockStore

    replicas = [HttpBlockStore(session, url, cfg.token, limiter=limiters.get(url)) for url in cfg.block_urls]
    return ReplicatedBlockStore(replicas, write_quorum=cfg.write.write_quorum)


class LocalStores:
    """Embedded: SQLite metadata in ``root/meta.sqlite``, blocks in ``root/blocks``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    async def open(self, stack: AsyncExitStack) -> Backends:
        from .metadata.sqlite import SqliteMetadataStore
        from .sources.local import LocalBlockStore

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


class Client:
    """The async blobsdk client.  Use as ``async with Client(config) as c:``.

    ``config`` sets everything but where the stores are, which ``stores`` says (default:
    the servers ``config`` names); :meth:`local` and :meth:`from_stores` are the other two.
    """

    def __init__(self, config: ClientConfig, *, stores: Stores | None = None) -> None:
        self.config = config
        self._stores = stores if stores is not None else ClusterStores(config)
        self._stack: AsyncExitStack | None = None
        self._state: _Open | None = None

    @classmethod
    def local(
        cls,
        root: str | Path,
        *,
        write: WriteConfig = WriteConfig(),
        read: ReadConfig = ReadConfig(),
        l1: L1Config = L1Config(),
        l2: L2Config | None = None,
    ) -> Client:
        """Embedded client: SQLite metadata in ``root/meta.sqlite``, blocks in ``root/blocks``;
        L1 in memory and, if ``l2`` is given, an L2 directory."""
        return cls(ClientConfig(write=write, read=read, l1=l1, l2=l2), stores=LocalStores(root))

    @classmethod
    def from_stores(
        cls,
        metadata: MetadataStore,
        blocks: BlockStore,
        *,
        write: WriteConfig = WriteConfig(),
        read: ReadConfig = ReadConfig(),
        l1: L1Config = L1Config(),
        l2: L2Config | None = None,
    ) -> Client:
        """A client over stores the caller built (and closes)."""
        return cls(ClientConfig(write=write, read=read, l1=l1, l2=l2), stores=GivenStores(metadata, blocks))

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise ClientClosed("client is already open")
        stack = AsyncExitStack()
        try:
            executor = stack.enter_context(Executor(max_workers=4, thread_name_prefix="blobsdk"))
            backends = await self._stores.open(stack)
            self._state = await _Open.start(stack, backends, executor, self.config)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stack, self._stack, self._state = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    def copy(self) -> Client:
        """A new, unopened client of the same config and stores (a forked child's)."""
        return Client(self.config, stores=self._stores)

    @property
    def _open(self) -> _Open:
        if self._state is None:
            raise ClientClosed("client is not open: use `async with client:`")
        return self._state

    # --- public API ------------------------------------------------------------------

    async def put(self, path: str, data: Buffer, *, if_version: int | None = None) -> BlobInfo:
        """Write ``data`` as a new version of ``path``; returns once durable and committed.
        ``if_version``: None unconditional, 0 create-only, N only if the live version is N."""
        _check_bytes_like(data)
        plan = await self._open.writer.put(path, data, if_version)
        return plan.info()

    async def put_many(self, items: Iterable[Item] | AsyncIterable[Item], *, progress: Progress | None = None) -> list[BlobInfo]:
        """Write many (usually small) blobs packed into shared blocks.  Each blob is atomic;
        blobs are committed in batches, so a failure part-way leaves earlier ones written.
        ``progress(blobs_done, bytes_done)`` is called after each batch commits."""
        plans = await self._open.writer.put_many(items, progress)
        return [p.info() for p in plans]

    async def get(self, path: str, offset: int = 0, length: int | None = None) -> bytearray:
        """The bytes of ``path`` (or of ``[offset, offset+length)``, clamped to the blob)."""
        state = self._open
        plan = state.plans.peek(path) or await state.plans.get_plan(validate_path(path))
        return await self._read(plan, offset, length)

    async def _read(self, plan: ReadPlan, offset: int = 0, length: int | None = None) -> bytearray:
        return await self._fresh_grants(plan, lambda p: self._open.readpath.read(p, offset, length))

    async def _read_into(self, plan: ReadPlan, out: memoryview, fill_memory: bool) -> None:
        await self._fresh_grants(plan, lambda p: self._open.readpath.read_into(p, out, fill_memory=fill_memory))

    async def _fresh_grants(self, plan: ReadPlan, read: Callable[[ReadPlan], Awaitable[T]]) -> T:
        """``read(plan)``; if the data servers refuse the plan's chunk grants (expired by
        their clock: see blobsdk/auth.py), once more with fresh ones."""
        try:
            return await read(plan)
        except Forbidden:
            if not plan.grants_expire:
                raise
        self._open.plans.invalidate(plan.path)
        return await read(await self._open.plans.get_plan(plan.path))

    def prefetch(
        self,
        paths_or_prefixes: str | Iterable[str],
        *,
        tier: str = "l3",
        pin_seconds: float | None = None,
        max_bytes: int | None = None,
    ) -> Prefetch:
        """Start warming ``tier`` ("l1", "l2" or "l3") with these blobs (a string ending in
        "/" is a prefix) and return its handle at once; see blobsdk/prefetch.py.  A tier
        this client does not have is a ValueError naming the ones it has."""
        return self._open.prefetcher.start(paths_or_prefixes, tier, pin_seconds=pin_seconds, max_bytes=max_bytes)

    def readahead(
        self, paths: Iterable[str], *, depth: int = READAHEAD_DEPTH, max_bytes: int = READAHEAD_BYTES
    ) -> AsyncGenerator[tuple[str, bytearray], None]:
        """``(path, data)`` for each path, in order, with up to ``depth`` reads (and at most
        ``max_bytes`` of blobs) in flight ahead of the consumer; see blobsdk/readahead.py.
        Leave it early with ``aclose()`` (or ``contextlib.aclosing``): that cancels the
        reads in flight at once, where an abandoned generator waits for the collector."""
        return readahead_module.readahead(self._open.plans, self._read, paths, depth=depth, max_bytes=max_bytes)

    def checkpoints(self, prefix: str, *, keep: int = 3, chunk_size: int | None = None) -> Checkpoints:
        """The delta checkpoints under ``prefix`` (a path prefix: ``/bucket/ckpt/job1``),
        keeping the last ``keep``, cut into ``chunk_size`` chunks (default: the write
        config's); see blobsdk/checkpoint.py.  A save still running when the client closes
        is waited for."""
        state = self._open
        warm = None if state.l3 is None else partial(state.prefetcher.start, tier="l3")
        return Checkpoints(
            prefix,
            metadata=state.metadata,
            writer=state.writer,
            read=self._read,
            read_into=self._read_into,
            executor=state.executor,
            keep=keep,
            chunk_size=self.config.write.chunk_size if chunk_size is None else chunk_size,
            background=state.saves,
            warm=warm,
        )

    async def plan(self, path: str) -> ReadPlan:
        """The read plan of ``path``'s live version (through the plan cache)."""
        return await self._open.plans.get_plan(validate_path(path))

    async def stat(self, path: str) -> BlobInfo:
        plan = await self._open.metadata.get_plan(validate_path(path))
        return plan.info()

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncGenerator[BlobInfo, None]:
        """Every blob whose path starts with ``prefix``, sorted by path; a bare bucket
        (``/a``) lists that bucket only, as ``/a/`` does (blobsdk/paths.py)."""
        async for info in self._open.metadata.list(listing_prefix(prefix), start_after):
            yield info

    async def delete(self, path: str, *, if_version: int | None = None) -> BlobInfo:
        """Remove the live version; its blocks are reclaimed by :meth:`gc`."""
        return await self._open.metadata.delete(validate_path(path), if_version)

    async def index_s3(
        self, url: str, dest: str, *, progress: Callable[[IndexProgress], None] | None = None, parallel: int = PARALLEL_OBJECTS
    ) -> IndexReport:
        """Make the objects under ``url`` (``s3://bucket[/dir]``) blobs under ``dest``, in
        place: their chunks are byte ranges of the objects, checksummed once now, and a read
        of an object changed since raises SourceChanged; indexing again is incremental.  This
        client's L4 must be S3 (``source_url``), and reach ``url``'s bucket with the same
        endpoint and credentials.  ``parallel``: objects read at once.  See blobsdk/index.py."""
        state = self._open
        return await index_s3(s3_source(state.blocks), state.writer, url, dest, progress=progress, parallel=parallel)

    async def gc(self, grace: float = 3600.0, *, dry_run: bool = False) -> gc_module.GcReport:
        """Delete L4 blocks no committed blob references and older than ``grace`` seconds
        (see blobsdk/gc.py).  Its requests queue behind this client's foreground ones."""
        state = self._open
        with request_priority(Priority.PREFETCH):
            return await gc_module.collect(
                state.metadata, state.blocks, grace, self.config.write.max_write_seconds, dry_run=dry_run
            )

    async def scrub(self, *, dry_run: bool = False, progress: repair_module.Progress | None = None) -> repair_module.ScrubReport:
        """Verify every replica's copy of every live L4 block; repair bad and missing copies
        from a verified one (not if ``dry_run``).  See blobsdk/repair.py."""
        state = self._open
        return await repair_module.scrub(state.metadata, state.blocks, dry_run=dry_run, progress=progress)

    async def node_stats(self) -> dict[str, dict[str, object]]:
        """What the shared cache nodes report about themselves (``{"l3": {url: stats}}``)."""
        l3 = self._open.l3
        return {} if l3 is None else {l3.name: await l3.node_stats()}

    async def flush(self) -> None:
        """Wait until every write-behind cache fill queued so far (L2) is on disk."""
        for tier in self._open.readpath.tiers:
            await tier.flush()

    def stats(self) -> dict[str, dict[str, int | float]]:
        """Per-tier counters ("l1", "l2", "peer", "l3", "l4"): hits (chunks served), misses,
        bytes, corrupt (copies dropped), errors, p50/p99 latency, enabled; and "plan" (the
        read-plan cache: hits, misses, entries)."""
        return self._open.stats()

    def latency_histograms(self) -> dict[str, LatencyHistogram]:
        """Each tier's hits by the seconds they took, since the client opened, over fixed
        buckets (``blobsdk.stats.LATENCY_BUCKETS``): what ``ClientCollector`` exports as a
        Prometheus histogram.  Tiers the client does not have are absent."""
        return self._open.latency_histograms()


def _check_bytes_like(data: object) -> None:
    """A TypeError naming the argument, not memoryview's, for a str or other non-buffer."""
    try:
        memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"put: data must be a bytes-like object (bytes, bytearray, memoryview, ...), not {type(data).__name__}"
        ) from None


class _Open:
    """What an open client holds: its stores, plan cache, tiers, read path and writer."""

    def __init__(
        self,
        backends: Backends,
        plans: CachedMetadataStore,
        readpath: ReadPath,
        writer: Writer,
        prefetcher: Prefetcher,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.blocks = backends.blocks
        self.shared_plans = backends.shared_plans
        self.executor = executor
        self.saves: set[asyncio.Task[Any]] = set()  # checkpoint saves in the background
        self.limiters = backends.limiters
        self.plans = plans
        self.metadata = plans  # every metadata call goes through the plan cache
        self.readpath = readpath
        self.writer = writer
        self.prefetcher = prefetcher
        self.l3 = next((t for t in readpath.tiers if isinstance(t, L3Tier)), None)

    @classmethod
    async def start(cls, stack: AsyncExitStack, backends: Backends, executor: ThreadPoolExecutor, config: ClientConfig) -> _Open:
        read = config.read
        plans = CachedMetadataStore(
            backends.metadata, ttl_seconds=read.plan_cache_ttl_seconds, max_entries=read.plan_cache_entries
        )
        buffers = BufferPool(read.parallel_chunks * config.write.chunk_size)  # a read's chunks in flight
        tiers = [await stack.enter_async_context(tier) for tier in _tiers(backends, config, buffers)]
        readpath = ReadPath(tiers, executor, read.parallel_chunks, buffers)
        stack.push_async_callback(readpath.aclose)  # no fetch outlives its tiers
        capacities = {"l1": config.l1.capacity_bytes, "l2": config.l2.capacity_bytes if config.l2 else 0}
        prefetcher = Prefetcher(plans, readpath, read.parallel_chunks, capacities)
        stack.push_async_callback(prefetcher.aclose)  # first out: no prefetch outlives the read path
        writer = Writer(plans, backends.blocks, config.write, executor)
        state = cls(backends, plans, readpath, writer, prefetcher, executor)
        stack.push_async_callback(state.finish_saves)  # first out: a save finishes before its stores close
        return state

    async def finish_saves(self) -> None:
        """Wait for the checkpoint saves still running (their errors are their handles')."""
        await asyncio.gather(*self.saves, return_exceptions=True)

    def stats(self) -> dict[str, dict[str, int | float]]:
        out: dict[str, dict[str, int | float]] = {name: {**TierStats().as_dict(), "enabled": False} for name in TIER_NAMES}
        for tier in self.readpath.tiers:
            out[tier.name] = {**tier.stats.as_dict(), "enabled": True, **tier.extra_stats()}
        out["plan"] = self.plans.stats()
        if self.shared_plans is not None:
            out["shared_plan"] = {**self.shared_plans.stats()}
        if self.limiters is not None:
            out["limits"] = {url: stats["limit"] for url, stats in self.limiters.stats().items()}
        return out

    def latency_histograms(self) -> dict[str, LatencyHistogram]:
        return {tier.name: tier.stats.histogram() for tier in self.readpath.tiers}


TIER_NAMES = ("l1", "l2", "peer", "l3", "l4")


def _tiers(backends: Backends, config: ClientConfig, buffers: BufferPool) -> Iterator[Tier]:
    """The read path's tiers, top to bottom, for ``config`` (each is entered by the caller,
    as it is built, so a failure part-way closes the ones before it)."""
    if config.l1.capacity_bytes > 0:
        yield L1Tier(MemoryCache(config.l1.capacity_bytes, ttl_seconds=config.l1.ttl_seconds, name="l1"))
    if config.l2 is not None:
        yield _l2_tier(config.l2)
    if config.tracker_urls and backends.session is not None:
        yield PeerTier(
            backends.session,
            config.tracker_urls,
            config.peer,
            token=config.token,
            hedge=config.hedge,
            limiters=LimiterRegistry(config.limiter),
        )
    if config.l3_urls and backends.session is not None:
        l3 = config.l3
        yield L3Tier(
            backends.session,
            config.l3_urls,
            token=config.token,
            replicas=l3.replicas,
            down_seconds=l3.down_seconds,
            hedge=config.hedge,
            limiters=backends.limiters,
            buffers=buffers,
        )
    yield L4Tier(
        backends.blocks,
        hedge=config.hedge,
        limiters=backends.limiters,
        metadata=backends.metadata,
        repair=config.repair,
        buffers=buffers,
        write_horizon=config.write.max_write_seconds,
    )


def _l2_tier(cfg: L2Config) -> L2Tier:
    cache = DiskCache(
        cfg.dir, capacity_bytes=cfg.capacity_bytes, min_free_ratio=cfg.min_free_ratio, ttl_seconds=cfg.ttl_seconds, name="l2"
    )
    return L2Tier(cache)


class SyncClient:
    """The same API, blocking: an event loop runs on a background thread owned by this
    object.  Use as ``with SyncClient.local(dir) as c:``.

    Fork-safe: a process forked from one where this client is open (a DataLoader worker)
    inherits neither its thread nor its loop, so the first call there opens a fresh client
    of the same config and stores in the child (the parent's loop, sockets and files are set
    aside, not closed: they still serve the parent), instead of waiting forever on a loop
    that is not running there."""

    def __init__(self, config: ClientConfig | Client) -> None:
        self._client = config if isinstance(config, Client) else Client(config)
        self._opened: Held[tuple[LoopThread, Client]] = Held()  # the loop thread and the client it runs

    @property
    def _loop(self) -> LoopThread | None:
        """The loop thread of this client in this process (None: not open here)."""
        held = self._opened.get()
        return None if held is None else held[0]

    @classmethod
    def local(
        cls,
        root: str | Path,
        *,
        write: WriteConfig = WriteConfig(),
        read: ReadConfig = ReadConfig(),
        l1: L1Config = L1Config(),
        l2: L2Config | None = None,
    ) -> SyncClient:
        """A blocking :meth:`Client.local`."""
        return cls(Client.local(root, write=write, read=read, l1=l1, l2=l2))

    def __enter__(self) -> Self:
        self._opened.put((LoopThread("blobsdk-sync"), self._client))
        try:
            self._run(self._client.__aenter__())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is None:  # not open, or open in the parent only (a forked child that never used it)
            self._opened.take()  # sets the parent's aside
            return
        try:
            self._run(self._client.aclose())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        held = self._opened.take()
        assert held is not None
        held[0].stop()

    def _here(self) -> Client:
        """The client to call in this process (a fresh one in a forked child): every method
        asks for it before it makes its coroutine, which is bound to one client."""
        if self._opened.inherited:
            self._reopen_after_fork()
        return self._client

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        thread = self._loop
        if thread is None:
            coro.close()
            if self._opened.inherited:  # called by what a parent started: see STARTED_BEFORE_FORK
                raise NotForkSafe(STARTED_BEFORE_FORK)
            raise ClientClosed("SyncClient is not open: use `with client:`")
        if threading.current_thread() is thread.thread:  # it would wait for itself forever
            coro.close()
            raise RuntimeError("a SyncClient cannot be used from its own loop thread: use the async Client there")
        return asyncio.run_coroutine_threadsafe(coro, thread.loop).result()

    def _reopen_after_fork(self) -> None:
        """In a forked child: open a fresh client here (the parent's loop thread and client
        are set aside, not closed: they are the parent's)."""
        self._client = self._client.copy()
        self.__enter__()

    def _iterate(self, items: AsyncGenerator[T, None]) -> Generator[T, None, None]:
        """A blocking iterator over an async generator running on the loop thread."""
        try:
            while True:
                try:
                    yield self._run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            if self._loop is not None:
                self._run(items.aclose())

    def put(self, path: str, data: Buffer, *, if_version: int | None = None) -> BlobInfo:
        return self._run(self._here().put(path, data, if_version=if_version))

    def put_many(self, items: Iterable[Item], *, progress: Progress | None = None) -> list[BlobInfo]:
        return self._run(self._here().put_many(items, progress=progress))

    def get(self, path: str, offset: int = 0, length: int | None = None) -> bytearray:
        return self._run(self._here().get(path, offset, length))

    def stat(self, path: str) -> BlobInfo:
        return self._run(self._here().stat(path))

    def list(self, prefix: str, *, start_after: str | None = None) -> Generator[BlobInfo, None, None]:
        """Pages are fetched lazily as the iterator advances; ``close()`` it if you stop early."""
        return self._iterate(self._here().list(prefix, start_after=start_after))

    def readahead(self, paths: Iterable[str], *, depth: int = READAHEAD_DEPTH, max_bytes: int = READAHEAD_BYTES) -> SyncReadahead:
        """:meth:`Client.readahead`, blocking: the reads run ahead on the loop thread while
        the caller works on the last item.  They start at once, not at the first ``next()``,
        so an iterator made early (the next epoch's, while this one ends) has its first
        blobs ready; ``close()`` it (or use ``with``) if you stop early."""
        return SyncReadahead(self, self._here().readahead(paths, depth=depth, max_bytes=max_bytes))

    def prefetch(
        self,
        paths_or_prefixes: str | Iterable[str],
        *,
        tier: str = "l3",
        pin_seconds: float | None = None,
        max_bytes: int | None = None,
    ) -> SyncPrefetch:
        """:meth:`Client.prefetch`; the handle's ``wait()`` blocks until it ended."""
        targets = paths_or_prefixes if isinstance(paths_or_prefixes, str) else list(paths_or_prefixes)
        client = self._here()

        async def start() -> Prefetch:
            return client.prefetch(targets, tier=tier, pin_seconds=pin_seconds, max_bytes=max_bytes)

        return SyncPrefetch(self, self._run(start()))

    def plan(self, path: str) -> ReadPlan:
        return self._run(self._here().plan(path))

    def checkpoints(self, prefix: str, *, keep: int = 3, chunk_size: int | None = None) -> SyncCheckpoints:
        """:meth:`Client.checkpoints`, blocking."""
        client = self._here()

        async def make() -> Checkpoints:
            return client.checkpoints(prefix, keep=keep, chunk_size=chunk_size)

        return SyncCheckpoints(self, self._run(make()))

    def delete(self, path: str, *, if_version: int | None = None) -> BlobInfo:
        return self._run(self._here().delete(path, if_version=if_version))

    def index_s3(
        self, url: str, dest: str, *, progress: Callable[[IndexProgress], None] | None = None, parallel: int = PARALLEL_OBJECTS
    ) -> IndexReport:
        return self._run(self._here().index_s3(url, dest, progress=progress, parallel=parallel))

    def gc(self, grace: float = 3600.0, *, dry_run: bool = False) -> gc_module.GcReport:
        return self._run(self._here().gc(grace, dry_run=dry_run))

    def flush(self) -> None:
        self._run(self._here().flush())

    def stats(self) -> dict[str, dict[str, int | float]]:
        return self._here().stats()

    def latency_histograms(self) -> dict[str, LatencyHistogram]:
        return self._here().latency_histograms()


async def _next(pages: AsyncIterator[T]) -> T:
    return await anext(pages)


class SyncReadahead(Iterator[tuple[str, bytearray]]):
    """:meth:`SyncClient.readahead`'s iterator, whose reads started when it was made."""

    def __init__(self, client: SyncClient, items: AsyncGenerator[tuple[str, bytearray], None]) -> None:
        self._client = client
        self._items: AsyncGenerator[tuple[str, bytearray], None] | None = items
        self._first: asyncio.Task[tuple[str, bytearray]] | None = client._run(_started(items))

    def __next__(self) -> tuple[str, bytearray]:
        if self._items is None:
            raise StopIteration
        first, self._first = self._first, None
        try:
            return self._client._run(_next(self._items) if first is None else _result(first))
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Cancel the reads in flight; the iterator then ends."""
        items, first, self._items, self._first = self._items, self._first, None, None
        if items is not None and self._client._loop is not None:  # open in this process
            self._client._run(_closed(items, first))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _started(items: AsyncIterator[T]) -> asyncio.Task[T]:
    return asyncio.create_task(_next(items))


async def _result(task: asyncio.Task[T]) -> T:
    return await task


async def _closed(items: AsyncGenerator[T, None], first: asyncio.Task[T] | None) -> None:
    """Close ``items``, once its ``first`` step (still running, or never awaited) is over."""
    if first is not None:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
    await items.aclose()


class SyncCheckpoints:
    """:class:`~blobsdk.checkpoint.Checkpoints` from the thread of a :class:`SyncClient`."""

    def __init__(self, client: SyncClient, checkpoints: Checkpoints) -> None:
        self._client = client
        self._checkpoints = checkpoints

    def save(self, step: int, state: Mapping[str, Any]) -> SyncPending:
        """Blocks while the state is staged (the training pause); the upload goes on."""
        return SyncPending(self._client, self._client._run(self._checkpoints.save(step, state)))

    def load(self, step: int | None = None, *, select: Callable[[tuple[str, ...]], bool] | None = None) -> dict[str, Any]:
        return self._client._run(self._checkpoints.load(step, select=select))

    def write_part(self, state: Mapping[str, Any]) -> Part:
        return self._client._run(self._checkpoints.write_part(state))

    def commit(self, step: int, parts: Sequence[Part]) -> Manifest:
        return self._client._run(self._checkpoints.commit(step, parts))

    def list(self) -> list[int]:
        return self._client._run(self._checkpoints.list())

    def manifest(self, step: int | None = None) -> Manifest:
        return self._client._run(self._checkpoints.manifest(step))


class SyncPending:
    """A checkpoint save's :class:`~blobsdk.checkpoint.Pending`, from a SyncClient's thread."""

    def __init__(self, client: SyncClient, pending: Pending) -> None:
        self._client = client
        self._pending = pending

    @property
    def done(self) -> bool:
        return self._pending.done

    @property
    def error(self) -> BaseException | None:
        return self._pending.error

    def wait(self) -> Manifest:
        """Block until the checkpoint is committed; its manifest (or the save's error)."""
        return self._client._run(self._pending.wait())


class SyncPrefetch:
    """A :class:`~blobsdk.prefetch.Prefetch` seen from the thread of a :class:`SyncClient`."""

    def __init__(self, client: SyncClient, handle: Prefetch) -> None:
        self._client = client
        self._handle = handle

    @property
    def done(self) -> bool:
        return self._handle.done

    @property
    def progress(self) -> PrefetchProgress:
        return self._handle.progress

    @property
    def failed(self) -> dict[str, BlobError]:
        return self._handle.failed

    def wait(self) -> PrefetchProgress:
        """Block until it ended; its final progress."""
        return self._client._run(self._handle.wait())

    def cancel(self) -> PrefetchProgress:
        """Stop it and block until nothing of it runs."""

        async def cancel() -> PrefetchProgress:
            self._handle.cancel()
            return await self._handle.wait()

        return self._client._run(cancel())

    def __repr__(self) -> str:
        return repr(self._handle)
