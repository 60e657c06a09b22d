"""Indexing S3 objects in place: ``blobsdk import s3://BUCKET/PREFIX DEST --in-place``
and :meth:`blobsdk.Client.index_s3` make blobs whose chunks are byte ranges of existing
objects, with no copy.

**What a blob indexed in place is.**  Object ``PREFIX/<name>`` becomes blob ``DEST<name>``
(DEST ends in "/"), whose plan names one *link block* (blobsdk/sources/_s3.py: a tiny object
in the client's own S3 source holding bucket, key and ETag) at the object's own offsets,
uncompressed, each chunk with the xxh3-64 of its bytes.  Those checksums are computed here,
once, from one streamed GET of each object (If-Match the ETag listed), so readers verify
every chunk as they do for any blob and every tier above L4 caches it as usual.

**Changes are detected.**  Every read of a link block sends If-Match the indexed ETag, so a
changed or deleted object makes a read of its blob raise :class:`~blobsdk.errors.SourceChanged`,
naming the object, until it is indexed again.  (Chunks already cached in a tier above L4 are
verified copies of the version that was indexed and serve it until evicted: the change is
seen where L4 is read.)

**Indexing again is incremental.**  A link block's id carries a digest of bucket, key and
ETag, so an object whose blob already links to its listed version is skipped without being
read (if its link block is still in the store: a lost one is made again); a changed object
is read again and its blob replaced (a commit conditional on the
version seen, so a blob written meanwhile is kept); the blob of an object that is gone is
removed if it links to an object of this bucket and prefix (read from its link) and that
object is not there now (checked again: an overlapping pass may have indexed one made since
this pass listed).  A blob under DEST that was not indexed in place (it names a block that
is not a link) is never replaced or removed: its object is reported failed.  (An empty blob
names no block at all, so nothing tells an empty object's from an empty ``put``: an empty
blob at an object's path is replaced.)  gc deletes the links of replaced or removed blobs,
never an object.  The indexed location may not overlap the client's own L4 prefix.

**Keys.**  Keys that are not valid blob paths (blobsdk/chunks/names.py), or whose path would lie
under ``/{bucket}/.blobsdk/`` (blobsdk's own; a batch naming one would fail whole), are
skipped and reported.
"Directory" markers are skipped: empty objects whose key is a directory of other keys, or the
prefix itself (obstore lists ``dir/`` as ``dir``, so an empty folder with nothing in it is
an empty object to it, and becomes an empty blob).  A key with an empty or a ".." segment
makes the listing fail (BadRequest): obstore lists none, so index a prefix without it.  An
empty object's blob has no chunk, so nothing links it to its object: it stays when the
object is deleted.

**Failures.**  An object that cannot be read or committed (it changed during the pass, has
no ETag, its blob was written meanwhile...) is reported failed with why; the others are
still indexed.  Plans are committed in batches of up to ``MAX_BATCH``, and at least every
``COMMIT_EVERY_S`` (a quarter of ``max_write_seconds`` if less, so links are committed long
before gc may take them), so an interrupted pass keeps what it committed and the next one
goes on from there.  ``indexed`` counts committed objects only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import msgspec
import xxhash

from ..chunks import validate_prefix, validate_writable
from ..config import s3_location
from ..errors import BadRequest, BlobError, CorruptData, InvalidPath, PreconditionFailed
from ..metadata import PlanLister, PlanReader, PlanWriter
from ..runtime import task_group
from ..sources import BlockStore, block_time, is_link, links_to
from ..wire import ChunkRef, CommitOp, ReadPlan, etag_of
from ..write import MAX_BATCH, Writer

if TYPE_CHECKING:  # the s3 extra (obstore) is needed only to index
    from ..sources import S3BlockStore, S3Object

COMMIT_EVERY_S = 2.0  # the longest an indexed object waits for its commit
COMMIT_TRIES = 3  # a batch refused because some of its blobs were written meanwhile is tried again without them
PARALLEL_OBJECTS = 4  # objects read and hashed at once

Progress = Callable[["IndexProgress"], None]


class IndexMetadata(PlanReader, PlanWriter, PlanLister, Protocol):
    """What indexing asks of the metadata store: the blobs it made before (listed, looked up),
    commits and deletes."""


class IndexReport(msgspec.Struct, kw_only=True):
    """What one pass did.  ``failed``: (object URL, why) of objects it could not index."""

    objects: int = 0  # listed under the prefix (directory markers aside)
    indexed: int = 0  # new or changed: read, hashed and committed
    unchanged: int = 0  # their blob already links to this version: not read
    removed: int = 0  # blobs whose object is gone
    skipped: list[str] = msgspec.field(default_factory=list)  # keys that are not valid blob paths
    failed: list[tuple[str, str]] = msgspec.field(default_factory=list)
    bytes_indexed: int = 0


@dataclass(frozen=True)
class IndexProgress:
    """Where a pass stands: objects and bytes read of those it has to read."""

    objects_done: int = 0
    objects_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0


@dataclass
class _Source:
    """Where to index from and to: ``s3://bucket/prefix`` into ``dest``."""

    bucket: str
    prefix: str  # "" or a directory, without the trailing "/"
    dest: str  # a blob path prefix ending in "/"

    def path_of(self, key: str) -> str:
        return self.dest + key[len(self.prefix) + 1 :] if self.prefix else self.dest + key

    def holds(self, obj: S3Object) -> bool:
        return obj.bucket == self.bucket and (not self.prefix or obj.key.startswith(self.prefix + "/"))


