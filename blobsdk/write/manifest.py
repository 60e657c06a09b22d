"""What a delta checkpoint stores about itself (blobsdk/write/checkpoint.py): its manifest of
entries, one per leaf of the saved state, and a part, one process's uncommitted share."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import msgspec

from ..errors import CorruptData
from ..wire import ChunkRef

Kind = Literal["ndarray", "tensor", "bytes", "json"]


class Entry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One leaf of a saved state."""

    name: tuple[str, ...]  # its keys, from the root
    kind: Kind
    dtype: str = ""  # numpy's dtype.str, or the torch dtype's name
    shape: tuple[int, ...] = ()
    value: bytes = b""  # a json leaf's JSON text
    nbytes: int = 0
    new_bytes: int = 0  # of them, written by this save (the rest named from earlier ones)
    first: int = 0  # index of its first ref in the data plan
    digests: tuple[bytes, ...] = ()  # xxh3-128 of each chunk
    extents: tuple[int, ...] = ()  # how many refs hold each chunk (empty: one each)
    # of them, how many are patches (blobsdk/write/patch.py), last (empty: none): the others
    # hold the chunk's base, back to back
    patches: tuple[int, ...] = ()

    def ref_count(self) -> int:
        """How many refs of the data plan hold this entry's bytes."""
        return sum(self.extents) if self.extents else len(self.digests)

    def chunk_refs(self) -> list[range]:
        """The data plan's refs of each chunk, as index ranges."""
        counts = self.extents or (1,) * len(self.digests)
        ranges, at = [], self.first
        for count in counts:
            ranges.append(range(at, at + count))
            at += count
        return ranges

    def patch_counts(self) -> tuple[int, ...]:
        """How many of each chunk's refs are patches."""
        return self.patches or (0,) * len(self.digests)


@dataclass(frozen=True, slots=True)
class Holding:
    """The refs that hold one chunk in a data plan: its base's, back to back, then its
    ``patches`` patches, oldest first (blobsdk/write/patch.py)."""

    refs: tuple[ChunkRef, ...]
    patches: int = 0

    def patch_bytes(self) -> int:
        """The bytes of its patch records: what a restore reads beyond the base."""
        return sum(ref.raw_length for ref in self.refs[len(self.refs) - self.patches :]) if self.patches else 0


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    created: float
    chunk_size: int
    entries: tuple[Entry, ...]
    new_bytes: int  # written by this save
    reused_bytes: int  # named from earlier checkpoints


class Part(msgspec.Struct, frozen=True, kw_only=True):
    """One process's share of a checkpoint, written durably but not committed (see
    :meth:`Checkpoints.write_part`): its entries (each ``first`` counts from this part's
    first chunk), their chunks, the blocks it wrote, and the version of ``latest`` its chunks
    were compared with (0: none)."""

    entries: tuple[Entry, ...]
    chunks: tuple[ChunkRef, ...]
    new_blocks: tuple[str, ...]
    base_version: int
    chunk_size: int


def check_manifest(manifest: Manifest, step: int, where: str) -> Manifest:
    """``manifest`` as read for checkpoint ``step`` (``where`` names it), if its fields make
    sense on their own, else CorruptData naming the first that does not: the manifest is a blob
    any writer of the bucket can replace, and nothing it says may become an index error, an
    allocation of what no chunk holds, or a leaf set over another.  Its fit with its data plan
    (each entry's refs, their bytes) and its digests are checked by the restore."""
    if manifest.step != step:
        raise CorruptData(f"{where}: its manifest is of step {manifest.step}")
    if manifest.chunk_size < 1:
        raise CorruptData(f"{where}: its manifest's chunk size is {manifest.chunk_size}")
    for entry in manifest.entries:
        if not entry.name:
            raise CorruptData(f"{where}: its manifest has a leaf with no name")
        leaf = f"{where} leaf {'/'.join(entry.name)!r}"
        if entry.nbytes < 0 or entry.first < 0:
            raise CorruptData(f"{leaf}: its manifest says nbytes {entry.nbytes}, first {entry.first}")
        chunks = -(-entry.nbytes // manifest.chunk_size)
        if len(entry.digests) != chunks:
            raise CorruptData(f"{leaf}: its manifest lists {len(entry.digests)} digests for {chunks} chunks")
        extents_ok = not entry.extents or (len(entry.extents) == chunks and min(entry.extents) >= 1)
        patches_ok = not entry.patches or (len(entry.patches) == chunks and min(entry.patches) >= 0)
        if not (extents_ok and patches_ok):
            raise CorruptData(
                f"{leaf}: its manifest's extents {entry.extents} or patches {entry.patches} are not one count per chunk"
            )
    names = sorted(entry.name for entry in manifest.entries)
    for outer, inner in itertools.pairwise(names):  # a name's extensions sort right after it
        if inner == outer:
            raise CorruptData(f"{where}: its manifest names leaf {'/'.join(outer)!r} twice")
        if inner[: len(outer)] == outer:
            raise CorruptData(f"{where}: its manifest names leaf {'/'.join(outer)!r} and a leaf inside it, {'/'.join(inner)!r}")
    return manifest
