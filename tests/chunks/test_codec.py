"""blobsdk.chunks.codec.verify_windows: a chunk checked where it was read, over one or more windows."""

from __future__ import annotations

import itertools
import os

import pytest
import xxhash

from blobsdk.chunks.codec import verify_windows
from blobsdk.errors import BadCopy
from blobsdk.wire import ChunkRef

RAW = os.urandom(1000)
REF = ChunkRef(block_id="0" * 32, offset=64, length=1000, raw_length=1000, checksum=xxhash.xxh3_64_intdigest(RAW))
MISMATCH = rf"^chunk {REF.key} at block {'0' * 32}\+64: checksum mismatch$"


def cut(data: bytes, *at: int) -> list[memoryview]:
    bounds = [0, *at, len(data)]
    return [memoryview(data[a:b]) for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("at", [(), (1,), (0, 500, 500, 999)])
def test_the_chunk_verifies_however_it_is_cut(at):
    verify_windows(REF, cut(RAW, *at))


@pytest.mark.parametrize("at", [(), (300,)])
def test_a_changed_byte_or_a_wrong_length_is_bad_copy(at):
    bad = bytearray(RAW)
    bad[700] ^= 1
    with pytest.raises(BadCopy, match=MISMATCH):
        verify_windows(REF, cut(bytes(bad), *at))
    with pytest.raises(BadCopy, match=MISMATCH):
        verify_windows(REF, cut(RAW[:999], *at))
