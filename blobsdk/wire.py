"""msgspec structs shared by the SDK and the servers (DESIGN §1, §6).

Wire bodies are msgpack (JSON is accepted for humans).  Chunk bytes never travel inside
these structs: they go raw in HTTP bodies.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import xxhash

Codec = Literal["none", "lz4"]


class ChunkRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where the stored bytes of one chunk live and how to check them."""

    block_id: str
    offset: int  # byte offset of the stored bytes inside the block
    length: int  # stored (possibly compressed) length
    raw_length: int  # length once decoded
    checksum: int  # xxh3-64 of the raw bytes
    codec: Codec = "none"

    @property
    def key(self) -> str:
        """Cache key: names these exact bytes forever, because blocks are immutable."""
        return xxhash.xxh3_128_hexdigest(f"{self.block_id}/{self.offset}/{self.length}".encode())


class ReadPlan(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The answer of getReadPlan: one immutable version of a blob."""

    path: str
    version: int  # assigned by the metadata store at commit; 0 in an uncommitted plan
    etag: str  # content hash of the chunk list
    size: int
    chunk_size: int
    chunks: tuple[ChunkRef, ...] = ()
    created: float = 0.0  # unix time of the commit

    def info(self) -> BlobInfo:
        return BlobInfo(
            path=self.path,
            size=self.size,
            version=self.version,
            etag=self.etag,
            created=self.created,
            chunks=len(self.chunks),
        )

    def block_ids(self) -> set[str]:
        return {c.block_id for c in self.chunks}


class BlobInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What users see of a committed blob version."""

    path: str
    size: int
    version: int
    etag: str
    created: float = 0.0
    chunks: int = 0


class BlockInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One stored L4 block."""

    block_id: str
    size: int
    created: float  # unix time the block became durable


# --- metadata API requests / responses -------------------------------------------------


class GetPlansRequest(msgspec.Struct, frozen=True, kw_only=True):
    paths: list[str]


class GetPlansResponse(msgspec.Struct, frozen=True, kw_only=True):
    plans: list[ReadPlan | None]  # aligned with the request; None = not found


class CommitOp(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    path: str
    plan: ReadPlan
    if_version: int | None = None  # None: unconditional; 0: create-only; N: must be at N


class CommitRequest(msgspec.Struct, frozen=True, kw_only=True):
    ops: list[CommitOp]


class CommitResponse(msgspec.Struct, frozen=True, kw_only=True):
    plans: list[ReadPlan]


class DeleteRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    path: str
    if_version: int | None = None


class DeleteResponse(msgspec.Struct, frozen=True, kw_only=True):
    deleted: BlobInfo


class ListRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    prefix: str
    start_after: str | None = None
    limit: int = 1000


class ListResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    items: list[BlobInfo]
    next_start_after: str | None = None  # None: this was the last page


class ListBlocksResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    blocks: list[BlockInfo]
    next_start_after: str | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


MSGPACK = "application/msgpack"
JSON = "application/json"

_encoder = msgspec.msgpack.Encoder()


def encode(obj: object) -> bytes:
    """msgpack-encode a wire struct."""
    return _encoder.encode(obj)


def etag_of(chunks: tuple[ChunkRef, ...] | list[ChunkRef], size: int) -> str:
    """Content etag: xxh3-128 over the raw checksums and lengths of the chunks."""
    h = xxhash.xxh3_128()
    h.update(size.to_bytes(8, "little"))
    for c in chunks:
        h.update(c.checksum.to_bytes(8, "little"))
        h.update(c.raw_length.to_bytes(8, "little"))
    return h.hexdigest()


class ScanRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Page through every live plan, sorted by path (garbage collection)."""

    start_after: str | None = None
    limit: int = 1000


class ScanResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    plans: list[ReadPlan]
    next_start_after: str | None = None
