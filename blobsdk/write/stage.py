"""What a checkpoint save does before it commits (blobsdk/write/checkpoint.py): hash a state's
chunks, sort each into held (by the base at the same place, or by the bucket's chunk index,
blobsdk/write/dedup.py, once its entry is checked against the chunk's bytes), a repeat of one
earlier in the same save, or new; copy the new ones
into staging buffers (``save``) or take them as views (``write_part``); then write the new
ones and make the part that names them all.

With ``mirror`` (``save`` only), the object keeps a copy of every chunk it last staged or
kept, with its digest.  A chunk whose copy holds the base's bytes (same digest as the base's
chunk at that place) is compared with the copy instead of hashed (blobsdk/write/delta.py's
``changed_runs``, 64-byte granules); only its changed runs are copied in, and it becomes a
*patch*: ``write`` hashes it from the copy and writes a patch record of only the changed runs
(blobsdk/write/patch.py), appended to the base's refs of the chunk.  A chunk is written whole
again instead when its patches would add up to more than ``rewrite_at`` of it, or number more
than ``MAX_PATCHES``: what a restore reads beyond the chunk stays bounded.  A copy that does
not hold the base's bytes (another writer saved, a save failed, the object is new) is never
trusted: the chunk is hashed and, if changed, written whole.  Memory: one copy of the state's
arrays.

Hashing and comparing run on the client's executor in batches of ~16 MiB (xxh3 and numpy
release the GIL, so both cores work).  ``stage`` is what training waits for; ``write`` runs in
the background.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field

import xxhash

from ..wire import ChunkRef
from . import patch
from ._compare import Base
from .dedup import ChunkIndex
from .delta import Run, changed_runs
from .leaves import Leaf, Stamp
from .manifest import Entry, Holding, Part
from .writer import Writer

_HASH_BATCH = 16 << 20  # bytes hashed (or compared with the mirror) per executor job
GRANULE = 64  # bytes: the resolution of a patch's changed runs
REWRITE_AT = 0.5  # default: a chunk is written whole once its patches would add up to this share of it
MAX_PATCHES = 32  # patches a chunk may have: bounds its refs in the plan and a restore's reads


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
        rewrite_at: float = REWRITE_AT,
    ) -> None:
        self.chunk_size = chunk_size
        self._writer, self._executor, self._index = writer, executor, index
        self.trust_version_counters = trust_version_counters
        self._staging: list[bytearray] = []  # chunk buffers, reused from save to save
        self.mirror, self.rewrite_at = mirror, rewrite_at
        self._mirror: dict[_Place, _Copy] = {}  # with ``mirror``: the last save's bytes of each chunk it staged or kept
        self.hashed_bytes = 0  # hashed by its saves and parts (a tensor whose stamp matched is not)

    async def stage(self, leaves: list[Leaf], base: Base | None, *, copy: bool, own: bool) -> Staged:
        """Sort every chunk of ``leaves``: held by the base at the same place, held by the
        bucket's chunk index, a repeat of one staged before in this save, or new (copied into
        a staging buffer if ``copy``).  A chunk the mirror holds the base's bytes of is
        compared with them instead of hashed: unchanged, it is held; changed, a patch."""
        known = self._known(leaves, base, own)
        staged = Staged(leaves=leaves)
        if self.trust_version_counters:
            staged.stamps = {leaf.name: leaf.stamp for leaf in leaves if leaf.stamp is not None}
        previous = [None if base is None or leaf.data is None else base.match(leaf, self.chunk_size) for leaf in leaves]
        mirrored = self._mirrored(leaves, previous, known) if self.mirror and copy else {}
        compared = await self._compare(leaves, mirrored)
        hashing = [
            (leaf.data, [i for i in range(_count(leaf.data, self.chunk_size)) if (leaf.name, i) not in mirrored])
            for leaf in leaves
            if leaf.data is not None and leaf.name not in known
        ]
        hashed = iter(await self._digests(hashing))
        self.hashed_bytes += sum(
            min(self.chunk_size, len(data) - i * self.chunk_size) for data, chunks in hashing for i in chunks
        )
        wanted: dict[bytes, memoryview] = {}  # digest -> bytes, of the chunks the base does not hold in place
        for leaf, entry in zip(leaves, previous, strict=True):
            mine = [] if leaf.data is None else known[leaf.name] if leaf.name in known else next(hashed)
            held: list[Holding] = base.chunk_refs(entry) if base is not None and entry is not None else []
            slots: list[_Slot | None] = []
            for i, digest in enumerate(mine):
                runs = compared.get((leaf.name, i))
                if runs is not None:  # compared with the mirror
                    assert entry is not None
                    view = mirrored[(leaf.name, i)].view(len(runs.new))
                    slots.append(self._patch(view, held[i], runs.runs) if runs.runs else held[i])
                    mine[i] = b"" if runs.runs else entry.digests[i]  # a patch's digest: hashed in the background
                elif entry is not None and entry.digests[i] == digest:
                    slots.append(held[i])
                else:
                    slots.append(None)
                    assert leaf.data is not None  # a leaf without data has no digests
                    wanted.setdefault(digest, leaf.data[i * self.chunk_size : (i + 1) * self.chunk_size])
            staged.chunks.append(slots)  # type: ignore[arg-type]  # its Nones are filled below
            staged.digests.append(mine)
        found = await self._index.lookup(wanted) if self._index is not None and wanted else {}
        self._fill(staged, found, copy=copy)
        return staged

    def _mirrored(
        self, leaves: list[Leaf], previous: list[Entry | None], known: dict[tuple[str, ...], list[bytes]]
    ) -> dict[_Place, _Copy]:
        """The chunks whose base bytes the mirror holds (its copy's digest is the base's)."""
        mirrored = {}
        for leaf, entry in zip(leaves, previous, strict=True):
            if entry is None or leaf.name in known:
                continue
            for i, digest in enumerate(entry.digests):
                kept = self._mirror.get((leaf.name, i))
                if kept is not None and kept.digest == digest:
                    mirrored[(leaf.name, i)] = kept
        return mirrored

    async def _compare(self, leaves: list[Leaf], mirrored: dict[_Place, _Copy]) -> dict[_Place, _Compared]:
        """Compare each mirrored chunk with the mirror and copy its changed runs in (on the
        executor, ~16 MiB a job)."""
        pairs: list[tuple[_Place, memoryview, memoryview]] = []
        for leaf in leaves:
            for i in range(_count(leaf.data, self.chunk_size)):
                kept = mirrored.get((leaf.name, i))
                if kept is not None and leaf.data is not None:
                    piece = leaf.data[i * self.chunk_size : (i + 1) * self.chunk_size]
                    pairs.append(((leaf.name, i), kept.view(len(piece)), piece))
        loop = asyncio.get_running_loop()
        per_job = max(1, _HASH_BATCH // self.chunk_size)
        batches = [pairs[i : i + per_job] for i in range(0, len(pairs), per_job)]
        jobs = [loop.run_in_executor(self._executor, _diff_all, [(old, new) for _, old, new in b]) for b in batches]
        compared = {}
        for batch, runs in zip(batches, await asyncio.gather(*jobs), strict=True):
            for (place, _, new), changed in zip(batch, runs, strict=True):
                compared[place] = _Compared(new, changed)
                if changed:
                    mirrored[place].digest = b""  # its bytes moved on: known again once hashed (write)
        return compared

    def _fill(self, staged: Staged, found: dict[bytes, tuple[ChunkRef, ...]], *, copy: bool) -> None:
        """Fill the chunks ``stage`` left open: from the index, as a repeat, or new: a view of
        the state (``copy=False``) or a staged copy (in the mirror, with ``mirror``)."""
        buffers = iter(self._staging)
        used: list[bytearray] = []
        new: set[bytes] = set()
        mirror: dict[_Place, _Copy] = {}
        for leaf, slots, digests in zip(staged.leaves, staged.chunks, staged.digests, strict=True):
            for i, digest in enumerate(digests):
                place, kept = (leaf.name, i), self._mirror.get((leaf.name, i))
                if slots[i] is not None:  # held in place or patched: so is the mirror's copy, if any
                    if kept is not None and (kept.digest == digest or isinstance(slots[i], _Patch)):
                        mirror[place] = kept
                    continue
                if digest in found or digest in new:
                    slots[i] = Holding(found[digest]) if digest in found else _Same(digest)
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

    def _known(self, leaves: list[Leaf], base: Base | None, own: bool) -> dict[tuple[str, ...], list[bytes]]:
        """With ``trust_version_counters``, the digests of the tensors whose stamp is the one
        they had when this object committed ``base``: not hashed again.  Any other base
        (another writer's, or read back) has no stamps."""
        if not self.trust_version_counters or base is None or not own:
            return {}
        return base.known(leaves, self.chunk_size)

    async def _digests(self, leaves: list[tuple[memoryview, list[int]]]) -> list[list[bytes]]:
        """Each array's chunk digests (b"" for a chunk not listed: compared with the mirror),
        hashed on the executor in batches of ~16 MiB."""
        loop = asyncio.get_running_loop()
        per_job = max(1, _HASH_BATCH // self.chunk_size)
        jobs = []
        for data, chunks in leaves:
            starts = [i * self.chunk_size for i in chunks]
            batches = [starts[i : i + per_job] for i in range(0, len(starts), per_job)]
            jobs.append([loop.run_in_executor(self._executor, _hash, data, batch, self.chunk_size) for batch in batches])
        digests = []
        for (data, chunks), job in zip(leaves, jobs, strict=True):
            mine = [b""] * _count(data, self.chunk_size)
            for i, digest in zip(chunks, (d for batch in await asyncio.gather(*job) for d in batch), strict=True):
                mine[i] = digest
            digests.append(mine)
        return digests

    def _patch(self, view: memoryview, old: Holding, runs: list[Run]) -> _Patch:
        """A changed chunk compared with the mirror: patched onto ``old``, or written whole if
        its patches would then exceed the budget (``rewrite_at`` of it, or MAX_PATCHES)."""
        over = old.patches >= MAX_PATCHES or old.patch_bytes() + patch.record_size(runs) > self.rewrite_at * len(view)
        return _Patch(view, old, runs, whole=over)

    async def write(self, staged: Staged, base: Base | None) -> Part:
        """Write the staged chunks that are new, and a patch record (or the whole chunk) of each
        patched one (the rest are named by reference).  A patched chunk is hashed, and its
        record made, first (from the mirror)."""
        records = await self._seal_patches(staged)
        views: list[memoryview] = []
        for slot in (slot for slots in staged.chunks for slot in slots):
            if isinstance(slot, memoryview):
                views.append(slot)
            elif isinstance(slot, _Patch):
                views.append(slot.view if slot.whole else memoryview(records[id(slot)]))
        written = await self._writer.write_chunks(views)
        held = _held(staged, iter(written))
        self._remember(staged, held)
        new_blocks = {ref.block_id for ref in written}
        refs: list[ChunkRef] = []
        entries = []
        for leaf, digests, chunks, new_bytes in zip(staged.leaves, staged.digests, held.refs, held.new_bytes, strict=True):
            first = len(refs)
            for chunk in chunks:
                refs.extend(chunk.refs)
            counts = [len(chunk.refs) for chunk in chunks]
            patches = [chunk.patches for chunk in chunks]
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
                    patches=tuple(patches) if any(patches) else (),
                )
            )
        return Part(
            entries=tuple(entries),
            chunks=tuple(ref.unsigned() for ref in refs),
            new_blocks=tuple(sorted(new_blocks)),
            base_version=base.latest_version if base is not None else 0,
            chunk_size=self.chunk_size,
        )

    def _remember(self, staged: Staged, held: _Written) -> None:
        """Tell the index which refs hold the whole chunks just written (read by no later lookup)."""
        if self._index is None:
            return
        for slots, digests, holdings in zip(staged.chunks, staged.digests, held.refs, strict=True):
            for slot, digest, holding in zip(slots, digests, holdings, strict=True):
                whole = isinstance(slot, memoryview) or (isinstance(slot, _Patch) and slot.whole)
                if whole and len(holding.refs) == 1:
                    self._index.remember(digest, holding.refs[0])

    async def _seal_patches(self, staged: Staged) -> dict[int, bytearray]:
        """Set each patched chunk's digest (and its mirror copy's): xxh3-128 of its new bytes;
        and make the patch record of each one not written whole (by id of its slot)."""
        loop = asyncio.get_running_loop()
        places = [(li, i) for li, slots in enumerate(staged.chunks) for i, slot in enumerate(slots) if isinstance(slot, _Patch)]
        patches: list[_Patch] = [staged.chunks[li][i] for li, i in places]  # type: ignore[misc]
        sealed = await loop.run_in_executor(self._executor, _seal, patches)
        records = {}
        for (li, i), slot, (digest, record) in zip(places, patches, sealed, strict=True):
            staged.digests[li][i] = digest
            if record is not None:
                records[id(slot)] = record
            kept = self._mirror.get((staged.leaves[li].name, i))
            if kept is not None and kept.buffer is slot.view.obj:
                kept.digest = digest
        return records


