"""The async :class:`Client`: the blobsdk API (put, get, list, prefetch, readahead,
checkpoints, gc, scrub, ...) over an open set of stores and tiers.

A client is a MetadataStore plus a BlockStore plus the read and write paths over them.
``Client(config, stores=...)`` is the one constructor: ``config`` holds every setting and a
:class:`~blobsdk.assembly.Stores` object says where the stores are: ``ClusterStores`` (the
default: the API server and block servers ``config`` names), ``LocalStores``
(``Client.local(dir)``, the embedded default: SQLite + a local block directory, no servers) or
``GivenStores`` (``Client.from_stores``).  Every resource, tier and task is opened when
the client is entered (``_start``: :class:`~blobsdk.runtime.resource.AsyncResource` gives the
``async with``) on one exit stack, and closed by it in ``aclose``.

What is elsewhere, and why: how the stores and tiers are built from a config is
blobsdk/assembly.py (it grows with each tier and backend; this module is the API), and the
blocking ``SyncClient`` is blobsdk/sync.py (derived from this class method by method, so
the two cannot drift apart).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Self, TypeVar

import msgspec

from ._arguments import check_bytes_like, check_callable, check_flag, check_iterable, check_number, check_paths, check_str, wrong
from ._numbers import integer, positive
from .assembly import Assembled, ClusterStores, GivenStores, LocalStores, Stores
from .chunks import listing_prefix, validate_path, validate_writable
from .config import ClientConfig, L1Config, L2Config, ReadConfig, WriteConfig
from .errors import BadRequest, BlobNotFound, ClientClosed, Forbidden
from .metadata import MetadataStore
from .ops import (
    PARALLEL_OBJECTS,
    GcReport,
    IndexProgress,
    IndexReport,
    ScrubProgress,
    ScrubReport,
    collect_garbage,
    index_s3,
    s3_source,
    scrub,
)
from .read import READAHEAD_BYTES, READAHEAD_DEPTH, Prefetch, check_offset, check_range, check_window, read_ahead, writable_bytes
from .runtime import AsyncResource, Executor
from .sources import BlockStore, Buffer
from .stats import LatencyHistogram
from .wire import BlobInfo, ReadPlan
from .write import REWRITE_AT, Checkpoints, Progress

T = TypeVar("T")
IF_VERSION = integer(0, optional=True)  # put and delete: None, 0 (create only) or the version to replace
Item = tuple[str, Buffer]


class Client(AsyncResource):
    """The async blobsdk client.  Use as ``async with Client(config) as c:``.

    ``config`` sets everything but where the stores are, which ``stores`` says (default:
    the servers ``config`` names); :meth:`local` and :meth:`from_stores` are the other two.
    """

    def __init__(self, config: ClientConfig, *, stores: Stores | None = None) -> None:
        if not isinstance(config, ClientConfig):
            raise wrong("Client: config", "a ClientConfig (ClientConfig.from_toml(path) reads a client.toml)", config)
        if stores is not None and not isinstance(stores, Stores):
            raise wrong("Client: stores", "None or a Stores (ClusterStores, LocalStores, GivenStores)", stores)
        self.config = config
        self._stores = stores if stores is not None else ClusterStores(config)
        self._stack: AsyncExitStack | None = None
        self._state: Assembled | None = None

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
        if not isinstance(metadata, MetadataStore):
            raise wrong("from_stores: metadata", "a MetadataStore", metadata)
        if not isinstance(blocks, BlockStore):
            raise wrong("from_stores: blocks", "a BlockStore", blocks)
        return cls(ClientConfig(write=write, read=read, l1=l1, l2=l2), stores=GivenStores(metadata, blocks))

    async def __aenter__(self) -> Self:
        if self._stack is not None:  # refused before AsyncResource's entry: a failed one would close it
            raise ClientClosed("client is already open")
        return await super().__aenter__()

    async def _start(self) -> None:
        self._stack = stack = AsyncExitStack()  # closed by aclose if the start fails (AsyncResource)
        executor = stack.enter_context(Executor(max_workers=4, thread_name_prefix="blobsdk"))
        backends = await self._stores.open(stack)
        self._state = await Assembled.start(stack, backends, executor, self.config)

    async def aclose(self) -> None:
        stack, self._stack, self._state = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    def copy(self) -> Client:
        """A new, unopened client of the same config and stores (a forked child's)."""
        return Client(self.config, stores=self._stores)

    @property
    def _open(self) -> Assembled:
        if self._state is None:
            raise ClientClosed("client is not open: use `async with client:`")
        return self._state

    # --- public API ------------------------------------------------------------------

    async def put(self, path: str, data: Buffer, *, if_version: int | None = None) -> BlobInfo:
        """Write ``data`` as a new version of ``path``; returns once durable and committed.
        ``if_version``: None unconditional, 0 create-only, N only if the live version is N."""
        check_bytes_like("put: data", data)
        check_number("if_version", if_version, IF_VERSION, BadRequest)  # not at the commit, after the data is written
        plan = await self._open.writer.put(path, data, if_version)
        return plan.info()

    async def put_many(self, items: Iterable[Item] | AsyncIterable[Item], *, progress: Progress | None = None) -> list[BlobInfo]:
        """Write many (usually small) blobs packed into shared blocks.  Each blob is atomic;
        blobs are committed in batches, so a failure part-way leaves earlier ones written.
        ``progress(blobs_done, bytes_done)`` is called after each batch commits."""
        check_iterable("put_many: items", items, "an iterable of (path, data) pairs", asynchronous=True)
        check_callable("put_many: progress", progress)
        plans = await self._open.writer.put_many(items, progress)
        return [p.info() for p in plans]

    async def get(self, path: str, offset: int = 0, length: int | None = None) -> bytearray:
        """The bytes of ``path`` (or of ``[offset, offset+length)``, clamped to the blob)."""
        state = self._open
        plan = state.plans.peek(path)
        if plan is None:
            check_range(offset, length)  # before the lookup; a cached plan's read checks it (read_now)
            plan = await state.plans.get_plan(validate_path(path))
        hit = state.readpath.read_now(plan, offset, length)
        if hit is not None:
            return hit
        return await self._read(plan, offset, length)

    async def get_into(self, path: str, buffer: object, offset: int = 0) -> int:
        """Read ``path`` from blob offset ``offset`` into ``buffer``, memory the caller owns, as
        ``readinto`` does: ``min(len(buffer), size - offset)`` bytes (in bytes, whatever its
        item type; 0 at or past the end) written at its start, the rest of it untouched;
        returns how many.  ``buffer``: a bytearray, writable memoryview, numpy array or CPU
        torch tensor (pinned too), C-contiguous (blobsdk/read/into.py).  No buffer of the
        client's is handed over and none is copied again: without L1, whole uncompressed
        chunks of a lone-replica L4 are read into ``buffer`` and verified there, others pass
        through one pooled buffer; with L1, the chunks fetched are kept there as ``get`` keeps
        them, and copied into ``buffer`` (blobsdk/read/readpath.py, ``read_ranges_into``).
        Once it returns or raises, cancelled too, nothing writes into ``buffer``."""
        out = writable_bytes(buffer, "get_into")
        check_offset(offset)
        state = self._open
        plan = state.plans.peek(path) or await state.plans.get_plan(validate_path(path))
        (count,) = await self._fresh_grants(plan, lambda p: self._open.readpath.read_ranges_into([(p, offset, out)]))
        return count

    async def get_many_into(self, paths: Sequence[str], buffer: object | Callable[[int], object]) -> list[int]:
        """The whole blobs of ``paths``, back to back from the start of ``buffer``, all read at
        once (the chunks of small blobs packed in one block in one request); returns each
        one's size (where each begins is their running sum).  ``buffer``: as for
        :meth:`get_into`, or a function that, given the total size, returns one (a batch
        tensor allocated once the sizes are known; called on the event loop's thread, again
        if expired grants make the read start over).  A buffer smaller than the total is a
        BadRequest and a missing path a BlobNotFound, both before any read."""
        if isinstance(paths, str):
            raise TypeError("get_many_into: paths must be a sequence of paths, not a str (use get_into for one)")
        check_iterable("get_many_into: paths", paths, "a sequence of paths")
        return await self._read_many([validate_path(path) for path in paths], buffer)

    async def _read_many(self, paths: list[str], buffer: object, *, regrant: bool = True) -> list[int]:
        """get_many_into's read; once more with fresh plans if a cached one's chunk grants expired."""
        state = self._open
        plans = [_found(path, plan) for path, plan in zip(paths, await state.plans.get_plans(paths), strict=True)]
        reads = _laid_out(plans, buffer)
        try:
            return await state.readpath.read_ranges_into(reads)
        except Forbidden:
            if not regrant or not any(plan.grants_expire for plan in plans):
                raise
        for path in paths:
            state.plans.invalidate(path)
        return await self._read_many(paths, buffer, regrant=False)

    async def _read(self, plan: ReadPlan, offset: int = 0, length: int | None = None) -> bytearray:
        return await self._fresh_grants(plan, lambda p: self._open.readpath.read(p, offset, length))

    async def _read_into(self, plan: ReadPlan, out: memoryview | Sequence[memoryview], fill_memory: bool) -> None:
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
        return await read(_regranted(plan, await self._open.plans.get_plan(plan.path)))

    def prefetch(
        self,
        paths_or_prefixes: str | Iterable[str],
        *,
        tier: str = "l3",
        pin_seconds: float | None = None,
        max_bytes: int | None = None,
    ) -> Prefetch:
        """Start warming ``tier`` ("l1", "l2" or "l3") with these blobs (a string ending in
        "/" is a prefix) and return its handle at once; see blobsdk/read/prefetch.py.  A tier
        this client does not have is a ValueError naming the ones it has."""
        check_paths("prefetch: paths_or_prefixes", paths_or_prefixes)
        return self._open.prefetcher.start(paths_or_prefixes, tier, pin_seconds=pin_seconds, max_bytes=max_bytes)

    def readahead(
        self, paths: Iterable[str], *, depth: int = READAHEAD_DEPTH, max_bytes: int = READAHEAD_BYTES
    ) -> AsyncGenerator[tuple[str, bytearray], None]:
        """``(path, data)`` for each path, in order, with up to ``depth`` reads (and at most
        ``max_bytes`` of blobs) in flight ahead of the consumer; see blobsdk/read/readahead.py.
        Leave it early with ``aclose()`` (or ``contextlib.aclosing``): that cancels the
        reads in flight at once, where an abandoned generator waits for the collector."""
        check_iterable("readahead: paths", paths, "an iterable of paths")
        check_window(depth, max_bytes)
        return read_ahead(self._open.plans, self._read, paths, depth=depth, max_bytes=max_bytes)

    def checkpoints(
        self,
        prefix: str,
        *,
        keep: int = 3,
        chunk_size: int | None = None,
        trust_version_counters: bool = False,
        dedup: bool = True,
        mirror: bool = False,
        rewrite_at: float = REWRITE_AT,
    ) -> Checkpoints:
        """The delta checkpoints under ``prefix`` (a path prefix: ``/bucket/ckpt/job1``),
        keeping the last ``keep``, cut into ``chunk_size`` chunks (default: the write
        config's); see blobsdk/write/checkpoint.py, which says when ``trust_version_counters``
        is sound, what ``dedup`` (name chunks any checkpoint of the bucket stored) and
        ``mirror`` (keep a copy of the last save, so a changed chunk writes only a patch of its
        changed bytes, until its patches would add up to ``rewrite_at`` of it) do.
        A save still running when the client closes is waited for."""
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
            trust_version_counters=trust_version_counters,
            dedup=dedup,
            mirror=mirror,
            rewrite_at=rewrite_at,
            known=state.known_chunks,
        )

    async def plan(self, path: str) -> ReadPlan:
        """The read plan of ``path``'s live version (through the plan cache)."""
        return await self._open.plans.get_plan(validate_path(path))

    async def stat(self, path: str) -> BlobInfo:
        plan = await self._open.metadata.get_plan(validate_path(path))
        return plan.info()

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncGenerator[BlobInfo, None]:
        """Every blob whose path starts with ``prefix``, sorted by path; a bare bucket
        (``/a``) lists that bucket only, as ``/a/`` does (blobsdk/chunks/names.py)."""
        async for info in self._open.metadata.list(listing_prefix(prefix), start_after):
            yield info

    async def delete(self, path: str, *, if_version: int | None = None) -> BlobInfo:
        """Remove the live version; its blocks are reclaimed by :meth:`gc`."""
        check_number("if_version", if_version, IF_VERSION, BadRequest)
        return await self._open.metadata.delete(validate_writable(path), if_version)

    async def index_s3(
        self, url: str, dest: str, *, progress: Callable[[IndexProgress], None] | None = None, parallel: int = PARALLEL_OBJECTS
    ) -> IndexReport:
        """Make the objects under ``url`` (``s3://bucket[/dir]``) blobs under ``dest``, in
        place: their chunks are byte ranges of the objects, checksummed once now, and a read
        of an object changed since raises SourceChanged; indexing again is incremental.  This
        client's L4 must be S3 (``source_url``), and reach ``url``'s bucket with the same
        endpoint and credentials.  ``parallel``: objects read at once.  See blobsdk/ops/index.py."""
        check_str("index_s3: url", url)
        check_str("index_s3: dest", dest)
        check_callable("index_s3: progress", progress)
        check_number("index_s3: parallel", parallel, integer(1))
        state = self._open
        store = s3_source(state.blocks)
        return await index_s3(store, state.writer, state.metadata, url, dest, progress=progress, parallel=parallel)

    async def gc(self, grace: float = 3600.0, *, dry_run: bool = False) -> GcReport:
        """Delete L4 blocks no committed blob references and older than ``grace`` seconds
        (see blobsdk/ops/gc.py).  It lists and deletes: no data GET of it waits for a slot
        a read could use."""
        check_number("gc: grace", grace, positive(), BadRequest, unit=" (seconds)")
        check_flag("gc: dry_run", dry_run)
        state = self._open
        return await collect_garbage(state.metadata, state.blocks, grace, self.config.write.max_write_seconds, dry_run=dry_run)

    async def scrub(self, *, dry_run: bool = False, progress: ScrubProgress | None = None) -> ScrubReport:
        """Verify every replica's copy of every live L4 block; repair bad and missing copies
        from a verified one (not if ``dry_run``).  See blobsdk/ops/repair.py."""
        check_flag("scrub: dry_run", dry_run)
        check_callable("scrub: progress", progress)
        state = self._open
        return await scrub(state.metadata, state.blocks, dry_run=dry_run, progress=progress)

    async def node_stats(self) -> dict[str, dict[str, object]]:
        """What the shared cache nodes report about themselves (``{"l3": {url: stats}}``)."""
        l3 = self._open.l3
        return {} if l3 is None else {l3.name: await l3.node_stats()}

    async def set_l3_urls(self, l3_urls: Sequence[str]) -> None:
        """Make ``l3_urls`` this client's L3 nodes from now on (nodes added to or removed from
        a running job), checked as ``ClientConfig.l3_urls`` is (TypeError, or BadRequest for a
        bad URL), and not empty.  Reads in flight finish on the nodes they began with or fall
        through to L4; new reads place chunks over the new list, which moves only the chunks
        whose first nodes change (~1/N of them per node added or removed: rendezvous hashing,
        blobsdk/chunks/names.py).  ``self.config`` takes the new list, so a copy (a forked
        worker's client) starts with it.  Each client of a job is told on its own: the nodes
        hold no list of members, and clients that disagree for a while cost misses, never
        bytes (every copy is verified).  BadRequest if this client was opened without L3."""
        try:
            config = msgspec.structs.replace(self.config, l3_urls=l3_urls)
        except TypeError as exc:
            raise TypeError(f"set_l3_urls: {exc}") from None
        except ValueError as exc:
            raise BadRequest(f"set_l3_urls: {exc}") from None
        if not config.l3_urls:
            raise BadRequest("set_l3_urls: l3_urls must name at least one node (a client without L3 is opened without them)")
        l3 = self._open.l3
        if l3 is None:
            raise BadRequest("set_l3_urls: this client has no L3 tier (it was opened without l3_urls)")
        self.config = config
        await l3.set_urls(config.l3_urls)

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


