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
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import xxhash

from ..wire import ChunkRef
from .compare import Base
from .dedup import ChunkIndex
from .delta import Run, Span, changed_runs, refs_of, tile, write_ranges
from .leaves import Leaf, Stamp
from .manifest import Entry, Part
from .writer import Writer

_HASH_BATCH = 16 << 20  # bytes hashed (or compared with the mirror) per executor job
GRANULE = 64  # bytes: the resolution of a patch's changed runs
MAX_EXTENTS = 64  # the default cap of refs per patched chunk (delta.tile's): bounds plan size and restore cost


class Stager:
    """Stages and writes the saves of one Checkpoints object; keeps its staging buffers."""

    def __init__(
        self,
        *,
        chunk_size: int,
        writer: Writer,
        executor: Executor,
        index: ChunkIndex | None,
        trust_version_counters: bool,
        mirror: bool = False,
        max_extents: int = MAX_EXTENTS,
    ) -> None:
        self.chunk_size = chunk_size
        self._writer, self._executor, self._index = writer, executor, index
        self.trust_version_counters = trust_version_counters
        self._staging: list[bytearray] = []  # chunk buffers, reused from save to save
        self.mirror, self.max_extents = mirror, max_extents
        self._mirror: dict[_Place, _Copy] = {}  # with ``mirror``: the last save's bytes of each chunk it staged or kept
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
            olds: dict[int, tuple[bytes, tuple[ChunkRef, ...]]] = {}  # the base's digest and refs of a changed chunk
            for i, digest in enumerate(mine):
                if previous is not None and previous.digests[i] == digest:
                    slots.append(held[i])
                    continue
                if previous is not None:
                    olds[i] = (previous.digests[i], held[i])
                slots.append(None)
                wanted.setdefault(digest, min(self.chunk_size, len(leaf.data or b"") - i * self.chunk_size))
            staged.chunks.append(slots)  # type: ignore[arg-type]  # its Nones are filled below
            staged.digests.append(mine)
            staged.olds.append(olds)
        found = await self._index.lookup(wanted) if self._index is not None and wanted else {}
        await self._fill(staged, found, copy=copy)
        return staged

    async def _fill(self, staged: Staged, found: dict[bytes, tuple[ChunkRef, ...]], *, copy: bool) -> None:
        """Fill the chunks ``stage`` left open: from the index, as a repeat, or new: a view of
        the state (``copy=False``), a staged copy, or, with the mirror holding the base's
        bytes of that chunk, a patch (only its changed runs are written)."""
        buffers = iter(self._staging)
        used: list[bytearray] = []
        new: set[bytes] = set()
        mirror: dict[_Place, _Copy] = {}
        patches: list[_Patching] = []
        for leaf, slots, digests, olds in zip(staged.leaves, staged.chunks, staged.digests, staged.olds, strict=True):
            for i, digest in enumerate(digests):
                place, kept = (leaf.name, i), self._mirror.get((leaf.name, i))
                if slots[i] is not None:  # held in place: so is the mirror's copy, if any
                    if kept is not None and kept.digest == digest:
                        mirror[place] = kept
                    continue
                if digest in found or digest in new:
                    slots[i] = found[digest] if digest in found else _Same(digest)
                    continue
                new.add(digest)
                assert leaf.data is not None  # a leaf without data has no digests
                piece = leaf.data[i * self.chunk_size : (i + 1) * self.chunk_size]
                if not copy:
                    slots[i] = piece
                    continue
                if self.mirror:
                    buffer = kept.buffer if kept is not None else bytearray(self.chunk_size)
                    mirror[place] = _Copy(digest, buffer)
                    view = memoryview(buffer)[: len(piece)]
                    old = olds.get(i)
                    if kept is not None and old is not None and kept.digest == old[0]:
                        patches.append((slots, i, view, piece, old[1]))  # the mirror holds the base's bytes
                        continue
                else:
                    buffer = next(buffers, None) or bytearray(self.chunk_size)
                    used.append(buffer)
                    view = memoryview(buffer)[: len(piece)]
                view[:] = piece
                slots[i] = view
        if copy:
            self._staging = used
        if self.mirror and copy:
            self._mirror = mirror
        await self._patch(patches)

    async def _patch(self, patches: list[_Patching]) -> None:
        """Find each patched chunk's changed runs against the mirror and copy it in (on the
        executor, a batch per job)."""
        loop = asyncio.get_running_loop()
        per_job = max(1, _HASH_BATCH // self.chunk_size)
        batches = [patches[i : i + per_job] for i in range(0, len(patches), per_job)]
        jobs = [loop.run_in_executor(self._executor, _diff_all, [(view, piece) for _, _, view, piece, _ in b]) for b in batches]
        for batch, runs in zip(batches, await asyncio.gather(*jobs), strict=True):
            for (slots, i, view, _, old), changed in zip(batch, runs, strict=True):
                slots[i] = _Patch(view, old, changed)

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
        """Write the staged chunks that are new and the changed runs of the patched ones (the
        rest are named by reference)."""
        tilings = {id(slot): tile(slot.old, slot.runs, len(slot.view), max_extents=self.max_extents) for slot in _patches(staged)}
        views: list[memoryview] = []
        for slot in (slot for slots in staged.chunks for slot in slots):
            if isinstance(slot, memoryview):
                views.append(slot)
            elif isinstance(slot, _Patch):
                views.extend(slot.view[start:end] for start, end in write_ranges(tilings[id(slot)]))
        written = await self._writer.write_chunks(views)
        held = await self._held(staged, tilings, iter(written))
        new_blocks = {ref.block_id for ref in written}
        refs: list[ChunkRef] = []
        entries = []
        for leaf, digests, chunks, new_bytes in zip(staged.leaves, staged.digests, held.refs, held.new_bytes, strict=True):
            first = len(refs)
            for chunk in chunks:
                refs.extend(chunk)
            counts = [len(chunk) for chunk in chunks]
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
                    extents=tuple(counts) if any(n != 1 for n in counts) else (),
                )
            )
        return Part(
            entries=tuple(entries),
            chunks=tuple(msgspec.structs.replace(ref, grant="") if ref.grant else ref for ref in refs),
            new_blocks=tuple(sorted(new_blocks)),
            base_version=base.latest_version if base is not None else 0,
            chunk_size=self.chunk_size,
        )

    async def _held(self, staged: Staged, tilings: dict[int, list[Span]], written: Iterator[ChunkRef]) -> _Held:
        """The refs that hold each chunk, given ``written`` (the new refs, in slot order): a
        patch's tiling is made on the executor (it checksums the reused sub-ranges)."""
        loop = asyncio.get_running_loop()
        fresh: dict[bytes, tuple[ChunkRef, ...]] = {}  # this save's new chunks, by digest
        patched: list[tuple[bytes, asyncio.Future[list[ChunkRef]]]] = []
        held = _Held()
        for slots, digests in zip(staged.chunks, staged.digests, strict=True):
            new_bytes = 0
            for slot, digest in zip(slots, digests, strict=True):
                if isinstance(slot, memoryview):
                    fresh[digest] = (next(written),)
                    new_bytes += len(slot)
                elif isinstance(slot, _Patch):
                    spans = tilings[id(slot)]
                    refs = [next(written) for _ in write_ranges(spans)]
                    new_bytes += sum(ref.raw_length for ref in refs)
                    patched.append((digest, loop.run_in_executor(self._executor, _refs_of, spans, slot.view, refs)))
            held.new_bytes.append(new_bytes)
        for digest, future in patched:
            fresh[digest] = tuple(await future)
        for slots, digests in zip(staged.chunks, staged.digests, strict=True):
            held.refs.append(
                [slot if isinstance(slot, tuple) else fresh[_digest(slot, d)] for slot, d in zip(slots, digests, strict=True)]
            )
        return held


