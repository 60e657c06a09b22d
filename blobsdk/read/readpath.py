"""The tiered read path (DESIGN §2): for each chunk a plan needs, walk the tiers in order —
L1 memory, L2 local disk, (peers), L3 regional flash, L4 durable — with one fetch per chunk
key in flight (single-flight, :mod:`blobsdk.runtime.singleflight`), verify bytes at every tier
boundary (:mod:`blobsdk.chunks.codec`), and fill the upper tiers on the way back.

The walk: first every tier's synchronous ``peek``, in order (an L1 hit costs no await and
no task); the first hit is the answer.  Otherwise one fetch task per chunk key asks each
tier's ``fetch`` in order; the first tier that has the chunk serves it, and every tier above
it is offered the bytes (``fill``).

Buffer ownership, the one rule: the buffer a tier serves belongs to the read path.  Once it
is filled into an upper tier (which may keep it as is, as L1 does, or until written, as
L2's write-behind does), kept by the tier that served it (``keeps_fetched``: the peer tier's
serving cache) or shared by several readers, it is shared: read-only to everyone.
A reader gets the buffer itself, with no copy, only when it reads the chunk whole, it was
the only reader of the fetch, and no tier kept the buffer; every other reader copies its
part out of it.  A read gives the buffers it alone copied from, and no tier kept, back to
the tiers' :class:`~blobsdk.runtime.buffers.BufferPool`, for the next fetches to read into
(a get of a client without L1, or a one-off read: ``read_into(..., fill_memory=False)``, a
checkpoint restore).  A get's result is taken unzeroed: every byte of it is a chunk's.

A one-off read's whole uncompressed chunks need no buffer at all when the tier it would
fetch from is L4 with a lone replica (:class:`~blobsdk.tiers.base.DirectTier`): they are read
straight into the caller's memory (into each of its windows, for a chunk that straddles the
caller's buffers) and verified there.  They go in groups, a block's chunks in the order of
their offsets (``_start_groups``, with :mod:`blobsdk.read._groups`): on the local store one
request, one open and one ``preadv`` per run of nearby chunks, each chunk verified on the
thread that read it, so a chunk costs µs, not a task, a hedged attempt and two thread hops.
A replica that reads no spans (a block server, S3) gets them one at a time (``_direct``).
A client whose only tier is L4 fills nothing, so its gets of several chunks read as one-off
reads do, in groups straight into the result.  The figures are in docs/benchmarks.md
("Figures behind the read path and the race").

The caller's memory (``get_into``, ``get_many_into``: ``read_ranges_into``): a client without
L1 reads as a one-off read does, so whole chunks from a lone L4 replica go straight into the
caller's buffer (a lone chunk with no task of its own: ``_direct_job``); with L1 the chunks
are filled into it as ``read`` fills them and copied out.

Priority: each fetch carries a :class:`~blobsdk.chunks.call.Demand` down to the limiters its
requests queue at: foreground for a reader's fetch, prefetch for :meth:`ReadPath.warm`'s.  A
reader that joins a fetch a prefetch started promotes it, so it never waits at prefetch
priority behind the rest of a prefetch.

Range rule: ``offset`` past the end gives an empty result; ``offset + length`` past the end
gives the bytes up to the end; a negative ``offset`` or ``length`` is a BadRequest (a
ValueError).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import weakref
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from ..chunks import ChunkDecoder, Demand, Piece, Priority, verify_windows
from ..errors import BadRequest, Unavailable
from ..runtime import BufferPool, SingleFlight, task_group, uninitialized
from ..tiers import DirectTier, Tier
from ..wire import ChunkRef, ReadPlan
from ._groups import Filling, Job, chunks_of, copy_into, direct_kind, starts_of


def resolve_range(size: int, offset: int, length: int | None) -> tuple[int, int]:
    """Clamp a requested range to ``[start, end)`` inside a blob of ``size`` bytes."""
    check_range(offset, length)
    start = min(offset, size)
    end = size if length is None else min(size, offset + length)
    return start, max(start, end)


def check_range(offset: object, length: object) -> None:
    """BadRequest unless ``offset`` is an int >= 0 and ``length`` None or an int >= 0."""
    check_offset(offset)
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 0):
        raise BadRequest(f"length must be None or an int >= 0, got {length!r}")


def check_offset(offset: object) -> None:
    """BadRequest unless ``offset`` is an int >= 0 (a blob offset)."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise BadRequest(f"offset must be an int >= 0, got {offset!r}")


