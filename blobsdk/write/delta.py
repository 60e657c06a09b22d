"""Sub-chunk deltas: write only the bytes of a changed chunk that changed.

A delta checkpoint (blobsdk/write/checkpoint.py) compares each chunk's digest with the previous
checkpoint's and writes a changed chunk.  When the caller still holds the chunk's previous
bytes (a *mirror*), this module lets it write only the parts that changed, and name the rest
from the previous version's stored bytes.  The new version of the chunk is then a *tiling*: a
list of ChunkRefs whose raw lengths sum to the chunk's length, read back to back.

Three steps, each pure:

1. :func:`changed_runs` finds the ``[start, end)`` byte ranges where the new bytes differ from
   the mirror, at ``granule`` resolution (numpy; the caller uses it only when numpy imports).
2. :func:`tile` cuts ``[0, length)`` into :class:`Write` spans (to write) and reuse spans
   (:class:`Reuse`: a sub-range of the old version's uncompressed stored bytes; :class:`Keep`:
   an old compressed ref, every byte of it clean, reused whole), at most ``max_extents`` of them.
3. The caller writes the bytes of the write spans (:func:`write_ranges`), and :func:`refs_of`
   turns the spans and the refs the writer returned into the new tiling.

A sub-range can be read out of an uncompressed ref only: a compressed ref is reused whole or
written whole.  Reused bytes stay in their old blocks, which the new plan names, so gc keeps
them as long as the new version lives.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from ..sources.base import Buffer
from ..wire import ChunkRef

Run = tuple[int, int]  # [start, end) bytes of a chunk


@dataclass(frozen=True, slots=True)
class Write:
    """Bytes ``[start, end)`` of the new chunk, to be written anew."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Reuse:
    """Bytes ``[start, end)`` of the new chunk, equal to the old version's there, which the old
    version stored uncompressed at ``offset`` in block ``block_id`` (possibly across several of
    its refs, stored back to back)."""

    start: int
    end: int
    block_id: str
    offset: int


@dataclass(frozen=True, slots=True)
class Keep:
    """Bytes ``[start, end)`` of the new chunk: the old version's compressed ``ref``, none of
    whose bytes changed, reused whole."""

    start: int
    end: int
    ref: ChunkRef


Span = Write | Reuse | Keep

# --- 1. what changed -------------------------------------------------------------------------


def changed_runs(old: Buffer, new: Buffer, granule: int) -> list[Run]:
    """The ``[start, end)`` byte ranges where ``new`` differs from ``old`` (buffers of one
    length), in ``granule``-byte granules: a granule is dirty if any of its bytes differs (the
    last one may be short), and adjacent dirty granules form one run.

    Cost: one pass over both buffers, comparing them as the widest words (up to 8 bytes) that
    the granule and both buffers' alignment allow; temporaries are one bool per word and one
    per granule, never an index per byte.  A granule that is a multiple of 64 bytes is the
    fastest (about a cold memcpy's time).  Needs numpy: the caller uses this only when numpy
    imports (it is not a core dependency of blobsdk)."""
    import numpy as np

    if not isinstance(granule, int) or isinstance(granule, bool) or granule < 1:
        raise ValueError(f"granule must be an int >= 1, got {granule!r}")
    a = np.frombuffer(memoryview(old).cast("B"), np.uint8)
    b = np.frombuffer(memoryview(new).cast("B"), np.uint8)
    if len(a) != len(b):
        raise ValueError(f"old and new differ in length: {len(a)} and {len(b)} bytes")
    body = len(a) - len(a) % granule
    dirty = _dirty_granules(a[:body], b[:body], granule)
    if body < len(a):
        dirty = np.append(dirty, not np.array_equal(a[body:], b[body:]))
    edges = np.flatnonzero(np.diff(dirty, prepend=False, append=False)) * granule
    return list(zip(edges[0::2].tolist(), np.minimum(edges[1::2], len(a)).tolist(), strict=True))


