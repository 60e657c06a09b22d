"""Repair of L4 replicas: rewrite a bad or missing block copy from a verified one.

**What "verified" means for a block.**  Checksums cover chunks, not blocks, and one block
holds chunks of many blobs.  So a block copy is *verified* when every chunk of it that a
live plan references decodes and matches its checksum.  The live chunks of some blocks
come from the metadata store's block -> plans index (``iter_naming``: the cost of the
references found); those of every block, from one walk of the live plans (scrub)
(:func:`live_chunks`).  Bytes that no live plan references belong to deleted blobs: no read
can ever reach them (plans are immutable and a commit only names freshly written blocks), so
a rewritten copy is the verified copy's bytes up to the end of its last live chunk, and may
be shorter than the original.

**The repair of one block** (:func:`check_block`): read the whole live extent of the block
from every replica and verify it; a replica that lacks the block is *missing*, one whose
copy fails any live chunk (or is too short) is *bad*, one that cannot answer is
*unreachable* (left alone).  Only with a verified copy in hand is anything written: a
missing copy is written from it; a bad copy is deleted, then written (a block server keeps
an existing block of the same size, so a same-size rewrite needs the delete).  Each
rewritten copy is read back and verified.  A block with no verified copy is never
rewritten from anything: it is reported unrepairable.  Repair is idempotent: a healthy copy
is never touched, and two repairers racing on one block write the same verified bytes
(meanwhile a reader of that replica sees BlockNotFound and fails over).  A repair cancelled
between delete and write leaves the copy missing, which is no worse than bad: reads fail
over and the next repair or scrub writes it.

**Background repair** (:class:`Repairer`, owned by the L4 tier): a read that had to skip a
bad or missing copy and then got a verified one reports the block.  Reports go to a small
queue (``queue`` blocks; a report of a block already queued or being repaired is the same
repair; one past a full queue is dropped and counted); one task drains it a batch at a time
(one reverse-index lookup per batch) and repairs up to ``concurrency`` blocks at once.  Counted:
``repairs_queued``, ``repairs_dropped``, ``repairs_done`` (copies rewritten and verified),
``repairs_failed`` (blocks left with a bad or missing copy), ``repairs_unneeded`` (healthy
by the time it was checked, or no longer live).

**Under-replicated writes** (:meth:`Repairer.repair_under_replicated`): a write acknowledged
by its quorum while some replica failed records its block in the store's
:class:`~blobsdk.sources.UnderReplicated` list, without waiting for a read.  A
second task of the repairer works through that list whenever it grows: one reverse-index
lookup for the whole list, then each block checked and repaired as above.  A block whole again
leaves the list; one that is not (its replica still down) stays, and the next pass comes
``retry_seconds`` later (doubling while passes mend nothing, up to ``retry_max_seconds``).
A block no live plan references stays while a write may still commit it (minted less than
``write_horizon`` ago: the writer's ``max_write_seconds``), then leaves.  Counted:
``under_replicated`` (in the list now), ``under_replicated_recorded``, ``_dropped``.  The
list lives in this process: if it dies first, ``blobsdk scrub`` finds those blocks.

**Scrub** (:func:`scrub`, ``blobsdk scrub``): every live block, every replica, verified and
(unless ``dry_run``) repaired as above.

A replica that served bad bytes is also ranked after the others for a while (the L4 tier's
:class:`~blobsdk.tail.health.TargetHealth`, reason ``BAD_BYTES``), so one corrupt replica
costs one dropped copy, not one per read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Protocol

import msgspec

from ..chunks import decode_chunk
from ..config import RepairConfig
from ..errors import BadCopy, BlobError, BlockNotFound, CorruptData
from ..metadata import MAX_FENCE_IDS, BlockIndex, PlanLister
from ..runtime import AsyncResource, task_group
from ..sources import BlockReplica, BlockStore, UnderReplicated, block_time
from ..wire import ChunkRef, ReadPlan

ScrubProgress = Callable[[int, int, int], None]  # (blocks done, blocks in all, bytes verified)


# --- one block -------------------------------------------------------------------------


class Copy(Enum):
    GOOD = "good"
    BAD = "bad"
    MISSING = "missing"
    UNREACHABLE = "unreachable"


@dataclass
class BlockOutcome:
    """What :func:`check_block` found on each replica (names) and what it rewrote."""

    block_id: str
    found: dict[str, Copy] = field(default_factory=dict)
    repaired: list[str] = field(default_factory=list)
    nbytes: int = 0  # bytes verified

    def named(self, kind: Copy) -> list[str]:
        return [name for name, copy in self.found.items() if copy is kind]

    @property
    def whole(self) -> bool:
        """Every replica holds a verified copy now."""
        return all(copy is Copy.GOOD or name in self.repaired for name, copy in self.found.items())


class ChunkWalk(PlanLister, BlockIndex, Protocol):
    """What :func:`live_chunks` asks of the metadata: every plan, or those naming some blocks."""


async def live_chunks(metadata: ChunkWalk, only: set[str] | None = None) -> dict[str, list[ChunkRef]]:
    """Every chunk a live plan references, by block (sorted by id), each block's chunks
    sorted by offset and without duplicates; only the blocks in ``only`` if given, found
    through the store's reverse index (not a walk of every plan)."""
    return await all_chunks(metadata) if only is None else await named_chunks(metadata, only)