# A one-off read's groups of whole chunks (ReadPath._start_groups): big enough that a group's
# request, thread hop and open cost little per byte, small enough that a restore of one block
# still keeps two cores busy; at most GROUPS_IN_FLIGHT at once.
GROUP_BYTES = 32 << 20
GROUP_CHUNKS = 256
GROUPS_IN_FLIGHT = 4


@dataclass(frozen=True, slots=True)
class _Served:
    """A chunk's verified raw bytes, and whether a tier kept a reference to them."""

    raw: memoryview
    kept: bool


class ReadPath:
    """Reads plans through an ordered list of tiers; the last one must never miss (L4)."""

    def __init__(
        self, tiers: Sequence[Tier], executor: Executor, parallel_chunks: int, buffers: BufferPool | None = None
    ) -> None:
        if not tiers:
            raise ValueError("a read path needs at least one tier")
        self.tiers = tuple(tiers)
        self.buffers = buffers if buffers is not None else BufferPool()  # the tiers' pool, if they share one
        self.decode = ChunkDecoder(executor)
        self._decode_direct = ChunkDecoder(executor, verify_inline=False)  # see _direct
        self._parallel = parallel_chunks
        self._fetches: SingleFlight[_Served] = SingleFlight()
        # chunk key -> the demand of its fetch in flight; weak, so a fetch cancelled before it
        # ever ran (and so never unlisted itself) leaves no entry behind
        self._demands: weakref.WeakValueDictionary[str, Demand] = weakref.WeakValueDictionary()
        # Where a one-off read's fetches start filling: below L1, when there is one above L4.
        self._one_off_top = 1 if self.tiers[0].name == "l1" and len(self.tiers) > 1 else 0
        # The tier a one-off read's whole chunks go straight into the caller's memory from: the
        # first it asks, when that is the last one and can (see _direct); else None.
        first = self.tiers[self._one_off_top]
        self._direct_tier = first if first is self.tiers[-1] and isinstance(first, DirectTier) else None
        self._above_direct = self.tiers[:-1]
        self._fills_memory = self.tiers[0].name == "l1"  # a read that is not one-off fills L1

    def read_now(self, plan: ReadPlan, offset: int = 0, length: int | None = None) -> bytearray | None:
        """A read of a one-chunk blob whose chunk a tier holds at hand (``peek``: L1), done
        without an await: the range copied out; None if no tier has it (or the range is bad:
        then ``read`` says why).  Small gets from L1 take this path: the five coroutine
        layers they skip cost ~1 µs each of a ~7 µs get."""
        chunks = plan.chunks
        if len(chunks) != 1 or type(offset) is not int or offset < 0:
            return None  # bad input: read's BadRequest
        if length is not None and (type(length) is not int or length < 0):
            return None
        end = plan.size if length is None else min(plan.size, offset + length)
        if offset >= end:
            return bytearray()  # as read: no chunk asked for
        ref = chunks[0]
        for tier in self.tiers:
            hit = tier.peek(ref)
            if hit is not None:
                return bytearray(hit[offset:end])
        return None

    async def read(self, plan: ReadPlan, offset: int = 0, length: int | None = None) -> bytearray:
        start, end = resolve_range(plan.size, offset, length)
        jobs = _overlapping(plan.chunks, start, end)
        if len(jobs) == 1 and jobs[0][1] == start and jobs[0][0].raw_length == end - start:
            return await self._whole_chunk(jobs[0][0])
        # unzeroed when the chunks fill every byte of it (a plan's always do), else zeroed
        out = uninitialized(end - start) if _tiles(jobs, start, end) else bytearray(end - start)
        window = memoryview(out)
        # with L4 the only tier, no read fills anything: every get reads as a one-off one does
        await self._read_jobs([(window, start, ref, chunk_start) for ref, chunk_start in jobs], one_off=len(self.tiers) == 1)
        return out

    async def read_into(self, plan: ReadPlan, out: memoryview | Sequence[memoryview], *, fill_memory: bool = True) -> None:
        """Read the whole of ``plan`` into ``out`` (exactly ``plan.size`` bytes), or into the
        buffers of a sequence one after another (a scatter read: a checkpoint restored into
        the caller's arrays).  With ``fill_memory=False`` the chunks fetched are not filled
        into L1: a one-off read (a checkpoint restore) would only evict the working set, and
        its buffers are free again as soon as they are copied out."""
        outs = [out] if isinstance(out, memoryview) else list(out)
        size = sum(o.nbytes for o in outs)
        if size != plan.size:
            raise BadRequest(f"{plan.path}: a buffer of {size} bytes for a blob of {plan.size}")
        jobs: list[Job] = []
        starts = _starts(plan.chunks)
        start = 0
        for o in outs:
            window = o.cast("B")
            jobs.extend((window, start, ref, at) for ref, at in _overlapping(plan.chunks, start, start + o.nbytes, starts))
            start += o.nbytes
        await self._read_jobs(jobs, one_off=not fill_memory)

    async def read_ranges_into(self, reads: Sequence[tuple[ReadPlan, int, memoryview]]) -> list[int]:
        """``get_into``'s and ``get_many_into``'s read: for each (plan, offset, out), the
        blob's bytes from ``offset`` into the start of ``out`` (a writable byte view), as many
        as fit before the blob ends; the count of each.  All at once, in one set of jobs: the
        chunks of several small blobs in one block are read as one group.

        Where the bytes come from, and what is copied (see the module docstring): a chunk L1
        holds is copied from it.  A client with L1 fills it as ``read`` does, so a chunk
        fetched lands in a buffer L1 keeps (the caller's memory cannot be kept: the caller
        reuses it) and is copied out of it.  A client without L1 reads as a one-off read: its
        whole uncompressed chunks from a lone-replica L4 go straight into ``out`` and are
        verified there; the rest (a chunk cut by the range, lz4, one fetched from L2, L3, a
        peer or a hedged L4) land in a buffer of the tier's, are copied into ``out``, and the
        buffer is given back to the pool unless L2 keeps it."""
        counts: list[int] = []
        jobs: list[Job] = []
        for plan, offset, out in reads:
            start, end = resolve_range(plan.size, offset, out.nbytes)
            counts.append(end - start)
            if end > start:
                window = out[: end - start]
                jobs.extend((window, start, ref, at) for ref, at in _overlapping(plan.chunks, start, end))
        if jobs:
            await self._read_jobs(jobs, one_off=not self._fills_memory)
        return counts

    async def _read_jobs(self, jobs: list[Job], *, one_off: bool) -> None:
        """Each job: (an output window, the blob offset it begins at, a chunk, the blob offset
        the chunk begins at).  A one-off read's whole chunks that can go straight into the
        output go in groups (see ``_start_groups``)."""
        direct = one_off and self._direct_tier is not None
        if len(jobs) == 1:
            if not direct or not await self._direct_job(*jobs[0]):
                await self._place(*jobs[0], one_off)
            return
        slots = asyncio.Semaphore(self._parallel)
        async with task_group() as tasks:
            if direct:
                jobs = await self._start_groups(jobs, tasks, slots)
            for job in jobs:
                tasks.create_task(self._bounded(slots, *job, one_off))

    async def _start_groups(self, jobs: list[Job], tasks: asyncio.TaskGroup, slots: asyncio.Semaphore) -> list[Job]:
        """Start a one-off read's whole uncompressed chunks that no tier has at hand and no
        fetch is reading on the direct tier, in groups (``_group``), each as soon as it is
        full, so that the first are read while the rest are found; the jobs of every other
        chunk are returned.  A group: chunks of one block, at most GROUP_BYTES (or one chunk)
        and GROUP_CHUNKS of them."""
        group_slots = asyncio.Semaphore(GROUPS_IN_FLIGHT)
        filling: dict[str, Filling] = {}
        rest: list[Job] = []
        for same, windows in chunks_of(jobs):
            ref = same[0][2]
            if windows is None or not direct_kind(ref) or self._in_flight(ref):
                rest.extend(same)
                continue
            held = self._at_hand(ref)
            if held is not None:
                copy_into(held, windows)
                continue
            group = filling.get(ref.block_id)
            if group is None:
                group = filling[ref.block_id] = Filling()
            elif group.nbytes + ref.length > GROUP_BYTES or len(group.pieces) == GROUP_CHUNKS:
                tasks.create_task(self._group(group_slots, slots, group.take()))
                await asyncio.sleep(0)  # it starts reading while the rest are grouped
            group.add(Piece(ref, windows))
        for group in filling.values():
            tasks.create_task(self._group(group_slots, slots, group.take()))
        return rest

    async def _direct_job(self, out: memoryview, start: int, ref: ChunkRef, chunk_start: int) -> bool:
        """A lone job's whole chunk straight into its window, with no task of its own (a
        ``get_into`` of one chunk, a restore of one): as a group of one, else by the tier's
        ``fetch_into``; False (nothing read) if the chunk is cut by the window or cannot go
        direct.  Through the groups' tasks, a 16 KiB get_into cost more than a get."""
        lo = chunk_start - start
        if lo < 0 or lo + ref.raw_length > out.nbytes or not direct_kind(ref) or self._in_flight(ref):
            return False
        window = out[lo : lo + ref.raw_length]
        held = self._at_hand(ref)
        if held is not None:
            window[:] = held
            return True
        tier = self._direct_tier
        assert tier is not None
        # Verified inline, unlike a restore's many chunks (``_direct``): one read waits for
        # this chunk alone, and the hop to a thread cost more than it spread.
        if await tier.fetch_many_into([Piece(ref, (window,))], verify_windows):
            return True
        return await tier.fetch_into(ref, window, self.decode)

    def _in_flight(self, ref: ChunkRef) -> bool:
        """Whether a fetch of the chunk is under way (then a reader shares it)."""
        return bool(self._demands) and ref.key in self._demands

    def _at_hand(self, ref: ChunkRef) -> memoryview | None:
        """The chunk's raw bytes if a tier above the direct one (the last) has them without
        an await (L1), else None."""
        for tier in self._above_direct:
            hit = tier.peek(ref)
            if hit is not None:
                return hit
        return None

    async def _group(self, group_slots: asyncio.Semaphore, slots: asyncio.Semaphore, group: list[Piece]) -> None:
        """A group of whole chunks of one block read straight into the output by the direct
        tier, in one request (on the local store: one open, one preadv per run of nearby
        chunks, each verified on the thread that read it, while still in the CPU's cache);
        one at a time (``_piece``) if the tier cannot."""
        assert self._direct_tier is not None
        async with group_slots:
            if await self._direct_tier.fetch_many_into(group, verify_windows):
                return
        async with task_group() as tasks:
            for piece in group:
                tasks.create_task(self._piece(slots, piece))

    async def _piece(self, slots: asyncio.Semaphore, piece: Piece) -> None:
        """One whole chunk of a group the direct tier could not read as a group: straight into
        its window if it has one (``_direct``), else copied into each of its windows."""
        async with slots:
            if len(piece.windows) == 1 and await self._direct(piece.ref, piece.windows[0]):
                return
            for window, at in zip(piece.windows, starts_of(piece.windows), strict=False):
                await self._place(window, at, piece.ref, 0, True)

    async def chunk(self, ref: ChunkRef) -> memoryview:
        """The verified raw bytes of one chunk, from the highest tier that has them (shared:
        read-only)."""
        raw, _ = await self._chunk(ref)
        return raw

    async def _whole_chunk(self, ref: ChunkRef) -> bytearray:
        """A read of exactly one whole chunk: its buffer itself when this reader is its sole
        owner (see the module docstring), else a copy."""
        raw, sole = await self._chunk(ref)
        if sole and isinstance(raw.obj, bytearray) and raw.nbytes == len(raw.obj):
            return raw.obj
        return bytearray(raw)

    async def _chunk(self, ref: ChunkRef, top: int = 0) -> tuple[memoryview, bool]:
        """The chunk's raw bytes, and whether the caller is their sole owner; a fetch this
        call starts fills the tiers from ``top`` down."""
        for tier in self.tiers:
            hit = tier.peek(ref)
            if hit is not None:
                return hit, False
        served, readers = await self._fetch(ref, top, Priority.FOREGROUND)
        return served.raw, readers == 1 and not served.kept

    async def aclose(self) -> None:
        """Cancel the fetches still in flight (the tiers belong to the caller)."""
        await self._fetches.aclose()

    async def _bounded(
        self, slots: asyncio.Semaphore, out: memoryview, start: int, ref: ChunkRef, chunk_start: int, one_off: bool
    ) -> None:
        async with slots:
            await self._place(out, start, ref, chunk_start, one_off)

    async def _place(self, out: memoryview, start: int, ref: ChunkRef, chunk_start: int, one_off: bool) -> None:
        """Copy the part of chunk ``ref`` (which begins at blob offset ``chunk_start``) that
        falls inside the output window beginning at blob offset ``start``; a one-off read
        fills no L1 and gives the buffer back (see the module docstring)."""
        lo = max(chunk_start, start)
        hi = min(chunk_start + ref.raw_length, start + len(out))
        raw, sole = await self._chunk(ref, self._one_off_top if one_off else 0)
        out[lo - start : hi - start] = raw[lo - chunk_start : hi - chunk_start]
        if sole:  # copied out, and nobody else has it: the next fetch reads into it
            self.buffers.give(raw)

    async def _direct(self, ref: ChunkRef, window: memoryview) -> bool:
        """A one-off read of one whole chunk straight into ``window`` (DirectTier.fetch_into),
        when no tier has the chunk at hand and no fetch of it is in flight; False (nothing
        read) else.  Verified on the executor: a restore's hashing uses both cores.  For a
        replica that reads no spans (a block server, S3); the local store reads groups."""
        tier = self._direct_tier
        if tier is None or not direct_kind(ref) or self._in_flight(ref) or self._at_hand(ref) is not None:
            return False
        return await tier.fetch_into(ref, window, self._decode_direct)

    async def warm(self, ref: ChunkRef, top: int) -> bool:
        """Deep prefetch of one chunk into ``tiers[top]`` and the tiers between it and the
        one that serves it (not those above ``top``), each told to ``keep`` the bytes; False
        if ``tiers[top]`` already holds them.  A reader of the chunk meanwhile shares this
        fetch (single-flight), whoever started it."""
        if self.tiers[top].holds(ref):
            return False
        await self._fetch(ref, top, Priority.PREFETCH)
        return True

    async def _fetch(self, ref: ChunkRef, top: int, priority: Priority) -> tuple[_Served, int]:
        """The chunk's fetch, started at ``priority`` or joined: a foreground caller that
        joins a prefetch's fetch promotes it (see the module docstring)."""
        running = self._demands.get(ref.key)
        if running is not None and priority is Priority.FOREGROUND:
            running.promote()
        prefetch = priority is Priority.PREFETCH
        return await self._fetches.run(ref.key, lambda: self._walk(ref, top, self._demand_of(ref.key, priority), prefetch))

    def _demand_of(self, key: str, priority: Priority) -> Demand:
        """A new fetch's demand, listed while it runs (``_walk`` unlists it)."""
        demand = self._demands[key] = Demand(priority)
        return demand

    async def _walk(self, ref: ChunkRef, top: int, demand: Demand, prefetch: bool) -> _Served:
        """The raw bytes from the first tier from ``top`` on whose ``fetch`` has them,
        offered to every tier from ``top`` to above it (``fill``; ``keep`` for a prefetch,
        which waits until they are stored, and skips ``tiers[top]``'s fetch: it does not hold them)."""
        try:
            return await self._walk_tiers(ref, top, demand, prefetch)
        finally:
            if self._demands.get(ref.key) is demand:
                del self._demands[ref.key]

    async def _walk_tiers(self, ref: ChunkRef, top: int, demand: Demand, prefetch: bool) -> _Served:
        for depth in range(top + prefetch, len(self.tiers)):
            tier = self.tiers[depth]
            raw = await tier.fetch(ref, self.decode, demand)
            if raw is not None:
                uppers = self.tiers[top:depth]
                for upper in uppers:
                    await (upper.keep(ref, raw) if prefetch else upper.fill(ref, raw))
                return _Served(raw, kept=bool(uppers) or tier.keeps_fetched)
        raise Unavailable(f"chunk {ref.key}: no tier could serve it")  # L4 raises before this


def _starts(chunks: Sequence[ChunkRef]) -> list[int]:
    """The blob offset each chunk begins at, and the blob's size last."""
    return list(itertools.accumulate((c.raw_length for c in chunks), initial=0))


def _overlapping(chunks: Sequence[ChunkRef], start: int, end: int, starts: list[int] | None = None) -> list[tuple[ChunkRef, int]]:
    """(chunk, blob offset where it begins) for every chunk overlapping ``[start, end)``;
    ``starts``: ``_starts(chunks)``, if known."""
    if start >= end:
        return []
    if len(chunks) == 1:
        return [(chunks[0], 0)]
    starts = starts if starts is not None else _starts(chunks)
    first = bisect.bisect_right(starts, start) - 1
    last = bisect.bisect_left(starts, end)
    return [(chunks[i], starts[i]) for i in range(first, min(last, len(chunks)))]


def _tiles(jobs: list[tuple[ChunkRef, int]], start: int, end: int) -> bool:
    """Whether ``jobs`` (from ``_overlapping``) cover every byte of ``[start, end)``."""
    at = start
    for ref, chunk_start in jobs:
        if chunk_start > at:
            return False
        at = max(at, chunk_start + ref.raw_length)
    return at >= end
