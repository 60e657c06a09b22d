"""Blocks for read-path tests: chunks packed into a block by hand, a lone replica that
reads one chunk per request, and a local store whose span reads wait to be released."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from blobsdk.chunks.call import Call
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import BlockStore, Buffer, new_block_id
from blobsdk.wire import BlockInfo, ChunkRef, Codec
from blobsdk.write.writer import encode_chunk


async def pack_chunks(blocks: BlockStore, raws: Sequence[bytes], compression: Codec = "none") -> list[ChunkRef]:
    """Write ``raws`` as the chunks of one new block, in order; their refs."""
    chunks = pack(raws, compression)
    await blocks.write_block(chunks.block_id, chunks.stored)
    return chunks.refs


class OneAtATime:
    """A lone replica over a local store that reads one chunk per request, as a block server
    or S3 does (it reads no spans): a one-off read's chunks go to it one at a time."""

    def __init__(self, store: LocalBlockStore) -> None:
        self.store = store
        self.name = store.name

    @property
    def replicas(self) -> tuple[Self]:
        return (self,)

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        await self.store.write_block(block_id, parts)

    async def delete_block(self, block_id: str) -> None:
        await self.store.delete_block(block_id)

    def list_blocks(self, start_after: str | None = None) -> AsyncIterator[BlockInfo]:
        return self.store.list_blocks(start_after)

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        await self.store.read_into(block_id, offset, out, call=call)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        return await self.store.read_range(block_id, offset, length)

    async def aclose(self) -> None:
        await self.store.aclose()

    async def __aenter__(self) -> Self:
        await self.store.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


@dataclass(frozen=True)
class Chunks:
    """Chunks packed into one (not yet written) block: ``stored`` are the block's parts."""

    block_id: str
    refs: list[ChunkRef]
    raws: list[bytes]
    stored: list[bytes]


def pack(raws: Sequence[bytes], codec: Codec = "none") -> Chunks:
    """``raws`` encoded with ``codec`` as consecutive chunks of a new block."""
    block_id, refs, stored, offset = new_block_id(), [], [], 0
    for raw in raws:
        enc = encode_chunk(memoryview(raw), codec)
        stored.append(bytes(enc.payload))
        ref = ChunkRef(
            block_id=block_id,
            offset=offset,
            length=len(enc.payload),
            raw_length=enc.raw_length,
            checksum=enc.checksum,
            codec=enc.codec,
        )
        refs.append(ref)
        offset += len(enc.payload)
    return Chunks(block_id, refs, list(raws), stored)


class GatedSpans(LocalBlockStore):
    """A local store whose span reads stop, after the first span is in, until released."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started, self.release = asyncio.Event(), threading.Event()
        self.checked: list[int] = []

    async def read_spans(self, block_id, spans, *, check=None, call=None):
        loop = asyncio.get_running_loop()

        def gated(i: int) -> None:
            assert check is not None
            check(i)
            if i == 0:
                loop.call_soon_threadsafe(self.started.set)
                self.release.wait()
            self.checked.append(i)

        return await super().read_spans(block_id, spans, check=gated, call=call)
