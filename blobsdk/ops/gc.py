"""Garbage collection of L4 blocks that no committed blob references.

Safety does not rest on clocks.  A pass:

1. lists the blocks, keeping as candidates those minted more than ``grace`` seconds ago by
   the ids' clock (a heuristic: it spares the blocks of writes still in flight, so they are
   not refused; with skewed clocks it may pick young blocks, which step 3 makes safe);
2. scans every live plan and sweeps the checkpoints' chunk index (blobsdk/write/dedup.py): an
   index entry whose blocks no other live plan names is deleted (compare-and-swap on the
   version scanned; one that changed meanwhile is kept, its blocks with it); candidates no
   plan left names are *doomed*.  Only an entry (``/{bucket}/.blobsdk/chunks/<32 hex>``,
   one chunk) is swept: a user's blob can no longer be written under ``.blobsdk/``
   (blobsdk/chunks/names.py), and anything else found there (a *stray*, written before the
   namespace was reserved) is kept with its blocks, like any live blob: counted in
   ``reserved_strays`` and logged, never deleted by gc (an admin removes one with the
   metadata store's ``delete(path, kind="index")``);
3. **fences** the doomed blocks in the metadata store (:meth:`MetadataStore.fence_blocks`):
   from then on any commit naming one is refused with BlockCollected, atomically with the
   commit, whatever the writer's clock says;
4. scans every live plan again: a doomed block named by a commit that landed before its fence
   is spared (its fence lifted); no commit after the fence can name it, so what is left is
   referenced by no plan now or ever after;
5. deletes those blocks.  A fence stays ``FENCE_KEEP_S`` (7 days, by the metadata store's
   clock) after it is set, so a writer stalled that long cannot name a deleted block either;
   past that the writer's own age check (``max_write_seconds``, writer.py) refuses it.

So a skewed clock can cost a writer its commit (BlockCollected; ``put`` writes anew once),
never an acknowledged write.  ``grace > max_write_seconds`` is still required: with agreeing
clocks no write in flight is ever refused.

Every step is bounded: each listing page, scan page, fence call and block delete gets
``step_timeout`` seconds (a stopped block server costs one step, not the pass).  A delete that
fails or times out leaves its block fenced for the next pass (``blocks_failed``).  The report
says how long the pass took and its longest single wait (``longest_pause_s``).  gc never holds
a lock: the client's other work goes on while it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

import msgspec

from ..chunks import is_index_entry, is_reserved
from ..errors import BadRequest, BlobError, BlobNotFound, PreconditionFailed
from ..metadata import MAX_FENCE_IDS, BlockFences, PlanLister, PlanWriter
from ..sources import BlockStore, block_time
from ..wire import ReadPlan

T = TypeVar("T")

_log = logging.getLogger(__name__)

FENCE_KEEP_S = 7 * 86400.0  # how long a fence outlives its pass (the metadata store's clock)
STEP_TIMEOUT_S = 30.0  # one listing page, scan page, fence call or delete
_DELETE_PARALLEL = 16


class GcMetadata(PlanLister, PlanWriter, BlockFences, Protocol):
    """What a gc pass asks of the metadata store: its scan, deletes of index entries, fences."""


class GcReport(msgspec.Struct, frozen=True, kw_only=True):
    blocks_scanned: int
    blocks_referenced: int
    blocks_deleted: int
    bytes_freed: int
    dry_run: bool = False
    blocks_spared: int = 0  # doomed at the first scan, named by a commit before their fence
    blocks_failed: int = 0  # deletes that failed or timed out (fenced, retried next pass)
    index_entries_deleted: int = 0  # chunk index entries naming blocks nothing else names
    reserved_strays: int = 0  # blobs under /{bucket}/.blobsdk/ that are no index entry: kept
    seconds: float = 0.0
    longest_pause_s: float = 0.0  # the longest single wait of the pass


class _Steps:
    """Bounds each awaited step of a pass and records the longest."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.longest = 0.0

    async def run(self, what: str, step: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await step
        except TimeoutError:
            raise BlobError(f"gc: {what} took over {self.timeout:g}s; nothing more was deleted") from None
        finally:
            self.longest = max(self.longest, time.monotonic() - started)

    async def each(self, what: str, items: AsyncIterator[T]) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.run(what, anext(items))
            except StopAsyncIteration:
                return


async def collect_garbage(
    metadata: GcMetadata,
    blocks: BlockStore,
    grace: float,
    max_write_seconds: float,
    *,
    dry_run: bool = False,
    step_timeout: float = STEP_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
) -> GcReport:
    """Delete unreferenced blocks older than ``grace`` seconds; see the module docstring."""
    if not grace > max_write_seconds:  # `not >`: nan compares false both ways
        raise BadRequest(f"grace ({grace}s) must exceed max_write_seconds ({max_write_seconds}s) so in-flight writes stay safe")
    started, steps = time.monotonic(), _Steps(step_timeout)
    if not dry_run:
        await steps.run("pruning old fences", metadata.prune_fences(FENCE_KEEP_S))
    scanned, candidates = await _candidates(blocks, clock() - grace, steps)
    referenced, index, strays = await _referenced_and_index(metadata, steps)
    swept = await _sweep(metadata, index, referenced, steps, dry_run=dry_run)
    doomed = {b: size for b, size in candidates.items() if b not in referenced}
    spared, failed = 0, set[str]()
    if not dry_run:
        spared = await _fence(metadata, doomed, steps)
        failed = await _delete_all(blocks, list(doomed), steps)
    return GcReport(
        blocks_scanned=scanned,
        blocks_referenced=len(referenced),
        blocks_deleted=len(doomed) - len(failed),
        bytes_freed=sum(size for b, size in doomed.items() if b not in failed),
        dry_run=dry_run,
        blocks_spared=spared,
        blocks_failed=len(failed),
        index_entries_deleted=swept,
        reserved_strays=strays,
        seconds=time.monotonic() - started,
        longest_pause_s=steps.longest,
    )


async def _candidates(blocks: BlockStore, cutoff: float, steps: _Steps) -> tuple[int, dict[str, int]]:
    scanned, candidates = 0, {}
    async for block in steps.each("listing blocks", aiter(blocks.list_blocks())):
        scanned += 1
        if block_time(block.block_id) < cutoff:
            candidates[block.block_id] = block.size
    return scanned, candidates


async def _referenced_and_index(metadata: PlanLister, steps: _Steps) -> tuple[set[str], list[ReadPlan], int]:
    """The blocks every live plan but the chunk index's entries names, those entries, and how
    many strays (see the module docstring) the scan met."""
    referenced: set[str] = set()
    index: list[ReadPlan] = []
    strays: list[str] = []
    async for plan in steps.each("scanning plans", aiter(metadata.iter_plans())):
        if is_index_entry(plan.path) and len(plan.chunks) == 1:
            index.append(plan)
            continue
        if is_reserved(plan.path):
            strays.append(plan.path)
        referenced.update(plan.block_ids())
    if strays:
        _log.warning("gc: %d blob(s) under /{bucket}/.blobsdk/ are no index entry (first: %s): kept", len(strays), strays[0])
    return referenced, index, len(strays)


async def _sweep(metadata: PlanWriter, index: list[ReadPlan], referenced: set[str], steps: _Steps, *, dry_run: bool) -> int:
    """Delete the index entries that name a block no other plan names; how many.  The blocks
    of an entry kept (all named elsewhere, or changed since the scan) join ``referenced``."""
    deleted = 0
    for entry in index:
        if entry.block_ids() <= referenced:
            continue
        if dry_run:
            deleted += 1
            continue
        try:
            deleting = metadata.delete(entry.path, if_version=entry.version, kind="index")
            await steps.run(f"deleting index entry {entry.path}", deleting)
        except BlobNotFound:
            pass  # another pass took it
        except PreconditionFailed:
            referenced.update(entry.block_ids())  # recorded anew since the scan: keep what it names
            continue
        deleted += 1
    return deleted


async def _referenced(metadata: PlanLister, steps: _Steps) -> set[str]:
    referenced: set[str] = set()
    async for plan in steps.each("scanning plans", aiter(metadata.iter_plans())):
        referenced.update(plan.block_ids())
    return referenced


async def _fence(metadata: GcMetadata, doomed: dict[str, int], steps: _Steps) -> int:
    """Fence ``doomed``, scan again and lift the fences of blocks a commit named meanwhile
    (removed from ``doomed``); how many were spared so."""
    ids = list(doomed)
    for i in range(0, len(ids), MAX_FENCE_IDS):
        await steps.run("fencing blocks", metadata.fence_blocks(ids[i : i + MAX_FENCE_IDS]))
    if not ids:
        return 0
    referenced = await _referenced(metadata, steps)
    spared = [b for b in doomed if b in referenced]
    for i in range(0, len(spared), MAX_FENCE_IDS):
        await steps.run("lifting fences", metadata.unfence_blocks(spared[i : i + MAX_FENCE_IDS]))
    for block_id in spared:
        del doomed[block_id]
    return len(spared)


async def _delete_all(blocks: BlockStore, block_ids: list[str], steps: _Steps) -> set[str]:
    """Delete ``block_ids``, ``_DELETE_PARALLEL`` at a time; those that failed (left fenced)."""
    slots = asyncio.Semaphore(_DELETE_PARALLEL)

    async def delete(block_id: str) -> bool:
        async with slots:
            try:
                await steps.run(f"deleting block {block_id}", blocks.delete_block(block_id))
            except BlobError:
                return False
            return True

    done = await asyncio.gather(*(delete(b) for b in block_ids))
    return {b for b, ok in zip(block_ids, done, strict=True) if not ok}
