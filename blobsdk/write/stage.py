"""What a checkpoint save does before it commits (blobsdk/write/checkpoint.py): hash a state's
chunks, sort each into held (by the base at the same place, or by the bucket's chunk index,
blobsdk/write/dedup.py), a repeat of one earlier in the same save, or new; copy the new ones
into staging buffers (``save``) or take them as views (``write_part``); then write the new
ones and make the part that names them all.

Hashing runs on the client's executor in batches of ~16 MiB (xxh3 releases the GIL, so both
cores hash).  ``stage`` is what training waits for; ``write`` runs in the background.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, field

import msgspec
import xxhash

from ..wire import ChunkRef
from .compare import Base
from .dedup import ChunkIndex
from .leaves import Leaf, Stamp
from .manifest import Entry, Part
from .writer import Writer

_HASH_BATCH = 16 << 20  # bytes hashed per executor job


class Stager:
    """Stages and writes the saves of one Checkpoints object; keeps its staging buffers."""

    def __init__(
        self, *, chunk_size: int, writer: Writer, executor: Executor, index: ChunkIndex | None, trust_version_counters: bool
    ) -> None:
        self.chunk_size = chunk_size
        self._writer, self._executor, self._index = writer, executor, index
        self.trust_version_counters = trust_version_counters
        self._staging: list[bytearray] = []  # chunk buffers, reused from save to save
        self.hashed_bytes = 0  # hashed by its saves and parts (a tensor whose stamp matched is not)

    async def stage(self, leaves: list[Leaf], base: Base | None, *, copy: bool, own: bool) -> Staged:
        """Hash ``leaves`` (those ``_known`` does not vouch for) and sort their chunks: held by
        the base at the same place, held by the bucket's chunk index, a repeat of one staged
        before in this save, or new (copied into a staging buffer if ``copy``)."""
        known = self._known(leaves, base, own)
        hashing = [leaf.data for leaf in leaves if leaf.data is not None and leaf.name not in known]
        hashed = iter(await self._digests(hashing))
        self.hashed_bytes += sum(len(data) for data in hashing)
        staged = Staged(leaves=leaves)
        if self.trust_version_counters:
            staged.stamps = {leaf.name: leaf.stamp for leaf in leaves if leaf.stamp is not None}
        wanted: dict[bytes, int] = {}  # digest -> length, of the chunks the base does not hold in place
        for leaf in leaves:
            mine = [] if leaf.data is None else known[leaf.name] if leaf.name in known else next(hashed)
            previous = base.match(leaf, self.chunk_size) if base is not None and leaf.data is not None else None
            held = base.chunk_refs(previous) if base is not None and previous is not None else []
            slots: list[_Slot | None] = []
            for i, digest in enumerate(mine):
                if previous is not None and previous.digests[i] == digest:
                    slots.append(held[i])
                    continue
                slots.append(None)
                wanted.setdefault(digest, min(self.chunk_size, len(leaf.data or b"") - i * self.chunk_size))
            staged.chunks.append(slots)  # type: ignore[arg-type]  # its Nones are filled below
            staged.digests.append(mine)
        found = await self._index.lookup(wanted) if self._index is not None and wanted else {}
        self._fill(staged, found, copy=copy)
        return staged

    def _fill(self, staged: Staged, found: dict[bytes, tuple[ChunkRef, ...]], *, copy: bool) -> None:
        """Fill the chunks ``_stage`` left open: from the index, as a repeat, or staged new."""
        buffers = iter(self._staging)
        used: list[bytearray] = []
        new: set[bytes] = set()
        for leaf, slots, digests in zip(staged.leaves, staged.chunks, staged.digests, strict=True):
            for i, digest in enumerate(digests):
                if slots[i] is not None:
                    continue
                if digest in found:
                    slots[i] = found[digest]
                    continue
                if digest in new:
                    slots[i] = _Same(digest)
                    continue
                new.add(digest)
                assert leaf.data is not None  # a leaf without data has no digests
                piece = leaf.data[i * self.chunk_size : (i + 1) * self.chunk_size]
                if not copy:
                    slots[i] = piece
                    continue
                buffer = next(buffers, None) or bytearray(self.chunk_size)
                used.append(buffer)
                view = memoryview(buffer)[: len(piece)]
                view[:] = piece
                slots[i] = view
        if copy:
            self._staging = used

    def _known(self, leaves: list[Leaf], base: Base | None, own: bool) -> dict[tuple[str, ...], list[bytes]]:
        """With ``trust_version_counters``, the digests of the tensors whose stamp is the one
        they had when this object committed ``base``: not hashed again.  Any other base
        (another writer's, or read back) has no stamps."""
        if not self.trust_version_counters or base is None or not own:
            return {}
        return base.known(leaves, self.chunk_size)

    async def _digests(self, datas: list[memoryview]) -> list[list[bytes]]:
        """Each array's chunk digests, hashed on the executor in batches of ~16 MiB."""
        loop = asyncio.get_running_loop()
        jobs = []
        for data in datas:
            starts = range(0, len(data), self.chunk_size)
            per_job = max(1, _HASH_BATCH // self.chunk_size)
            batches = [starts[i : i + per_job] for i in range(0, len(starts), per_job)]
            jobs.append([loop.run_in_executor(self._executor, _hash, data, batch, self.chunk_size) for batch in batches])
        return [[d for batch in await asyncio.gather(*job) for d in batch] for job in jobs]

    async def write(self, staged: Staged, base: Base | None) -> Part:
        """Write the staged chunks that are new (the rest are named by reference)."""
        new = [slot for slots in staged.chunks for slot in slots if isinstance(slot, memoryview)]
        written = iter(await self._writer.write_chunks(new))
        refs: list[ChunkRef] = []
        new_blocks: set[str] = set()
        entries = []
        fresh: dict[bytes, tuple[ChunkRef, ...]] = {}  # this save's new chunks, by digest
        for leaf, slots, digests in zip(staged.leaves, staged.chunks, staged.digests, strict=True):
            first = len(refs)
            new_bytes = 0
            extents = []
            for slot, digest in zip(slots, digests, strict=True):
                if isinstance(slot, memoryview):
                    held: tuple[ChunkRef, ...] = (next(written),)
                    fresh[digest] = held
                    new_blocks.add(held[0].block_id)
                    new_bytes += len(slot)
                else:
                    held = fresh[slot.digest] if isinstance(slot, _Same) else slot
                refs.extend(held)
                extents.append(len(held))
            entries.append(
                Entry(
                    name=leaf.name,
                    kind=leaf.kind,
                    dtype=leaf.dtype,
                    shape=leaf.shape,
                    value=leaf.value,
                    nbytes=0 if leaf.data is None else len(leaf.data),
                    new_bytes=new_bytes,
                    first=first,
                    digests=tuple(digests),
                    extents=tuple(extents) if any(n != 1 for n in extents) else (),
                )
            )
        return Part(
            entries=tuple(entries),
            chunks=tuple(msgspec.structs.replace(ref, grant="") if ref.grant else ref for ref in refs),
            new_blocks=tuple(sorted(new_blocks)),
            base_version=base.latest_version if base is not None else 0,
            chunk_size=self.chunk_size,
        )


@dataclass(frozen=True)
class _Same:
    """A chunk whose bytes an earlier chunk of the same save holds: named, not written twice."""

    digest: bytes


_Slot = tuple[ChunkRef, ...] | memoryview | _Same  # held refs, new bytes to write, or a repeat


@dataclass
class Staged:
    """A save's leaves; per leaf its chunks (a reused ChunkRef, or a staged copy to write) and
    their digests."""

    leaves: list[Leaf]
    chunks: list[list[_Slot]] = field(default_factory=list)
    digests: list[list[bytes]] = field(default_factory=list)
    stamps: dict[tuple[str, ...], Stamp] = field(default_factory=dict)  # its tensors', with trust_version_counters


def _hash(data: memoryview, starts: range, chunk_size: int) -> list[bytes]:
    return [xxhash.xxh3_128_digest(data[start : start + chunk_size]) for start in starts]
