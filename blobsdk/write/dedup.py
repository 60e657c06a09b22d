"""The content-addressed chunk index of delta checkpoints (blobsdk/write/checkpoint.py): a chunk
whose bytes some checkpoint of the same bucket already stored is named, not written again,
whatever its prefix, step or job.

The index is ordinary metadata.  Its entry for a chunk is the blob
``/{bucket}/.blobsdk/chunks/<xxh3-128 of the chunk, hex>`` whose plan lists the refs that
hold the chunk's bytes back to back (one whole chunk; a patched chunk, whose refs are a base
and its patches, is never recorded).  So:

- every metadata backend keeps it (SQLite, the API server, Redis, Redis Cluster) with no
  new protocol, and a lookup is one ``get_plans`` per 1000 digests;
- it is scoped by bucket: a tenant's token reaches only its own buckets, so a save never
  names another tenant's bytes through it (DESIGN §7);
- an entry is a live plan: gc never collects a block an entry names.  gc sweeps the index
  first (blobsdk/ops/gc.py): an entry whose blocks no other live plan names is deleted
  (compare-and-swap on the version it saw), then its blocks go the way of any unnamed block.
  A save that looked an entry up just before the sweep names the block in its own commit:
  either that commit lands before gc's fence (the block is spared) or it is refused with
  BlockCollected, never committed over a deleted block;
- entries are recorded *after* the checkpoint that wrote the chunks commits (a crash between
  the two loses dedup, not data; a crash before it leaves only orphan blocks), last writer
  wins (two jobs storing the same chunk both name valid bytes).

Entries are trusted as the bucket's other blobs are: a writer of the bucket can point an
entry at other bytes, as it can overwrite any checkpoint in it.  A lookup still checks that
an entry's refs hold exactly the chunk's length.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..errors import BlockCollected
from ..metadata.base import MetadataStore
from ..paths import bucket_of
from ..wire import MAX_OPS_PER_REQUEST, MAX_PATHS_PER_REQUEST, ChunkRef, CommitOp
from .writer import plan_of

INDEX_DIR = ".blobsdk/chunks"

Refs = tuple[ChunkRef, ...]


def is_index_path(path: str) -> bool:
    """Whether ``path`` is an entry of some bucket's chunk index."""
    parts = path.split("/", 3)
    return len(parts) == 4 and f"{parts[2]}/{parts[3]}".startswith(INDEX_DIR + "/")


class ChunkIndex:
    """The chunk index of one bucket (the bucket of ``prefix``)."""

    def __init__(self, metadata: MetadataStore, prefix: str) -> None:
        self._metadata = metadata
        self.bucket = bucket_of(prefix)

    def path(self, digest: bytes) -> str:
        return f"/{self.bucket}/{INDEX_DIR}/{digest.hex()}"

    async def lookup(self, wanted: Mapping[bytes, int]) -> dict[bytes, Refs]:
        """The refs of each digest of ``wanted`` (digest → the chunk's length) the index holds,
        grants cleared; an entry whose refs do not hold exactly that length is ignored."""
        digests = list(wanted)
        found: dict[bytes, Refs] = {}
        for start in range(0, len(digests), MAX_PATHS_PER_REQUEST):
            batch = digests[start : start + MAX_PATHS_PER_REQUEST]
            plans = await self._metadata.get_plans([self.path(d) for d in batch])
            for digest, plan in zip(batch, plans, strict=True):
                if plan is not None and plan.size == wanted[digest] and sum(r.raw_length for r in plan.chunks) == plan.size:
                    found[digest] = tuple(ref.unsigned() for ref in plan.chunks)
        return found

    async def record(self, chunks: Iterable[tuple[bytes, Sequence[ChunkRef]]]) -> int:
        """Record ``chunks`` (digest, its refs), overwriting; how many were recorded.  Best
        effort: a batch gc refused (one of its blocks was collected meanwhile) is skipped."""
        ops = [CommitOp(path=self.path(digest), plan=plan_of(self.path(digest), refs)) for digest, refs in dict(chunks).items()]
        recorded = 0
        for start in range(0, len(ops), MAX_OPS_PER_REQUEST):
            batch = ops[start : start + MAX_OPS_PER_REQUEST]
            try:
                await self._metadata.commit_many(batch)
            except BlockCollected:
                continue
            recorded += len(batch)
        return recorded