@dataclass(frozen=True)
class _Todo:
    """An object to index into ``path``, whose blob is at ``if_version`` (0: none)."""

    path: str
    obj: S3Object
    if_version: int


@dataclass(frozen=True)
class _Indexed:
    todo: _Todo
    plan: ReadPlan

    @property
    def op(self) -> CommitOp:
        return CommitOp(path=self.plan.path, plan=self.plan, if_version=self.todo.if_version)


class _Committer:
    """Indexed objects waiting for their commit: committed in batches of up to MAX_BATCH,
    and by :meth:`run` at least every ``every_s`` until :meth:`stop`; one batch at a time.
    Counts every object in the report once committed, or failed with why.  A link that
    waited half of ``max_write_seconds`` (a slow metadata store) is made again before its
    commit, so the writer's age check (gc's safety rule) never refuses hashed work."""

    def __init__(self, store: S3BlockStore, writer: Writer, metadata: IndexMetadata, report: IndexReport) -> None:
        self._store = store
        self._writer = writer
        self._metadata = metadata
        self._report = report
        self._max_age_s = writer.config.max_write_seconds / 2
        self._every_s = min(COMMIT_EVERY_S, writer.config.max_write_seconds / 4)
        self._pending: list[_Indexed] = []
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()

    async def add(self, item: _Indexed) -> None:
        self._pending.append(item)
        if len(self._pending) >= MAX_BATCH:
            await self.flush()

    def stop(self) -> None:
        """Let :meth:`run` commit what is left and return."""
        self._stopped.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._every_s):
                    await self._stopped.wait()
            stopping = self._stopped.is_set()  # before the flush: what is added during it gets one more
            await self.flush()
            if stopping:
                return

    async def flush(self) -> None:
        async with self._lock:
            while self._pending:  # workers may have added more than a batch while the last one committed
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                await self._commit(batch)

    async def _commit(self, batch: list[_Indexed]) -> None:
        """Commit ``batch`` as one transaction; if a blob of it was written meanwhile (the
        transaction is refused whole), fail those items and commit the others."""
        for _ in range(COMMIT_TRIES):
            try:
                batch = [await self._fresh(item) for item in batch]
                self._writer.check_age(b for item in batch for b in item.plan.block_ids())
                await self._metadata.commit_many([item.op for item in batch])
            except PreconditionFailed as exc:
                batch = await self._drop_written(batch, exc)
                if batch:
                    continue
                return
            except BlobError as exc:
                self._failed(batch, f"not committed: {exc}")
                return
            self._report.indexed += len(batch)
            self._report.bytes_indexed += sum(item.todo.obj.size for item in batch)
            return
        self._failed(batch, "not committed: its blobs kept being written meanwhile")

    async def _fresh(self, item: _Indexed) -> _Indexed:
        """``item``, with a new link if its link is older than half of ``max_write_seconds``."""
        old = item.plan.block_ids()
        if not old or time.time() - block_time(next(iter(old))) < self._max_age_s:
            return item
        block_id = await self._store.link(item.todo.obj)
        chunks = tuple(msgspec.structs.replace(c, block_id=block_id) for c in item.plan.chunks)
        return _Indexed(item.todo, msgspec.structs.replace(item.plan, chunks=chunks, etag=etag_of(chunks, item.plan.size)))

    async def _drop_written(self, batch: list[_Indexed], exc: PreconditionFailed) -> list[_Indexed]:
        """The items of ``batch`` whose blob is still at the version seen; the others fail."""
        live = await self._metadata.get_plans([item.todo.path for item in batch])
        kept = []
        for item, plan in zip(batch, live, strict=True):
            if (plan.version if plan is not None else 0) == item.todo.if_version:
                kept.append(item)
            else:
                self._failed([item], f"{item.todo.path} was written while it was indexed: not replaced ({exc})")
        return kept

    def _failed(self, batch: list[_Indexed], why: str) -> None:
        self._report.failed.extend((item.todo.obj.url, why) for item in batch)