def _dirty_granules(a: Any, b: Any, granule: int) -> Any:
    """One bool per ``granule`` bytes of ``a`` and ``b`` (uint8 arrays, a whole number of
    granules): whether they differ there."""
    import numpy as np

    width = math.gcd(granule, 8, a.ctypes.data, b.ctypes.data)  # bytes per word compared
    word = np.dtype(f"<u{width}")
    differs = a.view(word) != b.view(word)
    return _any_per_row(differs.reshape(-1, granule // width))


def _any_per_row(differs: Any) -> Any:
    """``differs.any(axis=1)``, fast for short rows too: 8 flags are read as one word, and a
    row of a few words is OR-ed column by column (numpy's reduction is slow across short rows)."""
    import numpy as np

    words = differs.shape[1]
    if words % 8 == 0:
        differs, words = differs.view(np.uint64), words // 8
    if words == 1:
        return differs[:, 0].astype(bool)
    if words > 16:
        return differs.any(axis=1)
    out = differs[:, 0].astype(bool)
    for column in range(1, words):
        out |= differs[:, column].astype(bool)
    return out


# --- 2. the tiling ---------------------------------------------------------------------------


def tile(old_refs: Sequence[ChunkRef], runs: Sequence[Run], length: int, *, max_extents: int) -> list[Span]:
    """Spans covering ``[0, length)`` in order, for a new chunk that differs from the old
    version (tiled by ``old_refs``, whose raw lengths sum to ``length``) in ``runs`` (ordered,
    disjoint ``[start, end)`` ranges, as :func:`changed_runs` returns).

    The rule: dirty bytes are written; clean bytes are reused from an uncompressed old ref
    (:class:`Reuse`); an old compressed ref is reused whole (:class:`Keep`) if none of its
    bytes is dirty, else written whole.  Adjacent writes merge, and so do adjacent reuses
    stored back to back in one block.  Then, while there are more than ``max_extents`` spans,
    the smallest reuse span next to a write is written instead (merging with its neighbours);
    if there is no write yet, the smallest reuse span is.  So a tiled chunk never has more than
    ``max_extents`` refs, and the bytes written beyond the dirty ones are the smallest gaps.

    Cost: O((refs + runs) log runs) to cut, O(n log n) in the n spans to cap."""
    if not isinstance(max_extents, int) or isinstance(max_extents, bool) or max_extents < 1:
        raise ValueError(f"max_extents must be an int >= 1, got {max_extents!r}")
    _check_tiling(old_refs, length)
    _check_runs(runs, length)
    ends = [end for _, end in runs]
    spans: list[Span] = []
    start = 0
    for ref in old_refs:
        spans.extend(_spans_of(ref, start, runs, ends))
        start += ref.raw_length
    return _cap(_merged(spans), max_extents)


def write_ranges(spans: Sequence[Span]) -> list[Run]:
    """The ``[start, end)`` ranges of the write spans, in order: what the caller writes."""
    return [(span.start, span.end) for span in spans if isinstance(span, Write)]


def _check_tiling(old_refs: Sequence[ChunkRef], length: int) -> None:
    covered = sum(ref.raw_length for ref in old_refs)
    if covered != length or any(ref.raw_length < 0 for ref in old_refs):
        raise ValueError(f"the old refs cover {covered} bytes, the chunk is {length}")


def _check_runs(runs: Sequence[Run], length: int) -> None:
    """ValueError unless ``runs`` are non-empty, ordered, disjoint ranges inside ``[0, length)``."""
    low = 0
    for start, end in runs:
        if not low <= start < end <= length:
            raise ValueError(
                f"runs must be ordered, disjoint, non-empty ranges inside [0, {length}): got {(start, end)} after {low}"
            )
        low = end


def _spans_of(ref: ChunkRef, start: int, runs: Sequence[Run], ends: list[int]) -> list[Span]:
    """The spans of the old ``ref`` (at ``start`` in the chunk) before merging."""
    end = start + ref.raw_length
    pieces = list(_pieces(start, end, runs, ends))
    if ref.codec == "none":
        at = ref.offset - start  # block offset of chunk byte 0, were the ref's bytes extended
        return [Write(low, high) if dirty else Reuse(low, high, ref.block_id, at + low) for low, high, dirty in pieces]
    if not pieces:
        return []
    return [Write(start, end) if any(dirty for _, _, dirty in pieces) else Keep(start, end, ref)]


def _pieces(start: int, end: int, runs: Sequence[Run], ends: list[int]) -> Iterator[tuple[int, int, bool]]:
    """``[start, end)`` cut into its clean and dirty pieces, in order: (low, high, dirty)."""
    k = bisect.bisect_right(ends, start)  # the first run that ends after start
    low = start
    while low < end:
        if k < len(runs) and runs[k][0] <= low:
            high = min(end, runs[k][1])
            yield low, high, True
            k += 1
        else:
            high = min(end, runs[k][0]) if k < len(runs) else end
            yield low, high, False
        low = high


def _merged(spans: list[Span]) -> list[Span]:
    """``spans`` with adjacent writes, and adjacent reuses stored back to back, merged."""
    out: list[Span] = []
    for span in spans:
        joined = _joined(out[-1], span) if out else None
        if joined is None:
            out.append(span)
        else:
            out[-1] = joined
    return out


def _joined(a: Span, b: Span) -> Span | None:
    """``a`` and the span after it as one span, if they can be one."""
    if isinstance(a, Write) and isinstance(b, Write):
        return Write(a.start, b.end)
    if isinstance(a, Reuse) and isinstance(b, Reuse) and a.block_id == b.block_id and a.offset + a.end - a.start == b.offset:
        return Reuse(a.start, b.end, a.block_id, a.offset)
    return None


# --- the cap on extents ----------------------------------------------------------------------


class _Chain:
    """Spans as a doubly linked list in which a reuse span can be turned into a write, merging
    with the writes next to it."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans: list[Span | None] = list(spans)  # None: merged into the span before it
        self.prev = list(range(-1, len(spans) - 1))
        self.next = [*range(1, len(spans)), -1]
        self.count = len(spans)

    def is_write(self, i: int) -> bool:
        return i >= 0 and isinstance(self.spans[i], Write)

    def is_reuse(self, i: int) -> bool:
        return i >= 0 and isinstance(self.spans[i], Reuse | Keep)

    def near_write(self, i: int) -> bool:
        return self.is_write(self.prev[i]) or self.is_write(self.next[i])

    def absorb(self, i: int) -> int:
        """Turn reuse span ``i`` into a write merged with its neighbouring writes; the index
        of that write."""
        span = self.spans[i]
        assert span is not None
        self.spans[i] = Write(span.start, span.end)
        if self.is_write(self.next[i]):
            self._join(i)
        if self.is_write(self.prev[i]):
            i = self.prev[i]
            self._join(i)
        return i

    def _join(self, i: int) -> None:
        """Merge write ``i`` with the write after it."""
        j = self.next[i]
        first, second = self.spans[i], self.spans[j]
        assert first is not None and second is not None
        self.spans[i], self.spans[j] = Write(first.start, second.end), None
        self.next[i] = self.next[j]
        if self.next[j] >= 0:
            self.prev[self.next[j]] = i
        self.count -= 1

    def candidate(self, i: int) -> tuple[int, int, int]:
        """Heap entry of span ``i``: the smallest first, then the earliest."""
        span = self.spans[i]
        assert span is not None
        return span.end - span.start, span.start, i

    def listed(self) -> list[Span]:
        return [span for span in self.spans if span is not None]


def _cap(spans: list[Span], max_extents: int) -> list[Span]:
    """``spans`` with the smallest reuse spans next to writes written until at most
    ``max_extents`` remain (see :func:`tile`).  O(n log n): a heap of the candidates."""
    if len(spans) <= max_extents:
        return spans
    chain = _Chain(spans)
    near_write = [i for i in range(len(spans)) if chain.is_reuse(i) and chain.near_write(i)]
    if not any(isinstance(span, Write) for span in spans):
        near_write = [min(range(len(spans)), key=chain.candidate)]  # a first write to grow from
    heap = [chain.candidate(i) for i in near_write]
    heapq.heapify(heap)
    while chain.count > max_extents:
        i = heapq.heappop(heap)[2]
        if not chain.is_reuse(i):
            continue  # already written
        i = chain.absorb(i)
        for j in (chain.prev[i], chain.next[i]):
            if chain.is_reuse(j):
                heapq.heappush(heap, chain.candidate(j))
    return chain.listed()


# --- 3. the refs -----------------------------------------------------------------------------


def refs_of(spans: Sequence[Span], data: Buffer, written: Iterator[ChunkRef]) -> list[ChunkRef]:
    """The new tiling: one ref per span of ``spans`` (from :func:`tile`), for the new chunk
    ``data``.  A write span takes the next ref of ``written`` (the writer's refs of the write
    spans' bytes, in order); a :class:`Reuse` becomes an uncompressed ref into its old block,
    checksummed here from ``data``; a :class:`Keep` is its old ref, without its grant.

    Cost: one xxh3-64 pass over the reused uncompressed bytes."""
    view = memoryview(data).cast("B")
    covered = spans[-1].end if spans else 0
    if len(view) != covered:
        raise ValueError(f"data is {len(view)} bytes, the spans cover {covered}")
    return [_ref_of(span, view, written) for span in spans]


def _ref_of(span: Span, data: memoryview, written: Iterator[ChunkRef]) -> ChunkRef:
    match span:
        case Write(start, end):
            ref = next(written, None)
            if ref is None:
                raise ValueError(f"no written ref left for the write span [{start}, {end})")
            if ref.raw_length != end - start:
                raise ValueError(f"a written ref of {ref.raw_length} raw bytes for the write span [{start}, {end})")
            return ref
        case Reuse(start, end, block_id, offset):
            checksum = xxhash.xxh3_64_intdigest(data[start:end])
            return ChunkRef(block_id=block_id, offset=offset, length=end - start, raw_length=end - start, checksum=checksum)
        case Keep(_, _, ref):
            return ref.unsigned()
