"""A chunk's stored bytes -> its verified raw bytes: decode (lz4 or none), then check the
ChunkRef's length and xxh3-64 checksum.  Every tier boundary goes through here (DESIGN
invariant 1): the read path's tiers in the client, and the L3 node's read-through and PUTs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor

import lz4.block
import xxhash

from ..errors import BadCopy
from ..wire import ChunkRef

# Smaller lz4 payloads are decoded on the event loop: below this the hop to a thread costs
# more than the work.  Uncompressed chunks are only hashed (xxh3, ~8 GB/s), always inline:
# the rule the read path's tier benchmarks were measured with.
INLINE_DECODE = 256 << 10


def verify_raw(ref: ChunkRef, raw: memoryview) -> memoryview:
    """``raw`` if it is the chunk's exact raw bytes, else BadCopy."""
    if len(raw) != ref.raw_length or xxhash.xxh3_64_intdigest(raw) != ref.checksum:
        raise BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: checksum mismatch")
    return raw


def verify_windows(ref: ChunkRef, windows: Sequence[memoryview]) -> None:
    """Nothing if ``windows``, one after another, hold the chunk's exact raw bytes, else
    BadCopy: the check of an uncompressed chunk read straight into the caller's memory,
    maybe split over several of its buffers (one hash over them all, no join)."""
    if len(windows) == 1:  # the common case, inline: this runs once per chunk of a restore
        window = windows[0]
        if window.nbytes == ref.raw_length and xxhash.xxh3_64_intdigest(window) == ref.checksum:
            return
    else:
        digest = xxhash.xxh3_64()
        for window in windows:
            digest.update(window)
        if sum(w.nbytes for w in windows) == ref.raw_length and digest.intdigest() == ref.checksum:
            return
    raise BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: checksum mismatch")


def decode_chunk(ref: ChunkRef, stored: memoryview) -> memoryview:
    """Decode a chunk's stored bytes and verify them: the raw bytes, or BadCopy."""
    if ref.codec == "none":
        return verify_raw(ref, stored)
    try:
        raw = lz4.block.decompress(stored, uncompressed_size=ref.raw_length)
    except lz4.block.LZ4BlockError as exc:
        raise BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: undecodable lz4: {exc}") from exc
    return verify_raw(ref, memoryview(raw))


class ChunkDecoder:
    """The async :data:`~blobsdk.tiers.base.Decoder` handed to tiers: ``await
    decoder(ref, stored)`` is :func:`decode_chunk`, run inline for uncompressed or small
    chunks and on ``executor`` (None: the loop's default) for large lz4 ones.  With
    ``verify_inline=False`` large uncompressed chunks are verified on ``executor`` too: a
    restore straight into the caller's memory (ReadPath's direct reads) then hashes on both
    cores instead of on the event loop's thread, where it was 40% of the restore's time."""

    def __init__(self, executor: Executor | None = None, *, verify_inline: bool = True) -> None:
        self._executor = executor
        self._verify_inline = verify_inline

    async def __call__(self, ref: ChunkRef, stored: memoryview) -> memoryview:
        if len(stored) < INLINE_DECODE or (ref.codec == "none" and self._verify_inline):
            return decode_chunk(ref, stored)
        return await asyncio.get_running_loop().run_in_executor(self._executor, decode_chunk, ref, stored)