@dataclass(frozen=True)
class _Same:
    """A chunk whose bytes an earlier chunk of the same save holds: named, not written twice."""

    digest: bytes


@dataclass(frozen=True)
class _Patch:
    """A changed chunk of which only ``runs`` differ from the base's version (held by ``old``),
    known because the mirror held the base's bytes; ``view``, the mirror's copy, now holds the
    new bytes: only the runs are written, the rest is named from ``old``'s stored bytes."""

    view: memoryview
    old: tuple[ChunkRef, ...]
    runs: list[Run]


@dataclass(frozen=True)
class _Copy:
    """The mirror's copy of one chunk of the last save: its digest and bytes."""

    digest: bytes
    buffer: bytearray


@dataclass
class _Held:
    """What ``Stager._held`` makes: per leaf, the refs of each chunk and the bytes written."""

    refs: list[list[tuple[ChunkRef, ...]]] = field(default_factory=list)
    new_bytes: list[int] = field(default_factory=list)  # per leaf, written by this save


_Patching = tuple[list[Any], int, memoryview, memoryview, tuple[ChunkRef, ...]]  # slots, index, mirror, new, old
_Place = tuple[tuple[str, ...], int]  # a chunk's place: its leaf's name and its index
_Slot = tuple[ChunkRef, ...] | memoryview | _Same | _Patch  # held refs, new bytes, a repeat, or a patch


@dataclass
class Staged:
    """A save's leaves; per leaf its chunks (a reused ChunkRef, or a staged copy to write) and
    their digests."""

    leaves: list[Leaf]
    chunks: list[list[_Slot]] = field(default_factory=list)
    digests: list[list[bytes]] = field(default_factory=list)
    olds: list[dict[int, tuple[bytes, tuple[ChunkRef, ...]]]] = field(default_factory=list)  # see stage
    stamps: dict[tuple[str, ...], Stamp] = field(default_factory=dict)  # its tensors', with trust_version_counters


def _hash(data: memoryview, starts: range, chunk_size: int) -> list[bytes]:
    return [xxhash.xxh3_128_digest(data[start : start + chunk_size]) for start in starts]


def _diff_all(pairs: list[tuple[memoryview, memoryview]]) -> list[list[Run]]:
    """For each (mirror, new): the runs where they differ; then the mirror takes the new bytes."""
    out = []
    for mirror, new in pairs:
        out.append(changed_runs(mirror, new, GRANULE))
        mirror[:] = new
    return out


def _refs_of(spans: list[Span], view: memoryview, written: list[ChunkRef]) -> list[ChunkRef]:
    return refs_of(spans, view, iter(written))


def _digest(slot: memoryview | _Same | _Patch, digest: bytes) -> bytes:
    """The digest of the chunk a slot's refs are this save's: its own, or its repeat's first."""
    return slot.digest if isinstance(slot, _Same) else digest


def _patches(staged: Staged) -> Iterator[_Patch]:
    return (slot for slots in staged.chunks for slot in slots if isinstance(slot, _Patch))