async def all_chunks(metadata: PlanLister) -> dict[str, list[ChunkRef]]:
    """:func:`live_chunks` of every block: a walk of every plan (scrub's)."""
    return await _chunks_in([metadata.iter_plans()], None)


async def named_chunks(metadata: BlockIndex, only: set[str]) -> dict[str, list[ChunkRef]]:
    """:func:`live_chunks` of the blocks in ``only``, through the reverse index."""
    ids = sorted(only)
    return await _chunks_in([metadata.iter_naming(ids[i : i + MAX_FENCE_IDS]) for i in range(0, len(ids), MAX_FENCE_IDS)], only)


async def _chunks_in(walks: list[AsyncIterator[ReadPlan]], only: set[str] | None) -> dict[str, list[ChunkRef]]:
    index: dict[str, dict[str, ChunkRef]] = {}
    for plans in walks:
        async for plan in plans:
            for ref in plan.chunks:
                if only is None or ref.block_id in only:
                    index.setdefault(ref.block_id, {})[ref.key] = ref
    return {b: sorted(refs.values(), key=lambda r: r.offset) for b, refs in sorted(index.items())}


async def check_block(
    block_id: str, chunks: Sequence[ChunkRef], replicas: Sequence[BlockReplica], *, repair: bool
) -> BlockOutcome:
    """Verify every replica's copy of ``block_id`` against its live ``chunks`` and, if
    ``repair``, rewrite the bad and missing ones from a verified copy (module docstring)."""
    outcome = BlockOutcome(block_id)
    verified: bytes | None = None
    for replica in replicas:
        copy, data = await read_verified(replica, block_id, chunks)
        outcome.found[replica.name] = copy
        if data is not None:
            outcome.nbytes += len(data)
            verified = verified if verified is not None else data
    if repair and verified is not None:
        for replica in replicas:
            if outcome.found[replica.name] in (Copy.BAD, Copy.MISSING):
                await _rewrite(replica, block_id, chunks, verified, outcome)
    return outcome


async def read_verified(replica: BlockReplica, block_id: str, chunks: Sequence[ChunkRef]) -> tuple[Copy, bytes | None]:
    """One replica's copy of the block's live extent and whether it verifies."""
    extent = max(ref.offset + ref.length for ref in chunks)
    try:
        data = await replica.read_range(block_id, 0, extent)
    except BlockNotFound:
        return Copy.MISSING, None
    except CorruptData:  # shorter than its live chunks need
        return Copy.BAD, None
    except BlobError:
        return Copy.UNREACHABLE, None
    good = await asyncio.to_thread(_verifies, data, chunks)  # checksums of up to a block: off the loop
    return (Copy.GOOD, data) if good else (Copy.BAD, None)


def _verifies(data: bytes, chunks: Sequence[ChunkRef]) -> bool:
    view = memoryview(data)
    try:
        for ref in chunks:
            decode_chunk(ref, view[ref.offset : ref.offset + ref.length])
    except BadCopy:
        return False
    return True