def _held(staged: Staged, written: Iterator[ChunkRef]) -> _Written:
    """The refs that hold each chunk, given ``written`` (the new refs, in slot order)."""
    fresh: dict[bytes, Holding] = {}  # this save's new whole chunks, by digest
    patched: dict[int, Holding] = {}  # this save's patched chunks, by id of their slot
    out = _Written()
    for slots, digests in zip(staged.chunks, staged.digests, strict=True):
        new_bytes = 0
        for slot, digest in zip(slots, digests, strict=True):
            if isinstance(slot, memoryview) or (isinstance(slot, _Patch) and slot.whole):
                fresh[digest] = Holding((next(written),))
                new_bytes += len(slot) if isinstance(slot, memoryview) else len(slot.view)
            elif isinstance(slot, _Patch):
                ref = next(written)
                patched[id(slot)] = Holding((*slot.old.refs, ref), slot.old.patches + 1)
                new_bytes += ref.raw_length
        out.new_bytes.append(new_bytes)
    for slots, digests in zip(staged.chunks, staged.digests, strict=True):
        out.refs.append([_refs_of(slot, digest, fresh, patched) for slot, digest in zip(slots, digests, strict=True)])
    return out


def _refs_of(slot: _Slot, digest: bytes, fresh: dict[bytes, Holding], patched: dict[int, Holding]) -> Holding:
    if isinstance(slot, Holding):
        return slot
    if isinstance(slot, _Patch) and not slot.whole:
        return patched[id(slot)]
    return fresh[slot.digest if isinstance(slot, _Same) else digest]