def _found(path: str, plan: ReadPlan | None) -> ReadPlan:
    if plan is None:
        raise BlobNotFound(f"no blob at {path!r}")
    return plan


def _laid_out(plans: list[ReadPlan], buffer: object) -> list[tuple[ReadPlan, int, memoryview]]:
    """get_many_into's reads: each plan whole, into its window of ``buffer`` (or of the buffer
    it makes, given the total), back to back."""
    total = sum(plan.size for plan in plans)
    if callable(buffer):
        buffer = buffer(total)
    out = writable_bytes(buffer, "get_many_into")
    if out.nbytes < total:
        raise BadRequest(f"get_many_into: a buffer of {out.nbytes} bytes for {len(plans)} blobs of {total} bytes")
    reads, at = [], 0
    for plan in plans:
        reads.append((plan, 0, out[at : at + plan.size]))
        at += plan.size
    return reads


def _regranted(plan: ReadPlan, fresh: ReadPlan) -> ReadPlan:
    """``plan``'s chunks with ``fresh``'s grants, so a read of some of a blob's chunks (a
    checkpoint's selected leaves) keeps its shape; ``fresh`` itself if the blob changed
    meanwhile or a chunk is not in it (the read then reads what the path holds now)."""
    if fresh.version != plan.version:
        return fresh
    grants = {(c.block_id, c.offset, c.length): c.grant for c in fresh.chunks}
    try:
        chunks = tuple(msgspec.structs.replace(c, grant=grants[c.block_id, c.offset, c.length]) for c in plan.chunks)
    except KeyError:
        return fresh
    return msgspec.structs.replace(plan, chunks=chunks, grants_expire=fresh.grants_expire)
