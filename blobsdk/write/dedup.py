"""The content-addressed chunk index of delta checkpoints (blobsdk/write/checkpoint.py): a chunk
whose bytes some checkpoint of the same bucket already stored is named, not written again,
whatever its prefix, step or job.

The index is metadata.  Its entry for a chunk is the blob
``/{bucket}/.blobsdk/chunks/<xxh3-128 of the chunk, hex>`` whose plan names the one ref that
holds the chunk's bytes (a patched chunk, whose refs are a base and its patches, is never
recorded).  So:

- every metadata backend keeps it (SQLite, the API server, Redis, Redis Cluster), and a lookup
  is one ``get_plans`` per 1000 digests;
- it is scoped by bucket: a tenant's token reaches only its own buckets, so a save never
  names another tenant's bytes through it (DESIGN §7);
- ``/{bucket}/.blobsdk/`` is reserved (blobsdk/chunks/names.py): a user's put or delete there is
  refused by every store, and entries are written only by commits of kind ``"index"``, which
  the store takes only in an entry's shape (blobsdk/metadata/base.py);
- an entry is a live plan: gc never collects a block an entry names.  gc sweeps the index
  first (blobsdk/ops/gc.py): an entry whose blocks no other live plan names is deleted
  (compare-and-swap on the version it saw), then its blocks go the way of any unnamed block.
  A save that looked an entry up just before the sweep names the block in its own commit:
  either that commit lands before gc's fence (the block is spared) or it is refused with
  BlockCollected, never committed over a deleted block;
- entries are recorded *after* the checkpoint that wrote the chunks commits (a crash between
  the two loses dedup, not data; a crash before it leaves only orphan blocks), last writer
  wins (two jobs storing the same chunk both name valid bytes).

An entry is never trusted: any writer of the bucket can make an index commit, and no store
can tell whether the ref it names holds the chunk its path names.  So a lookup reuses an
entry only if its one ref is the chunk being saved: the same raw length, the ref's checksum
(xxh3-64 of the raw bytes, which every read verifies) equal to the xxh3-64 of the chunk's
bytes, hashed now, and then the ref's bytes, read, equal to the chunk's.  The read is what
catches a ref whose checksum was forged to the chunk's: its bytes fail their checksum (or
differ), where without the read the save would name bytes no restore can return.  A ref this
client wrote for the chunk, or read and found to be it, is remembered (:class:`KnownChunks`,
one per client, bounded), so a save of a path per step (DCP) reads none of the chunks its
process stored the step before; a new process reads each entry it reuses once.  Any other
entry is ignored (the chunk is written, and its entry recorded anew), counted in
``refused`` and logged once per lookup; the save goes on.  A
restore checks each chunk against the xxh3-128 its manifest holds too
(blobsdk/write/restore.py), so a checkpoint an older build saved over a bad entry is
CorruptData, never wrong bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Protocol

import xxhash

from ..chunks import INDEX_DIR, bucket_of
from ..errors import BlobError, BlockCollected
from ..metadata import PlanReader, PlanWriter
from ..wire import MAX_OPS_PER_REQUEST, MAX_PATHS_PER_REQUEST, ChunkRef, CommitOp, ReadPlan
from .writer import plan_of

__all__ = ["INDEX_DIR", "ChunkIndex", "KnownChunks"]

_log = logging.getLogger(__name__)
_HASH_BATCH = 16 << 20  # bytes hashed per executor job
_READS = 8  # entries' refs read at once to confirm them

Refs = tuple[ChunkRef, ...]


class KnownChunks:
    """Refs known to hold the chunk of a digest (xxh3-128): written by this client, or read by
    it and compared; at most ``limit``, the oldest forgotten first.  Blocks are never
    rewritten, so a ref once known stays its chunk (or is collected: BlockCollected at commit)."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self._refs: dict[bytes, ChunkRef] = {}
        self._limit = limit

    def holds(self, digest: bytes, ref: ChunkRef) -> bool:
        return self._refs.get(digest) == ref.unsigned()

    def add(self, digest: bytes, ref: ChunkRef) -> None:
        self._refs.pop(digest, None)
        self._refs[digest] = ref.unsigned()
        if len(self._refs) > self._limit:
            del self._refs[next(iter(self._refs))]


class IndexEntries(PlanReader, PlanWriter, Protocol):
    """What a chunk index asks of the metadata store: its entries, looked up and committed."""


