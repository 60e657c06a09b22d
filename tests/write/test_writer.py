import os

import lz4.block
import pytest
import xxhash

from blobsdk.config import WriteConfig
from blobsdk.read.readpath import _overlapping, resolve_range
from blobsdk.wire import ChunkRef
from blobsdk.write.writer import encode_chunk, split


def test_split_is_zero_copy():
    data = bytearray(b"abcdefghij")
    views = split(data, 4)
    assert [bytes(v) for v in views] == [b"abcd", b"efgh", b"ij"]
    data[0] = ord("z")
    assert bytes(views[0]) == b"zbcd"


def test_split_empty():
    assert split(b"", 4) == []


def test_auto_compresses_when_it_pays():
    raw = memoryview(b"a" * 100_000)
    enc = encode_chunk(raw, "auto")
    assert enc.codec == "lz4" and len(enc.payload) < 10_000
    assert enc.checksum == xxhash.xxh3_64_intdigest(raw)
    assert lz4.block.decompress(enc.payload, uncompressed_size=enc.raw_length) == bytes(raw)


def test_auto_keeps_random_bytes_raw():
    raw = memoryview(os.urandom(200_000))
    enc = encode_chunk(raw, "auto")
    assert enc.codec == "none" and enc.payload is raw


def test_auto_requires_ten_percent_saving():
    # ~5% compressible: random bytes with a short run of zeros
    raw = memoryview(os.urandom(19_000) + bytes(1_000))
    assert encode_chunk(raw, "auto").codec == "none"


def test_forced_lz4_and_none():
    raw = memoryview(os.urandom(1000))
    assert encode_chunk(raw, "lz4").codec == "lz4"
    assert encode_chunk(memoryview(b"a" * 1000), "none").codec == "none"


@pytest.mark.parametrize(
    ("size", "offset", "length", "expected"),
    [
        (10, 0, None, (0, 10)),
        (10, 3, 4, (3, 7)),
        (10, 8, 5, (8, 10)),  # past the end: short
        (10, 10, 5, (10, 10)),  # at the end: empty
        (10, 20, None, (10, 10)),  # beyond: empty
        (10, 2, 0, (2, 2)),
        (0, 0, None, (0, 0)),
    ],
)
def test_resolve_range(size, offset, length, expected):
    assert resolve_range(size, offset, length) == expected


@pytest.mark.parametrize(
    ("offset", "length", "message"),
    [
        (-1, None, "offset must be an int >= 0, got -1"),
        (0, -1, "length must be None or an int >= 0, got -1"),
        (1.5, None, "offset must be an int >= 0, got 1.5"),
    ],
)
def test_resolve_range_rejects(offset, length, message):
    with pytest.raises(ValueError, match=message):
        resolve_range(10, offset, length)


def _refs(*sizes):
    return tuple(ChunkRef(block_id="0" * 32, offset=0, length=s, raw_length=s, checksum=0) for s in sizes)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(0, 10, [0]), (0, 25, [0, 10, 20]), (10, 20, [10]), (9, 11, [0, 10]), (24, 25, [20]), (5, 5, [])],
)
def test_overlapping(start, end, expected):
    chunks = _refs(10, 10, 5)
    assert [begin for _, begin in _overlapping(chunks, start, end)] == expected


def test_a_chunk_size_no_plan_may_hold_is_refused_before_any_write():
    with pytest.raises(ValueError, match=r"^write\.chunk_size must be from 1 to 67108864, got 67108865$"):
        WriteConfig(chunk_size=(64 << 20) + 1, block_size=128 << 20)
