"""blobsdk/write/delta.py: a changed chunk tiled from its old version's stored bytes and the
bytes written anew.

Stored bytes live in fake blocks (``_Blocks``): an old version is cut at random places into
refs in one or more blocks, some lz4-compressed, with junk between some of them; the written
spans go into a block of their own.  Every tiling is read back from those blocks, each ref
decoded and checked against its checksum, and must give the new bytes exactly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import lz4.block
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from blobsdk.wire import ChunkRef, Codec
from blobsdk.write.delta import Keep, Reuse, Run, Span, Write, changed_runs, refs_of, tile, write_ranges

PROPERTIES = settings(max_examples=300, derandomize=True, deadline=None)
GRANULES = (1, 2, 3, 4, 5, 8, 12, 16, 24, 40, 64, 100, 136, 512)


class _Blocks:
    """Fake blocks: bytes appended to named blocks, and the refs that name them."""

    def __init__(self) -> None:
        self.blocks: dict[str, bytearray] = {}

    def store(self, block_id: str, raw: bytes, *, lz4_: bool = False, gap: int = 0) -> ChunkRef:
        """``raw`` appended to ``block_id`` after ``gap`` junk bytes, lz4-compressed if asked."""
        block = self.blocks.setdefault(block_id, bytearray())
        block += b"\xa5" * gap
        payload = lz4.block.compress(raw, store_size=False) if lz4_ else raw
        ref = ChunkRef(
            block_id=block_id,
            offset=len(block),
            length=len(payload),
            raw_length=len(raw),
            checksum=xxhash.xxh3_64_intdigest(raw),
            codec="lz4" if lz4_ else "none",
        )
        block += payload
        return ref

    def read(self, ref: ChunkRef) -> bytes:
        """The raw bytes of ``ref``, decoded and checked against its checksum."""
        payload = bytes(self.blocks[ref.block_id][ref.offset : ref.offset + ref.length])
        assert len(payload) == ref.length
        raw = lz4.block.decompress(payload, uncompressed_size=ref.raw_length) if ref.codec == "lz4" else payload
        assert len(raw) == ref.raw_length and xxhash.xxh3_64_intdigest(raw) == ref.checksum
        return raw

    def write(self, data: bytes, spans: Sequence[Span]) -> Iterator[ChunkRef]:
        """What a writer returns for the write spans of ``spans``: refs in block "w"."""
        return iter([self.store("w", data[start:end], lz4_=i % 2 == 1) for i, (start, end) in enumerate(write_ranges(spans))])


def _naive_runs(old: bytes, new: bytes, granule: int) -> list[Run]:
    runs: list[Run] = []
    for start in range(0, len(old), granule):
        end = min(start + granule, len(old))
        if old[start:end] == new[start:end]:
            continue
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
    return runs


def _ref(block_id: str, offset: int, n: int, codec: Codec = "none", grant: str = "") -> ChunkRef:
    length = n // 2 if codec == "lz4" else n
    return ChunkRef(block_id=block_id, offset=offset, length=length, raw_length=n, checksum=0, codec=codec, grant=grant)


# --- changed_runs ----------------------------------------------------------------------------


@PROPERTIES
@given(data=st.data(), granule=st.sampled_from(GRANULES), skew=st.tuples(st.integers(0, 7), st.integers(0, 7)))
def test_changed_runs_are_the_dirty_granules(data: st.DataObject, granule: int, skew: tuple[int, int]) -> None:
    old = data.draw(st.binary(max_size=2000))
    new = bytearray(old)
    for at in data.draw(st.lists(st.integers(0, max(0, len(old) - 1)), max_size=12)):
        if old:
            new[at] ^= data.draw(st.integers(1, 255))
    # at any alignment: the word compare must not depend on where the buffers sit
    old_view = memoryview(bytearray(skew[0]) + old)[skew[0] :]
    new_view = memoryview(bytearray(skew[1]) + new)[skew[1] :]
    assert changed_runs(old_view, new_view, granule) == _naive_runs(old, bytes(new), granule)


def test_changed_runs_of_a_4mib_chunk() -> None:
    old = os.urandom(4 << 20)
    new = bytearray(old)
    for at in (0, 4095, 4096, 1 << 20, (4 << 20) - 1):
        new[at] ^= 0xFF
    assert changed_runs(old, new, 4096) == [(0, 8192), (1 << 20, (1 << 20) + 4096), ((4 << 20) - 4096, 4 << 20)]
    assert changed_runs(old, new, 64) == [(0, 64), (4032, 4160), (1 << 20, (1 << 20) + 64), ((4 << 20) - 64, 4 << 20)]
    assert changed_runs(old, old, 4096) == []


def test_changed_runs_round_the_tail_granule() -> None:
    old = bytes(range(10))
    assert changed_runs(old, old[:9] + b"x", 4) == [(8, 10)]  # the short last granule, to the end
    assert changed_runs(old, b"x" + old[1:], 4) == [(0, 4)]
    assert changed_runs(old, b"x" + old[1:8] + b"yz", 4) == [(0, 4), (8, 10)]
    assert changed_runs(old, b"xyz" + old[3:], 16) == [(0, 10)]  # one granule, shorter than granule


def test_changed_runs_of_a_typed_buffer_count_bytes() -> None:
    old: Any = memoryview(bytearray(32)).cast("d")  # 4 doubles: 32 bytes (any buffer goes, typed or not)
    new: Any = memoryview(bytearray(31) + b"\x01").cast("d")
    assert changed_runs(old, new, 8) == [(24, 32)]


def test_changed_runs_refuse_buffers_of_different_lengths() -> None:
    with pytest.raises(ValueError, match=r"^old and new differ in length: 4 and 5 bytes$"):
        changed_runs(b"abcd", b"abcde", 1)


@pytest.mark.parametrize("granule", [0, -4, True, 1.5, "8"])
def test_changed_runs_refuse_a_bad_granule(granule: object) -> None:
    with pytest.raises(ValueError, match=rf"^granule must be an int >= 1, got {granule!r}$"):
        changed_runs(b"ab", b"ab", granule)  # type: ignore[arg-type]


# --- tile and refs_of: properties ------------------------------------------------------------


@st.composite
def _versions(draw: st.DrawFn, *, lz4_: bool) -> tuple[bytes, bytes, int, _Blocks, list[ChunkRef]]:
    """An old chunk stored as refs cut at random places (in blocks "a".."c", some lz4 if
    ``lz4_``, some back to back, some after junk), a new chunk, and a granule."""
    old = draw(st.binary(max_size=600))
    new = bytearray(old)
    for at, n in draw(st.lists(st.tuples(st.integers(0, max(0, len(old) - 1)), st.integers(1, 40)), max_size=8)):
        new[at : at + n] = draw(st.binary(min_size=len(new[at : at + n]), max_size=len(new[at : at + n])))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(old) - 1)), max_size=10)) if len(old) > 1 else set())
    blocks = _Blocks()
    refs = []
    for low, high in zip([0, *cuts], [*cuts, len(old)], strict=True):
        block = draw(st.sampled_from("abc"))
        compressed = lz4_ and draw(st.booleans())
        refs.append(blocks.store(block, old[low:high], lz4_=compressed, gap=draw(st.sampled_from((0, 0, 1, 3)))))
    return old, bytes(new), draw(st.sampled_from(GRANULES)), blocks, refs


Tiled = tuple[list[Span], list[ChunkRef], bytes]


def _tiled(old: bytes, new: bytes, granule: int, blocks: _Blocks, refs: list[ChunkRef], cap: int) -> Tiled:
    """Tile ``new``, write its write spans; the spans, the tiling, and its bytes read back
    (checksums verified)."""
    spans = tile(refs, changed_runs(old, new, granule), len(new), max_extents=cap)
    tiling = refs_of(spans, new, blocks.write(new, spans))
    assert len(tiling) == len(spans) <= cap
    return spans, tiling, b"".join(blocks.read(ref) for ref in tiling)


def _reused_only_as_allowed(refs: list[ChunkRef], tiling: list[ChunkRef]) -> None:
    """Each ref of ``tiling`` outside the written block is an old lz4 ref whole, or lies in
    bytes that old uncompressed refs stored."""
    plain = {(r.block_id, at) for r in refs if r.codec == "none" for at in range(r.offset, r.offset + r.length)}
    for ref in tiling:
        if ref.block_id != "w":
            assert (
                ref in refs
                if ref.codec == "lz4"
                else all((ref.block_id, at) in plain for at in range(ref.offset, ref.offset + ref.length))
            )


@PROPERTIES
@given(case=_versions(lz4_=True), cap=st.integers(1, 12))
def test_a_tiling_reads_back_as_the_new_chunk(case: tuple[bytes, bytes, int, _Blocks, list[ChunkRef]], cap: int) -> None:
    old, new, granule, blocks, refs = case
    spans, tiling, read = _tiled(old, new, granule, blocks, refs, cap)
    assert read == new
    ends = [0, *(s.end for s in spans)]
    assert [s.start for s in spans] == ends[:-1] and ends[-1] == len(new)  # in order, end to end
    _reused_only_as_allowed(refs, tiling)


@PROPERTIES
@given(case=_versions(lz4_=False))
def test_uncapped_only_the_dirty_granules_are_written(case: tuple[bytes, bytes, int, _Blocks, list[ChunkRef]]) -> None:
    old, new, granule, blocks, refs = case
    spans, _, read = _tiled(old, new, granule, blocks, refs, len(new) + 1)
    assert read == new
    assert write_ranges(spans) == _naive_runs(old, new, granule)
    assert all(isinstance(s, Write | Reuse) for s in spans)


# --- tile: cases -----------------------------------------------------------------------------


def test_an_unchanged_chunk_is_all_reused_in_as_few_refs_as_its_blocks_allow() -> None:
    refs = [_ref("a", 0, 10), _ref("a", 10, 5), _ref("a", 15, 8, "lz4"), _ref("a", 19, 6), _ref("a", 25, 4), _ref("a", 30, 2)]
    assert tile(refs, [], 35, max_extents=10) == [
        Reuse(0, 15, "a", 0),  # back to back in one block: one span
        Keep(15, 23, refs[2]),  # compressed: reused whole, never merged
        Reuse(23, 33, "a", 19),
        Reuse(33, 35, "a", 30),  # one junk byte before it in the block
    ]


def test_reuse_spans_merge_only_within_one_block() -> None:
    refs = [_ref("a", 0, 4), _ref("b", 4, 4), _ref("b", 8, 4)]
    assert tile(refs, [], 12, max_extents=10) == [Reuse(0, 4, "a", 0), Reuse(4, 12, "b", 4)]


def test_a_dirty_byte_writes_its_compressed_ref_whole_and_only_a_slice_of_a_plain_one() -> None:
    refs = [_ref("a", 0, 10), _ref("a", 10, 10, "lz4"), _ref("a", 15, 10)]
    assert tile(refs, [(4, 6), (12, 13)], 30, max_extents=10) == [
        Reuse(0, 4, "a", 0),
        Write(4, 6),
        Reuse(6, 10, "a", 6),
        Write(10, 20),
        Reuse(20, 30, "a", 15),
    ]


def test_a_run_across_refs_is_one_write() -> None:
    refs = [_ref("a", 0, 10), _ref("b", 0, 10)]
    assert tile(refs, [(8, 12)], 20, max_extents=10) == [Reuse(0, 8, "a", 0), Write(8, 12), Reuse(12, 20, "b", 2)]


def test_an_empty_chunk_has_no_spans() -> None:
    assert tile([], [], 0, max_extents=1) == []
    assert refs_of([], b"", iter([])) == []


# The chunk: reuse [0,10) W [10,20) R(5) W [25,30) R(2) W [32,40) R(9) W [49,50) R(3) W [53,60) R [60,100): 11 spans.
_GAPS = [(10, 20), (25, 30), (32, 40), (49, 50), (53, 60)]


@pytest.mark.parametrize(
    ("cap", "written"),
    [
        (11, _GAPS),
        (10, [(10, 20), (25, 40), (49, 50), (53, 60)]),  # the gap of 2 first, though it saves 2 spans
        (9, [(10, 20), (25, 40), (49, 50), (53, 60)]),
        (7, [(10, 20), (25, 40), (49, 60)]),  # then 3
        (5, [(10, 40), (49, 60)]),  # then 5
        (3, [(10, 60)]),  # then 9
        (2, [(0, 60)]),  # then the edge of 10, before the edge of 40
        (1, [(0, 100)]),
    ],
)
def test_a_cap_writes_the_smallest_gaps_first(cap: int, written: list[Run]) -> None:
    spans = tile([_ref("a", 0, 100)], _GAPS, 100, max_extents=cap)
    assert write_ranges(spans) == written and len(spans) <= cap
    assert all(s == Reuse(s.start, s.end, "a", s.start) for s in spans if not isinstance(s, Write))


def test_a_cap_on_an_unchanged_chunk_writes_its_smallest_ref_then_grows_that_write() -> None:
    refs = [_ref("a", 0, 5), _ref("b", 0, 3), _ref("c", 0, 8, "lz4"), _ref("d", 0, 6)]
    whole = tile(refs, [], 22, max_extents=4)
    assert whole == [Reuse(0, 5, "a", 0), Reuse(5, 8, "b", 0), Keep(8, 16, refs[2]), Reuse(16, 22, "d", 0)]
    # b (3 bytes) is written first, which saves no span; then a (5), next to that write
    assert tile(refs, [], 22, max_extents=3) == [Write(0, 8), Keep(8, 16, refs[2]), Reuse(16, 22, "d", 0)]
    assert tile(refs, [], 22, max_extents=2) == [Write(0, 16), Reuse(16, 22, "d", 0)]  # c, not d: d is not next to it
    assert tile(refs, [], 22, max_extents=1) == [Write(0, 22)]


@pytest.mark.parametrize("cap", [0, -1, True, 2.0, None])
def test_tile_refuses_a_bad_cap(cap: object) -> None:
    with pytest.raises(ValueError, match=rf"^max_extents must be an int >= 1, got {cap!r}$"):
        tile([_ref("a", 0, 4)], [], 4, max_extents=cap)  # type: ignore[arg-type]


@pytest.mark.parametrize(("sizes", "length"), [([4, 4], 9), ([4, 4], 7), ([], 1), ([6, -2], 4)])
def test_tile_refuses_old_refs_that_do_not_tile_the_chunk(sizes: list[int], length: int) -> None:
    refs = [_ref("a", 0, n) for n in sizes]
    with pytest.raises(ValueError, match=rf"^the old refs cover {sum(sizes)} bytes, the chunk is {length}$"):
        tile(refs, [], length, max_extents=4)


@pytest.mark.parametrize(
    ("runs", "bad", "after"),
    [
        ([(2, 2)], (2, 2), 0),  # empty
        ([(-1, 2)], (-1, 2), 0),
        ([(8, 11)], (8, 11), 0),  # past the end
        ([(4, 6), (1, 2)], (1, 2), 6),  # out of order
        ([(4, 6), (5, 8)], (5, 8), 6),  # overlapping
    ],
)
def test_tile_refuses_runs_that_are_not_ordered_disjoint_ranges(runs: list[Run], bad: Run, after: int) -> None:
    message = f"runs must be ordered, disjoint, non-empty ranges inside [0, 10): got {bad} after {after}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tile([_ref("a", 0, 10)], runs, 10, max_extents=4)


# --- refs_of ---------------------------------------------------------------------------------


def test_refs_of_names_the_old_bytes_and_takes_the_written_refs_in_order() -> None:
    data = bytes(range(30))
    kept = _ref("k", 40, 10, "lz4", grant="g")
    first, second = _ref("w", 0, 5), _ref("w", 5, 5, "lz4")
    spans: list[Span] = [Write(0, 5), Reuse(5, 10, "a", 100), Keep(10, 20, kept), Write(20, 25), Reuse(25, 30, "b", 7)]
    following = _ref("w", 10, 1)
    written = iter([first, second, following])
    assert (
        refs_of(spans, data, written)
        == [
            first,
            ChunkRef(block_id="a", offset=100, length=5, raw_length=5, checksum=xxhash.xxh3_64_intdigest(data[5:10])),
            ChunkRef(block_id="k", offset=40, length=5, raw_length=10, checksum=0, codec="lz4"),  # its grant dropped
            second,
            ChunkRef(block_id="b", offset=7, length=5, raw_length=5, checksum=xxhash.xxh3_64_intdigest(data[25:30])),
        ]
    )
    assert next(written) is following  # refs of later chunks stay for them


def test_refs_of_refuses_too_few_written_refs() -> None:
    with pytest.raises(ValueError, match=r"^no written ref left for the write span \[5, 9\)$"):
        refs_of([Write(0, 5), Write(5, 9)], bytes(9), iter([_ref("w", 0, 5)]))


def test_refs_of_refuses_a_written_ref_of_another_length() -> None:
    with pytest.raises(ValueError, match=r"^a written ref of 4 raw bytes for the write span \[0, 5\)$"):
        refs_of([Write(0, 5)], bytes(5), iter([_ref("w", 0, 4)]))


def test_refs_of_refuses_data_of_another_length() -> None:
    with pytest.raises(ValueError, match=r"^data is 6 bytes, the spans cover 5$"):
        refs_of([Write(0, 5)], bytes(6), iter([_ref("w", 0, 5)]))
