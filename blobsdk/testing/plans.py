"""Plans and commits for the metadata suites (blobsdk/testing/metadata.py), and for a backend's
own tests: valid plans, plans that break one rule each (:data:`BAD_PLANS`), and commits of them."""

from __future__ import annotations

import msgspec

from ..metadata import BlockIndex, PlanLister, PlanWriter
from ..wire import ChunkRef, CommitOp, ReadPlan, etag_of

INVALID_PATHS = ["", "b/x", "/", "/b/../x", "/b/./x", "/b//x", "/b/x/", "/b/\x00x", "/b/" + "x" * 1022]


def make_plan(path: str, size: int = 10, seed: int = 0) -> ReadPlan:
    """A valid uncommitted plan of ``size`` bytes in 8-byte chunks (two by default) whose
    content depends on ``seed``."""
    lengths = [min(8, size - start) for start in range(0, size, 8)]
    chunks = tuple(
        ChunkRef(block_id=f"{seed:032x}", offset=i * 8, length=n, raw_length=n, checksum=seed * 100 + i)
        for i, n in enumerate(lengths)
    )
    return ReadPlan(path=path, version=0, etag=etag_of(chunks, size), size=size, chunk_size=8, chunks=chunks)


def bad_plan(path: str, plan: dict[str, object] | None = None, chunk: dict[str, object] | None = None) -> ReadPlan:
    """``make_plan(path)`` with some plan fields and some fields of its first chunk replaced."""
    good = make_plan(path)
    first = msgspec.structs.replace(good.chunks[0], **(chunk or {}))
    return msgspec.structs.replace(good, **{"chunks": (first, *good.chunks[1:]), **(plan or {})})


# (plan fields, first-chunk fields, the BadRequest message after "plan for '/b/x': ")
BAD_PLANS = [
    ({"size": 10, "chunks": ()}, None, "chunks cover 0 bytes, size is 10"),
    ({"size": 2**50}, None, "chunks cover 10 bytes, size is 1125899906842624"),
    ({"size": -1}, None, "negative size -1"),
    ({"chunk_size": 0}, None, "chunk_size 0 is not from 1 to 67108864"),
    ({"chunk_size": (64 << 20) + 1}, None, "chunk_size 67108865 is not from 1 to 67108864"),
    (None, {"block_id": "../../etc/passwd"}, "chunk 0: invalid block id '../../etc/passwd': want 32 lowercase hex digits"),
    (None, {"block_id": "A" * 32}, f"chunk 0: invalid block id '{'A' * 32}': want 32 lowercase hex digits"),
    (None, {"offset": -1}, "chunk 0: negative offset -1 or checksum 0 out of 64 bits"),
    (None, {"length": -8}, "chunk 0: uncompressed chunk with length -8 != raw_length 8"),
    (None, {"length": 7}, "chunk 0: uncompressed chunk with length 7 != raw_length 8"),
    (None, {"raw_length": -8, "length": -8}, "chunk 0: raw_length -8 is not from 1 to chunk_size 8"),
    (None, {"raw_length": 0, "length": 0}, "chunk 0: raw_length 0 is not from 1 to chunk_size 8"),
    ({"size": 11}, {"raw_length": 9, "length": 9}, "chunk 0: raw_length 9 is not from 1 to chunk_size 8"),
    (None, {"codec": "lz4", "length": 0}, "chunk 0: lz4 chunk with length 0 is not from 1 to 24 (raw_length 8)"),
    (None, {"codec": "lz4", "length": 25}, "chunk 0: lz4 chunk with length 25 is not from 1 to 24 (raw_length 8)"),
]


def two_block_plan(path: str, first: int, second: int) -> ReadPlan:
    """A 16-byte plan: one 8-byte chunk in block ``first``, one in block ``second``."""
    chunks = tuple(ChunkRef(block_id=f"{seed:032x}", offset=0, length=8, raw_length=8, checksum=seed) for seed in (first, second))
    return ReadPlan(path=path, version=0, etag=etag_of(chunks, 16), size=16, chunk_size=8, chunks=chunks)


async def naming(store: BlockIndex, block_ids: list[str]) -> list[str]:
    """The distinct paths ``iter_naming`` yields, sorted (a plan naming two of the ids may come twice)."""
    return sorted({plan.path async for plan in store.iter_naming(block_ids)})


async def put(store: PlanWriter, path: str, seed: int = 0, if_version: int | None = None) -> ReadPlan:
    return await store.commit(path, make_plan(path, seed=seed), if_version)


async def put_all(store: PlanWriter, paths: list[str]) -> None:
    await store.commit_many([CommitOp(path=p, plan=make_plan(p)) for p in paths])


async def all_listed(store: PlanLister, prefix: str, limit: int = 1000) -> list[str]:
    return [info.path async for info in store.list(prefix, limit=limit)]