async def _rewrite(
    replica: BlockReplica, block_id: str, chunks: Sequence[ChunkRef], verified: bytes, outcome: BlockOutcome
) -> None:
    """Write ``verified`` to ``replica`` (deleting its bad copy first) and read it back."""
    try:
        if outcome.found[replica.name] is Copy.BAD:
            await replica.delete_block(block_id)  # safe: a verified copy of every live chunk is in hand
        await replica.write_block(block_id, [verified])
    except BlobError:
        pass  # e.g. a lagging write landed meanwhile with the full size: the read-back decides
    copy, _ = await read_verified(replica, block_id, chunks)
    if copy is Copy.GOOD:
        outcome.repaired.append(replica.name)


# --- background repair -----------------------------------------------------------------


@dataclass
class RepairStats:
    repairs_queued: int = 0
    repairs_dropped: int = 0
    repairs_done: int = 0
    repairs_failed: int = 0
    repairs_unneeded: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Repairer(AsyncResource):
    """Background repair of the blocks reads report, and of the ``under_replicated`` ones
    writes record (module docstring).  ``async with`` starts its tasks; leaving cancels and
    awaits them.  ``clock`` is the writer's clock of block ids (time.time)."""

    def __init__(
        self,
        metadata: BlockIndex,
        replicas: Sequence[BlockReplica],
        config: RepairConfig | None = None,
        *,
        under_replicated: UnderReplicated | None = None,
        write_horizon: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config if config is not None else RepairConfig()
        self.stats = RepairStats()
        self.under_replicated = under_replicated
        self._write_horizon = write_horizon
        self._clock = clock
        self._metadata = metadata
        self._replicas = tuple(replicas)
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._pending: set[str] = set()  # queued or being repaired
        self._task: asyncio.Task[None] | None = None
        self._ledger_task: asyncio.Task[None] | None = None

    def report(self, block_id: str) -> None:
        """A read met a bad or missing copy of ``block_id``: repair it soon."""
        if block_id in self._pending:
            return
        if len(self._pending) >= self.config.queue:
            self.stats.repairs_dropped += 1
            return
        self._pending.add(block_id)
        self._queue.put_nowait(block_id)
        self.stats.repairs_queued += 1

    def figures(self) -> dict[str, int]:
        """Its counters, and the under-replicated list's (the L4 entry of Client.stats())."""
        out = self.stats.as_dict()
        if (ledger := self.under_replicated) is not None:
            out["under_replicated"] = len(ledger)
            out["under_replicated_recorded"] = ledger.recorded
            out["under_replicated_dropped"] = ledger.dropped
        return out

    @property
    def idle(self) -> bool:
        """Nothing queued or being repaired."""
        return not self._pending

    async def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="blobsdk-l4-repair")
        if self._ledger_task is None and self.under_replicated is not None:
            self._ledger_task = asyncio.create_task(self._run_ledger(self.under_replicated), name="blobsdk-l4-rereplicate")

    async def aclose(self) -> None:
        """Cancel the repair tasks and wait for them; idempotent."""
        tasks = [t for t in (self._task, self._ledger_task) if t is not None]
        self._task = self._ledger_task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def repair_under_replicated(self) -> int:
        """One pass over the under-replicated blocks (module docstring): how many copies it
        rewrote.  Raises the metadata's BlobError if its plans cannot be walked."""
        ledger = self.under_replicated
        blocks = ledger.blocks() if ledger is not None else []
        if ledger is None or not blocks:
            return 0
        index = await named_chunks(self._metadata, set(blocks))
        todo, rewritten = iter(blocks), [0]

        async def worker() -> None:
            for block_id in todo:  # shared by the workers: each next() is atomic on the loop
                copies = await self._rereplicate(ledger, block_id, index.get(block_id))
                rewritten[0] += copies  # added after the await: `x += await ...` would lose a worker's count

        async with task_group() as tasks:
            for _ in range(min(self.config.concurrency, len(blocks))):
                tasks.create_task(worker())
        return rewritten[0]

    async def _rereplicate(self, ledger: UnderReplicated, block_id: str, chunks: list[ChunkRef] | None) -> int:
        if not chunks:
            if block_time(block_id) < self._clock() - self._write_horizon:
                ledger.discard(block_id)  # no write can commit it any more: garbage for gc
                self.stats.repairs_unneeded += 1
            return 0  # else its put may not have committed yet
        try:
            outcome = await check_block(block_id, chunks, self._replicas, repair=True)
        except BlobError:
            self.stats.repairs_failed += 1
            return 0
        self.stats.repairs_done += len(outcome.repaired)
        if outcome.whole:
            ledger.discard(block_id)
        else:
            self.stats.repairs_failed += 1
        return len(outcome.repaired)

    async def _run_ledger(self, ledger: UnderReplicated) -> None:
        """While the list is not empty: wait ``retry_seconds`` (doubling while passes mend
        nothing), then a pass; once it is empty, wait for it to grow."""
        delay = self.config.retry_seconds
        while True:
            if not ledger:
                await ledger.wait_for_more()
                delay = self.config.retry_seconds
            await asyncio.sleep(delay)  # the replica may come back, the put commit, meanwhile
            try:
                mended = await self.repair_under_replicated()
            except BlobError:  # the metadata cannot be walked now: try again later
                mended = 0
            delay = self.config.retry_seconds if mended else min(2 * delay, self.config.retry_max_seconds)

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.config.batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._repair_batch(batch)
            finally:
                self._pending.difference_update(batch)

    async def _repair_batch(self, batch: list[str]) -> None:
        try:
            index = await named_chunks(self._metadata, set(batch))
        except BlobError:  # the metadata cannot be walked now: a later read reports again
            self.stats.repairs_failed += len(batch)
            return
        slots = asyncio.Semaphore(self.config.concurrency)
        await asyncio.gather(*(self._repair_one(b, index.get(b), slots) for b in batch))

    async def _repair_one(self, block_id: str, chunks: list[ChunkRef] | None, slots: asyncio.Semaphore) -> None:
        if not chunks:
            self.stats.repairs_unneeded += 1  # no live plan references it any more
            return
        async with slots:
            try:
                outcome = await check_block(block_id, chunks, self._replicas, repair=True)
            except BlobError:
                self.stats.repairs_failed += 1
                return
        self.stats.repairs_done += len(outcome.repaired)
        if not outcome.whole:
            self.stats.repairs_failed += 1
        elif not outcome.repaired:
            self.stats.repairs_unneeded += 1