async def index_s3(
    store: S3BlockStore,
    writer: Writer,
    metadata: IndexMetadata,
    url: str,
    dest: str,
    *,
    progress: Progress | None = None,
    parallel: int = PARALLEL_OBJECTS,
) -> IndexReport:
    """Index every object under ``url`` (``s3://bucket[/prefix]``) into blobs under ``dest``
    (see the module docstring), committing to ``metadata`` by the rules of ``writer`` (its
    chunk size and ``max_write_seconds``); ``progress`` is called with a snapshot after each object read."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    bucket, prefix = s3_location(url)
    source = _Source(bucket, prefix, _dest_prefix(dest))
    _check_apart(source, store)
    report = IndexReport()
    listed = await _listing(store, source, report)
    links = await store.links()
    todo = await _changed(metadata, listed, links, report)
    done = IndexProgress(objects_total=len(todo), bytes_total=sum(t.obj.size for t in todo))
    if progress is not None:
        progress(done)
    committer = _Committer(store, writer, metadata, report)
    queue = iter(todo)

    async def worker() -> None:
        nonlocal done
        for item in queue:  # shared by the workers: each next() is atomic on the loop
            try:
                plan = await _index_one(store, item, writer.config.chunk_size)
            except BlobError as exc:
                report.failed.append((item.obj.url, str(exc)))
            else:
                await committer.add(_Indexed(item, plan))
            done = replace(done, objects_done=done.objects_done + 1, bytes_done=done.bytes_done + item.obj.size)
            if progress is not None:
                progress(done)

    async with task_group() as tasks:
        tasks.create_task(committer.run())
        async with task_group() as readers:
            for _ in range(min(parallel, max(1, len(todo)))):
                readers.create_task(worker())
        committer.stop()
    report.removed = await _remove_gone(store, metadata, source, listed, report)
    return report


def s3_source(blocks: BlockStore) -> S3BlockStore:
    """``blocks`` if it is an S3 store (the only kind that can index in place), else BadRequest."""
    try:
        from ..sources import S3BlockStore
    except ImportError:
        pass  # no s3 extra installed: this L4 is not S3
    else:
        if isinstance(blocks, S3BlockStore):
            return blocks
    raise BadRequest(f'indexing in place needs an S3 source (source_url = "s3://..." in client.toml); this L4 is {blocks.name}')


def _dest_prefix(dest: str) -> str:
    """``dest`` as a blob path prefix ending in "/" (a valid path once a name is added)."""
    validate_prefix(dest)
    prefix = dest if dest.endswith("/") else dest + "/"
    validate_writable(prefix + "x")
    return prefix


def _check_apart(source: _Source, store: S3BlockStore) -> None:
    """BadRequest if the objects to index could be the store's own blocks and links."""
    if source.bucket != store.bucket:
        return
    ours, theirs = store.prefix, source.prefix
    if not ours or not theirs or ours == theirs or ours.startswith(theirs + "/") or theirs.startswith(ours + "/"):
        raise BadRequest(
            f"s3://{source.bucket}/{theirs} overlaps this client's own L4 (s3://{store.bucket}/{ours}): index objects outside it"
        )


async def _listing(store: S3BlockStore, source: _Source, report: IndexReport) -> dict[str, S3Object]:
    """Blob path -> the object listed for it, for every object under the source."""
    objects = [obj async for obj in store.objects(source.bucket, source.prefix)]
    directories = {obj.key[:i] for obj in objects for i, c in enumerate(obj.key) if c == "/"} | {source.prefix}
    listed: dict[str, S3Object] = {}
    for obj in objects:
        if obj.size == 0 and obj.key in directories:
            continue  # a "directory" marker ("dir/", which obstore lists as "dir")
        report.objects += 1
        try:
            listed[validate_writable(source.path_of(obj.key))] = obj
        except InvalidPath as exc:
            report.skipped.append(f"{obj.url}: {exc}")
    return listed


