"""Indexing S3 objects in place (issue 13): ``blobsdk import s3://BUCKET/PREFIX DEST --in-place``
and :meth:`blobsdk.Client.index_s3` make blobs whose chunks are byte ranges of existing
objects, with no copy.

**What a blob indexed in place is.**  Object ``PREFIX/<name>`` becomes blob ``DEST<name>``
(DEST ends in "/"), whose plan names one *link block* (blobsdk/sources/s3.py: a tiny object
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
read; a changed object is read again and its blob replaced; a blob whose object is gone is
removed, if it links to an object of this bucket and prefix (checked by reading its link).
Blobs under DEST that were not indexed in place are never touched.  The link blocks of
replaced or removed blobs are left to gc, which deletes links and never an object.

Keys that are not valid blob paths (blobsdk/paths.py) are skipped and reported; "directory"
markers (empty objects named like a directory of other keys) are skipped silently.  A key
with an empty or a ".." segment makes the listing fail (BadRequest): obstore refuses to
list one, so index a prefix without it.  An empty object becomes an empty blob,
which has no chunk, so nothing links it to its object: it stays when the object is deleted.
An object that cannot be read (it changed during the pass, has no ETag, ...) is reported as
failed; the others are still indexed.  Plans are committed in batches of up to ``MAX_BATCH``
and at least every ``COMMIT_EVERY_S`` (or a quarter of ``max_write_seconds``), so an
interrupted pass keeps what it committed and the next one goes on from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import xxhash

from ._tasks import task_group
from .config import s3_location
from .errors import BlobError, CorruptData, InvalidPath, PreconditionFailed
from .metadata.base import MetadataStore
from .paths import validate_path, validate_prefix
from .sources.base import is_link, links_to
from .wire import ChunkRef, CommitOp, ReadPlan, etag_of
from .writer import MAX_BATCH

if TYPE_CHECKING:  # the s3 extra (obstore) is needed only to index
    from .sources.s3 import S3BlockStore, S3Object

COMMIT_EVERY_S = 2.0  # the longest an indexed object waits for its commit
PARALLEL_OBJECTS = 4  # objects read and hashed at once

Progress = Callable[["IndexProgress"], None]


class IndexReport(msgspec.Struct, kw_only=True):
    """What one pass did.  ``failed``: (object URL, why) of objects it could not index."""

    objects: int = 0  # listed under the prefix (directory markers aside)
    indexed: int = 0  # new or changed: read, hashed and committed
    unchanged: int = 0  # their blob already links to this version: not read
    removed: int = 0  # blobs whose object is gone
    skipped: list[str] = msgspec.field(default_factory=list)  # keys that are not valid blob paths
    failed: list[tuple[str, str]] = msgspec.field(default_factory=list)
    bytes_indexed: int = 0


@dataclass
class IndexProgress:
    """Where a pass stands: objects and bytes done of those it has to read."""

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


@dataclass
class _Committer:
    """Plans waiting for their commit, committed in batches of up to MAX_BATCH, and by
    :meth:`run` at least every ``every_s`` (so a link is committed long before gc may take
    it: ``check_age`` refuses a commit whose link blocks are too old for that)."""

    metadata: MetadataStore
    check_age: Callable[[Iterable[str]], None]
    every_s: float
    pending: list[ReadPlan] = field(default_factory=list)

    async def add(self, plan: ReadPlan) -> None:
        self.pending.append(plan)
        if len(self.pending) >= MAX_BATCH:
            await self.flush()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.flush()

    async def flush(self) -> None:
        batch, self.pending = self.pending, []
        if batch:
            self.check_age(b for plan in batch for b in plan.block_ids())
            await self.metadata.commit_many([CommitOp(path=plan.path, plan=plan) for plan in batch])


async def index_s3(
    store: S3BlockStore,
    metadata: MetadataStore,
    url: str,
    dest: str,
    *,
    chunk_size: int,
    check_age: Callable[[Iterable[str]], None],
    commit_every_s: float = COMMIT_EVERY_S,
    progress: Progress | None = None,
    parallel: int = PARALLEL_OBJECTS,
) -> IndexReport:
    """Index every object under ``url`` (``s3://bucket[/prefix]``) into blobs under ``dest``;
    see the module docstring.  ``check_age`` refuses a commit whose link blocks are older
    than the write path allows (gc's safety rule, blobsdk/gc.py); ``commit_every_s`` must be
    well under that age."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    bucket, prefix = s3_location(url)
    source = _Source(bucket, prefix, _dest_prefix(dest))
    report, state = IndexReport(), IndexProgress()
    listed = await _listing(store, source, report)
    todo = await _changed(metadata, listed, report)
    state.objects_total, state.bytes_total = len(todo), sum(obj.size for _, obj in todo)
    if progress is not None:
        progress(state)
    committer = _Committer(metadata, check_age, commit_every_s)
    queue = iter(todo)

    async def worker() -> None:
        for path, obj in queue:  # shared by the workers: each next() is atomic on the loop
            try:
                await committer.add(await _index_one(store, path, obj, chunk_size))
            except BlobError as exc:
                report.failed.append((obj.url, str(exc)))
            else:
                report.indexed += 1
                report.bytes_indexed += obj.size
            state.objects_done += 1
            state.bytes_done += obj.size
            if progress is not None:
                progress(state)

    async with task_group() as tasks:
        ticks = tasks.create_task(committer.run())
        await asyncio.gather(*(worker() for _ in range(min(parallel, max(1, len(todo))))))
        ticks.cancel()
    await committer.flush()
    report.removed = await _remove_gone(store, metadata, source, listed)
    return report


def _dest_prefix(dest: str) -> str:
    """``dest`` as a blob path prefix ending in "/" (a valid path once a name is added)."""
    prefix = validate_prefix(dest if dest.endswith("/") else dest + "/")
    validate_path(prefix + "x")
    return prefix


async def _listing(store: S3BlockStore, source: _Source, report: IndexReport) -> dict[str, S3Object]:
    """Blob path -> the object listed for it, for every object under the source."""
    objects = [obj async for obj in store.objects(source.bucket, source.prefix)]
    directories = {key.rsplit("/", 1)[0] for key in (obj.key for obj in objects) if "/" in key}
    listed: dict[str, S3Object] = {}
    for obj in objects:
        if obj.size == 0 and obj.key in directories:
            continue  # a "directory" marker ("dir/", listed as "dir" beside "dir/...")
        report.objects += 1
        try:
            listed[validate_path(source.path_of(obj.key))] = obj
        except InvalidPath as exc:
            report.skipped.append(f"{obj.url}: {exc}")
    return listed


async def _changed(metadata: MetadataStore, listed: dict[str, S3Object], report: IndexReport) -> list[tuple[str, S3Object]]:
    """The listed objects whose blob does not already link to the version listed."""
    todo: list[tuple[str, S3Object]] = []
    paths = list(listed)
    for start in range(0, len(paths), MAX_BATCH):
        batch = paths[start : start + MAX_BATCH]
        for path, plan in zip(batch, await metadata.get_plans(batch), strict=True):
            obj = listed[path]
            if plan is not None and _links_to(plan, obj):
                report.unchanged += 1
            else:
                todo.append((path, obj))
    return todo


def _links_to(plan: ReadPlan, obj: S3Object) -> bool:
    """Whether ``plan`` is the blob indexed from this version of ``obj``."""
    if plan.size != obj.size:
        return False
    return all(links_to(c.block_id, obj.identity) for c in plan.chunks)  # an empty blob: empty object


async def _index_one(store: S3BlockStore, path: str, obj: S3Object, chunk_size: int) -> ReadPlan:
    """Read ``obj`` once, hashing it chunk by chunk; link it; its plan (to commit)."""
    if not obj.etag:
        raise CorruptData(f"{obj.url} has no ETag, so a change to it could not be detected: not indexed")
    checksums = [c async for c in _chunk_checksums(store.read_object(obj, chunk_size), chunk_size)]
    size = sum(n for n, _ in checksums)
    if size != obj.size:
        raise CorruptData(f"{obj.url}: read {size} bytes, listed with {obj.size} under the same ETag")
    block_id = await store.link(obj) if checksums else ""
    refs = tuple(
        ChunkRef(block_id=block_id, offset=i * chunk_size, length=n, raw_length=n, checksum=checksum)
        for i, (n, checksum) in enumerate(checksums)
    )
    return ReadPlan(path=path, version=0, etag=etag_of(refs, size), size=size, chunk_size=chunk_size, chunks=refs)


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


async def _remove_gone(store: S3BlockStore, metadata: MetadataStore, source: _Source, listed: dict[str, S3Object]) -> int:
    """Remove the blobs under the destination that link to an object of the source that is
    no longer listed; how many."""
    gone = [info.path async for info in metadata.list(source.dest) if info.path not in listed and info.chunks]
    removed = 0
    for start in range(0, len(gone), MAX_BATCH):
        batch = gone[start : start + MAX_BATCH]
        for plan in await metadata.get_plans(batch):
            if plan is not None and await _indexed_from(store, plan, source):
                try:
                    await metadata.delete(plan.path, plan.version)
                except PreconditionFailed:
                    continue  # written again meanwhile: no longer ours to remove
                removed += 1
    return removed


async def _indexed_from(store: S3BlockStore, plan: ReadPlan, source: _Source) -> bool:
    """Whether ``plan`` was indexed in place from an object of ``source`` at its own path."""
    ids: Sequence[str] = sorted(plan.block_ids())
    if len(ids) != 1 or not is_link(ids[0]):
        return False
    try:
        obj = await store.linked(ids[0])
    except BlobError:
        return False  # its link is gone or unreadable: not provably ours
    return source.holds(obj) and source.path_of(obj.key) == plan.path