# --- scrub -----------------------------------------------------------------------------


class ScrubReport(msgspec.Struct, kw_only=True):
    """What a scrub found: copies are (block, replica) pairs.  ``unrepaired`` lists (up to
    100 of) the blocks still lacking a verified copy on some replica."""

    dry_run: bool
    blocks_checked: int = 0
    copies_checked: int = 0
    copies_bad: int = 0
    copies_missing: int = 0
    copies_unreachable: int = 0
    copies_repaired: int = 0
    blocks_unrepaired: int = 0
    bytes_verified: int = 0
    unrepaired: list[str] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every copy is healthy or was repaired."""
        return self.blocks_unrepaired == 0

    def add(self, outcome: BlockOutcome) -> None:
        self.blocks_checked += 1
        self.copies_checked += len(outcome.found)
        self.copies_bad += len(outcome.named(Copy.BAD))
        self.copies_missing += len(outcome.named(Copy.MISSING))
        self.copies_unreachable += len(outcome.named(Copy.UNREACHABLE))
        self.copies_repaired += len(outcome.repaired)
        self.bytes_verified += outcome.nbytes
        if not outcome.whole:
            self.blocks_unrepaired += 1
            if len(self.unrepaired) < 100:
                self.unrepaired.append(outcome.block_id)


async def scrub(
    metadata: PlanLister,
    blocks: BlockStore,
    *,
    dry_run: bool = False,
    concurrency: int = 2,
    progress: ScrubProgress | None = None,
) -> ScrubReport:
    """Verify every replica's copy of every live block and repair what is bad or missing
    (nothing is written if ``dry_run``); ``progress(done, total, bytes)`` after each block."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    index = await all_chunks(metadata)
    report = ScrubReport(dry_run=dry_run)
    todo = iter(index.items())

    async def worker() -> None:
        for block_id, chunks in todo:  # shared by the workers: each next() is atomic on the loop
            report.add(await check_block(block_id, chunks, blocks.replicas, repair=not dry_run))
            if progress is not None:
                progress(report.blocks_checked, len(index), report.bytes_verified)

    async with task_group() as tasks:
        for _ in range(min(concurrency, max(1, len(index)))):
            tasks.create_task(worker())
    return report