@dataclass(frozen=True)
class _Same:
    """A chunk whose bytes an earlier chunk of the same save holds: named, not written twice."""

    digest: bytes


@dataclass(frozen=True)
class _Patch:
    """A changed chunk of which only ``runs`` differ from the base's version (held by ``old``),
    known because the mirror held the base's bytes; ``view``, the mirror's copy, now holds the
    new bytes: a patch record of the runs is written and appended to ``old``'s refs, or
    (``whole``: over the patch budget) the chunk is written whole."""

    view: memoryview
    old: Holding
    runs: list[Run]
    whole: bool = False


@dataclass
class _Copy:
    """The mirror's copy of one chunk of the last save: its digest (b"" while unknown) and bytes."""

    digest: bytes
    buffer: bytearray

    def view(self, length: int) -> memoryview:
        return memoryview(self.buffer)[:length]


@dataclass(frozen=True)
class _Compared:
    """A chunk compared with the mirror: its new bytes and the runs that changed (copied in)."""

    new: memoryview
    runs: list[Run]


@dataclass
class _Written:
    """What ``_held`` makes: per leaf, the refs of each chunk and the bytes written."""

    refs: list[list[Holding]] = field(default_factory=list)
    new_bytes: list[int] = field(default_factory=list)  # per leaf, written by this save