class ChunkIndex:
    """The chunk index of one bucket (the bucket of ``prefix``); hashes on ``executor``."""

    def __init__(
        self,
        metadata: IndexEntries,
        prefix: str,
        executor: Executor,
        read: Callable[[ReadPlan], Awaitable[bytearray]],
        known: KnownChunks,
    ) -> None:
        self._metadata = metadata
        self._executor = executor
        self._read = read  # a verified read of a plan (the client's, grants renewed)
        self._known = known
        self.bucket = bucket_of(prefix)
        self.refused = 0  # entries found for a chunk whose ref is not that chunk: ignored

    def path(self, digest: bytes) -> str:
        return f"/{self.bucket}/{INDEX_DIR}/{digest.hex()}"

    async def lookup(self, wanted: Mapping[bytes, memoryview]) -> dict[bytes, Refs]:
        """The refs, grants cleared, of each chunk of ``wanted`` (its xxh3-128 digest → its
        bytes) whose index entry is that chunk (see the module docstring)."""
        digests = list(wanted)
        candidates: dict[bytes, ReadPlan] = {}  # entries of one ref of the chunk's length
        refused: list[bytes] = []
        for start in range(0, len(digests), MAX_PATHS_PER_REQUEST):
            batch = digests[start : start + MAX_PATHS_PER_REQUEST]
            plans = await self._metadata.get_plans([self.path(d) for d in batch])
            for digest, plan in zip(batch, plans, strict=True):
                if plan is None:
                    continue
                if len(plan.chunks) == 1 and plan.chunks[0].raw_length == len(wanted[digest]):
                    candidates[digest] = plan
                else:
                    refused.append(digest)
        checksums = await self._checksums([wanted[d] for d in candidates])
        claimed: dict[bytes, ReadPlan] = {}
        for (digest, plan), checksum in zip(candidates.items(), checksums, strict=True):
            if plan.chunks[0].checksum == checksum:
                claimed[digest] = plan
            else:
                refused.append(digest)
        unknown = {d: plan for d, plan in claimed.items() if not self._known.holds(d, plan.chunks[0])}
        for digest, holds in await self._confirm(unknown, wanted):
            if holds:
                self._known.add(digest, claimed[digest].chunks[0])
            else:
                refused.append(digest)
                del claimed[digest]
        found: dict[bytes, Refs] = {digest: (plan.chunks[0].unsigned(),) for digest, plan in claimed.items()}
        self._refused(refused)
        return found

    async def _confirm(self, claimed: dict[bytes, ReadPlan], wanted: Mapping[bytes, memoryview]) -> list[tuple[bytes, bool]]:
        """Whether each claimed entry's ref holds the chunk's bytes: read (verified against the
        ref's checksum), then compared, ``_READS`` at a time.  A read that fails for any reason
        of the store's (a checksum that does not match, a block collected, a store down) is
        not the chunk: it is written anew, never a failed save."""
        gate = asyncio.Semaphore(_READS)

        async def holds(digest: bytes) -> tuple[bytes, bool]:
            async with gate:
                try:
                    data = await self._read(claimed[digest])
                except BlobError:
                    return digest, False
                return digest, data == wanted[digest]

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(holds(d)) for d in claimed]
        return [task.result() for task in tasks]

    async def _checksums(self, pieces: list[memoryview]) -> list[int]:
        """xxh3-64 of each piece (what a ref's checksum is), on the executor, ~16 MiB a job."""
        loop = asyncio.get_running_loop()
        batches, batch, size = [], list[memoryview](), 0
        for piece in pieces:
            batch.append(piece)
            size += len(piece)
            if size >= _HASH_BATCH:
                batches.append(batch)
                batch, size = [], 0
        if batch:
            batches.append(batch)
        jobs = [loop.run_in_executor(self._executor, _xxh3_64, b) for b in batches]
        return [checksum for done in await asyncio.gather(*jobs) for checksum in done]

    def _refused(self, digests: list[bytes]) -> None:
        if not digests:
            return
        self.refused += len(digests)
        _log.warning(
            "chunk index of bucket %r: %d entr%s ignored, their ref is not the chunk their name says (first: %s);"
            " those chunks are written anew",
            self.bucket,
            len(digests),
            "y" if len(digests) == 1 else "ies",
            self.path(digests[0]),
        )

    def remember(self, digest: bytes, ref: ChunkRef) -> None:
        """``ref`` holds the chunk of ``digest``: this client just wrote it there."""
        self._known.add(digest, ref)

    async def record(self, chunks: Iterable[tuple[bytes, Sequence[ChunkRef]]]) -> int:
        """Record ``chunks`` (digest, its one ref), overwriting; how many were recorded.  Best
        effort: a batch gc refused (one of its blocks was collected meanwhile) is skipped."""
        ops = [
            CommitOp(path=self.path(digest), plan=plan_of(self.path(digest), refs), kind="index")
            for digest, refs in dict(chunks).items()
        ]
        recorded = 0
        for start in range(0, len(ops), MAX_OPS_PER_REQUEST):
            batch = ops[start : start + MAX_OPS_PER_REQUEST]
            try:
                await self._metadata.commit_many(batch)
            except BlockCollected:
                continue
            recorded += len(batch)
        return recorded


def _xxh3_64(pieces: list[memoryview]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(piece) for piece in pieces]