async def _changed(metadata: PlanReader, listed: dict[str, S3Object], links: set[str], report: IndexReport) -> list[_Todo]:
    """The listed objects whose blob does not already link, by one of ``links`` (those in
    the store), to the version listed, and may be replaced (a blob not indexed in place may
    not: its object is reported failed)."""
    todo: list[_Todo] = []
    paths = list(listed)
    for start in range(0, len(paths), MAX_BATCH):
        batch = paths[start : start + MAX_BATCH]
        for path, plan in zip(batch, await metadata.get_plans(batch), strict=True):
            obj = listed[path]
            if plan is None:
                todo.append(_Todo(path, obj, 0))
            elif not all(is_link(c.block_id) for c in plan.chunks):
                report.failed.append((obj.url, f"{path} holds a blob that was not indexed in place: not replaced"))
            elif plan.size == obj.size and all(links_to(c.block_id, obj.identity) and c.block_id in links for c in plan.chunks):
                report.unchanged += 1  # an empty blob of an empty object too
            else:
                todo.append(_Todo(path, obj, plan.version))
    return todo


async def _index_one(store: S3BlockStore, todo: _Todo, chunk_size: int) -> ReadPlan:
    """Read the object once, hashing it chunk by chunk; link it; its plan (to commit)."""
    obj = todo.obj
    if not obj.etag:
        raise BadRequest(f"{obj.url} has no ETag, so a change to it could not be detected: not indexed")
    checksums = [c async for c in _chunk_checksums(store.read_object(obj, chunk_size), chunk_size)]
    size = sum(n for n, _ in checksums)
    if size != obj.size:
        raise CorruptData(f"{obj.url}: read {size} bytes, listed with {obj.size} under the same ETag")
    block_id = await store.link(obj) if checksums else ""
    refs = tuple(
        ChunkRef(block_id=block_id, offset=i * chunk_size, length=n, raw_length=n, checksum=checksum)
        for i, (n, checksum) in enumerate(checksums)
    )
    return ReadPlan(path=todo.path, version=0, etag=etag_of(refs, size), size=size, chunk_size=chunk_size, chunks=refs)


async def _chunk_checksums(pieces: AsyncIterator[memoryview], chunk_size: int) -> AsyncIterator[tuple[int, int]]:
    """(length, xxh3-64) of each ``chunk_size`` chunk of the bytes ``pieces`` add up to."""
    hasher, filled = xxhash.xxh3_64(), 0
    async for piece in pieces:
        while piece:
            take = piece[: chunk_size - filled]
            hasher.update(take)
            filled += len(take)
            piece = piece[len(take) :]
            if filled == chunk_size:
                yield filled, hasher.intdigest()
                hasher, filled = xxhash.xxh3_64(), 0
    if filled:
        yield filled, hasher.intdigest()


async def _remove_gone(
    store: S3BlockStore, metadata: IndexMetadata, source: _Source, listed: dict[str, S3Object], report: IndexReport
) -> int:
    """Remove the blobs under the destination that were indexed in place from an object of
    the source that was not listed and is not there now (an overlapping pass may have
    indexed one made since the listing); how many.  An object that cannot be checked is
    reported failed."""
    gone = [info.path async for info in metadata.list(source.dest) if info.path not in listed and info.chunks]
    removed = 0
    for start in range(0, len(gone), MAX_BATCH):
        batch = gone[start : start + MAX_BATCH]
        for plan in await metadata.get_plans(batch):
            obj = None if plan is None else await _indexed_from(store, plan, source)
            if plan is None or obj is None:
                continue
            try:
                if await store.exists(obj.bucket, obj.key):
                    continue
                await metadata.delete(plan.path, plan.version)
            except PreconditionFailed:
                continue  # written again meanwhile: no longer ours to remove
            except BlobError as exc:
                report.failed.append((obj.url, f"could not tell whether it is gone, so {plan.path} stays: {exc}"))
                continue
            removed += 1
    return removed


async def _indexed_from(store: S3BlockStore, plan: ReadPlan, source: _Source) -> S3Object | None:
    """The object of ``source`` ``plan`` was indexed in place from, at its own path; else None."""
    ids = plan.block_ids()
    if len(ids) != 1:
        return None
    (block_id,) = ids
    if not is_link(block_id):
        return None
    try:
        obj = await store.linked(block_id)
    except BlobError:
        return None  # its link is gone or unreadable: not provably ours
    return obj if source.holds(obj) and source.path_of(obj.key) == plan.path else None