_Known = dict[tuple[str, ...], list[bytes]]  # digests by leaf name, vouched for by version stamps
_Place = tuple[tuple[str, ...], int]  # a chunk's place: its leaf's name and its index
_Slot = Holding | memoryview | _Same | _Patch  # held refs, new bytes, a repeat, or a patch


@dataclass
class Staged:
    """A save's leaves; per leaf its chunks (a reused ChunkRef, or a staged copy to write) and
    their digests."""

    leaves: list[Leaf]
    chunks: list[list[_Slot]] = field(default_factory=list)
    digests: list[list[bytes]] = field(default_factory=list)
    stamps: dict[tuple[str, ...], Stamp] = field(default_factory=dict)  # its tensors', with trust_version_counters


def _hash(data: memoryview, starts: list[int], chunk_size: int) -> list[bytes]:
    return [xxhash.xxh3_128_digest(data[start : start + chunk_size]) for start in starts]


def _diff_all(pairs: list[tuple[memoryview, memoryview]]) -> list[list[Run]]:
    """For each (mirror, new): the runs where they differ, copied into the mirror."""
    out = []
    for mirror, new in pairs:
        runs = changed_runs(mirror, new, GRANULE)
        for start, end in runs:
            mirror[start:end] = new[start:end]
        out.append(runs)
    return out


def _seal(patches: list[_Patch]) -> list[tuple[bytes, bytearray | None]]:
    """Each patched chunk's digest, and its patch record (None: written whole)."""
    return [(xxhash.xxh3_128_digest(p.view), None if p.whole else patch.encode(p.view, p.runs)) for p in patches]


def _count(data: memoryview | None, chunk_size: int) -> int:
    """How many chunks ``data`` is cut into."""
    return 0 if data is None else -(-len(data) // chunk_size)
