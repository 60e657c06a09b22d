"""Garbage collection of L4 blocks that no committed blob references.

Safety rule: a block is a candidate only if it was minted more than ``grace`` seconds ago,
and the writer refuses to commit a plan naming a block older than ``max_write_seconds``
(writer.py).  So with ``grace > max_write_seconds`` no block that a write in flight may
still commit is ever deleted.  Candidates are listed *before* plans are scanned: a commit
that lands during the scan can only name young blocks, which are not candidates.
(Block age comes from the id, minted with the writer's clock: clocks of writers and the
collector must agree to well within ``grace - max_write_seconds``.)
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from .errors import BadRequest
from .metadata.base import MetadataStore
from .sources.base import BlockStore, block_time

_DELETE_PARALLEL = 16


class GcReport(msgspec.Struct, frozen=True, kw_only=True):
    blocks_scanned: int
    blocks_referenced: int
    blocks_deleted: int
    bytes_freed: int
    dry_run: bool = False


async def collect(
    metadata: MetadataStore, blocks: BlockStore, grace: float, max_write_seconds: float, *, dry_run: bool = False
) -> GcReport:
    """Delete unreferenced blocks older than ``grace`` seconds; see the module docstring."""
    if not grace > max_write_seconds:  # `not >`: nan compares false both ways
        raise BadRequest(f"grace ({grace}s) must exceed max_write_seconds ({max_write_seconds}s) so in-flight writes stay safe")
    cutoff = time.time() - grace
    scanned, candidates = 0, {}
    async for block in blocks.list_blocks():
        scanned += 1
        if block_time(block.block_id) < cutoff:
            candidates[block.block_id] = block.size
    referenced = await _referenced(metadata)
    doomed = {b: size for b, size in candidates.items() if b not in referenced}
    if not dry_run:
        await _delete_all(blocks, list(doomed))
    return GcReport(
        blocks_scanned=scanned,
        blocks_referenced=len(referenced),
        blocks_deleted=len(doomed),
        bytes_freed=sum(doomed.values()),
        dry_run=dry_run,
    )


async def _referenced(metadata: MetadataStore) -> set[str]:
    referenced: set[str] = set()
    async for plan in metadata.iter_plans():
        referenced.update(plan.block_ids())
    return referenced


async def _delete_all(blocks: BlockStore, block_ids: list[str]) -> None:
    slots = asyncio.Semaphore(_DELETE_PARALLEL)

    async def delete(block_id: str) -> None:
        async with slots:
            await blocks.delete_block(block_id)

    await asyncio.gather(*(delete(b) for b in block_ids))
