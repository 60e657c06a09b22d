"""blobsdk/write/delta.py and blobsdk/write/patch.py: the runs where a chunk changed, and the
patch record of those runs, applied to the chunk's previous version in place."""

from __future__ import annotations

import itertools
import os
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobsdk.errors import CorruptData
from blobsdk.write import patch
from blobsdk.write.delta import Run, changed_runs

PROPERTIES = settings(max_examples=300, derandomize=True, deadline=None)
GRANULES = (1, 2, 3, 4, 5, 8, 12, 16, 24, 40, 64, 100, 136, 512)


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


# --- patch records ---------------------------------------------------------------------------


@PROPERTIES
@given(data=st.data(), granule=st.sampled_from(GRANULES))
def test_a_patch_of_the_changed_runs_turns_the_old_chunk_into_the_new(data: st.DataObject, granule: int) -> None:
    old = data.draw(st.binary(min_size=1, max_size=2000))
    new = bytearray(old)
    for at in data.draw(st.lists(st.integers(0, len(old) - 1), max_size=12)):
        new[at] ^= data.draw(st.integers(1, 255))
    runs = changed_runs(old, new, granule)
    record = patch.encode(new, runs)
    assert len(record) == patch.record_size(runs) == 12 + 8 * len(runs) + sum(end - start for start, end in runs)
    chunk = bytearray(old)
    patch.apply(record, memoryview(chunk))
    assert chunk == new


def test_patches_applied_in_order_give_the_latest_bytes() -> None:
    versions = [bytearray(os.urandom(4096))]
    for step in range(5):
        new = bytearray(versions[-1])
        new[step * 64 : step * 64 + 200] = os.urandom(200)  # overlapping runs, step after step
        new[4000 + step] ^= 0xFF
        versions.append(new)
    records = [patch.encode(new, changed_runs(old, new, 64)) for old, new in itertools.pairwise(versions)]
    chunk = bytearray(versions[0])
    for record in records:
        patch.apply(record, memoryview(chunk))
    assert chunk == versions[-1]


def test_a_patch_of_no_runs_changes_nothing() -> None:
    chunk = bytearray(b"abcd")
    patch.apply(patch.encode(b"wxyz", []), memoryview(chunk))
    assert chunk == b"abcd"


def _record(length: int, runs: list[Run], data: bytes, magic: bytes = b"BPT1") -> bytes:
    starts, ends = [s for s, _ in runs], [e for _, e in runs]
    return struct.pack(f"<4sII{len(runs)}I{len(runs)}I", magic, length, len(runs), *starts, *ends) + data


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (b"BPT1", "a patch record of 4 bytes is shorter than its header"),
        (_record(8, [], b"", magic=b"XXXX"), "not a patch record (magic b'XXXX')"),
        (_record(8, [(0, 2)], b"")[:-4], "a patch record of 16 bytes cannot hold its 1 runs"),
        (_record(8, [(0, 2)], b"a"), "a patch record of 21 bytes, its runs need 22"),
        (
            _record(8, [(2, 4), (0, 1)], b"abc"),
            "a malformed patch record: runs must be ordered, disjoint, non-empty ranges inside [0, 8): got (0, 1) after 4",
        ),
        (
            _record(8, [(6, 9)], b"abc"),
            "a malformed patch record: runs must be ordered, disjoint, non-empty ranges inside [0, 8): got (6, 9) after 0",
        ),
        (_record(4, [(0, 1)], b"a"), "a patch for a chunk of 4 bytes, applied to one of 8"),
    ],
)
def test_a_malformed_patch_is_refused_with_nothing_written(record: bytes, message: str) -> None:
    chunk = bytearray(8)
    with pytest.raises(CorruptData) as exc:
        patch.apply(record, memoryview(chunk))
    assert str(exc.value) == message
    assert chunk == bytearray(8)


def test_encode_refuses_runs_outside_the_chunk() -> None:
    with pytest.raises(ValueError) as exc:
        patch.encode(b"abcd", [(2, 6)])
    assert str(exc.value) == "runs must be ordered, disjoint, non-empty ranges inside [0, 4): got (2, 6) after 0"


@pytest.mark.parametrize(("granule", "rows"), [(64, True), (8, True), (4, False), (3, False)])
def test_whole_rows_of_8_bytes_or_more_are_gathered_at_once_and_give_the_same_bytes(granule: int, rows: bool) -> None:
    old = os.urandom(4096)
    new = bytearray(old)
    for at in (0, 100, 2000, 4095):
        new[at] ^= 0xFF
    record = patch.encode(new, changed_runs(old, new, granule))
    fast, slow = bytearray(old), bytearray(old)
    assert patch._apply_rows(memoryview(record), memoryview(fast)) is rows
    patch.apply(record, memoryview(slow))
    assert slow == new and (fast == new if rows else fast == old)
