"""The reserved namespace ``/{bucket}/.blobsdk/`` (blobsdk/chunks/names.py, blobsdk/metadata/base.py):
part of the plan writers' conformance suite (blobsdk/testing/metadata.py), so every backend
refuses a user's commit or delete there, and takes blobsdk's own (kind ``"index"``) only in a
chunk index entry's shape.  Its listing is the listers' suite's."""

from __future__ import annotations

from typing import Any

import msgspec

from .._extras import requires_extra
from ..errors import BadRequest, BlobNotFound, InvalidPath
from ..wire import ChunkRef, CommitOp, ReadPlan, etag_of

with requires_extra("testing", "blobsdk.testing"):
    import pytest

ENTRY = "/b/.blobsdk/chunks/" + "0123456789abcdef" * 2


def one_chunk(path: str, seed: int = 0, size: int = 8) -> ReadPlan:
    chunks = (ChunkRef(block_id=f"{seed:032x}", offset=0, length=size, raw_length=size, checksum=seed),)
    return ReadPlan(path=path, version=0, etag=etag_of(chunks, size), size=size, chunk_size=size, chunks=chunks)


def reserved(path: str, bucket: str = "b") -> str:
    return (
        f"path {path!r}: /{bucket}/.blobsdk/ is reserved for blobsdk's own records (it can be read and listed, not written or"
        " deleted)"
    )


RESERVED_PATHS = ["/b/.blobsdk", "/b/.blobsdk/x", "/b/.blobsdk/chunks/x", ENTRY]
NOT_ENTRIES = [
    "/b/x",
    "/b/.blobsdk/x",
    "/b/.blobsdk/chunks/" + "A" * 32,
    "/b/.blobsdk/chunks/" + "0" * 31,
    "/b/.blobsdk/chunks/" + "0" * 32 + "/x",
    "/b/k/.blobsdk/chunks/" + "0" * 32,
]


class ReservedNamespaceTests:
    """Mixed into PlanWriterTests: every backend that writes plans passes these."""

    pytestmark = pytest.mark.asyncio

    @pytest.mark.parametrize("path", RESERVED_PATHS)
    async def test_a_blob_commit_in_the_reserved_namespace_is_invalid_path_and_commits_nothing(
        self, store: Any, path: Any
    ) -> None:
        with pytest.raises(InvalidPath) as exc:
            await store.commit(path, one_chunk(path))
        assert str(exc.value) == reserved(path)
        with pytest.raises(InvalidPath) as exc:  # and with another op, in one transaction: neither lands
            await store.commit_many([CommitOp(path="/b/ok", plan=one_chunk("/b/ok")), CommitOp(path=path, plan=one_chunk(path))])
        assert str(exc.value) == reserved(path)
        assert await store.get_plans(["/b/ok", path]) == [None, None]

    async def test_an_index_commit_makes_an_entry_everyone_reads_and_only_an_index_delete_removes(self, store: Any) -> None:
        (entry,) = await store.commit_many([CommitOp(path=ENTRY, plan=one_chunk(ENTRY), kind="index")])
        assert await store.get_plan(ENTRY) == entry
        with pytest.raises(InvalidPath) as exc:
            await store.delete(ENTRY)
        assert str(exc.value) == reserved(ENTRY)
        assert (await store.delete(ENTRY, if_version=entry.version, kind="index")).version == entry.version
        with pytest.raises(BlobNotFound):
            await store.get_plan(ENTRY)

    @pytest.mark.parametrize("path", NOT_ENTRIES)
    async def test_an_index_commit_elsewhere_is_invalid_path(self, store: Any, path: Any) -> None:
        with pytest.raises(InvalidPath) as exc:
            await store.commit_many([CommitOp(path=path, plan=one_chunk(path), kind="index")])
        assert str(exc.value) == (
            f"an index commit of {path!r}: an index entry is /{{bucket}}/.blobsdk/chunks/<32 lowercase hex>"
        )
        assert await store.get_plans([path]) == [None]

    async def test_an_index_commit_of_more_than_one_chunk_is_bad_request(self, store: Any) -> None:
        two = msgspec.structs.replace(one_chunk(ENTRY, size=16), chunks=(*one_chunk(ENTRY).chunks, *one_chunk(ENTRY, 1).chunks))
        with pytest.raises(BadRequest) as exc:
            await store.commit_many([CommitOp(path=ENTRY, plan=two, kind="index")])
        assert str(exc.value) == f"an index commit of {ENTRY!r}: an entry's plan names one chunk, this one 2"
        assert await store.get_plans([ENTRY]) == [None]

    async def test_an_index_delete_outside_the_reserved_namespace_is_invalid_path(self, store: Any) -> None:
        await store.commit("/b/x", one_chunk("/b/x"))
        with pytest.raises(InvalidPath) as exc:
            await store.delete("/b/x", kind="index")
        assert str(exc.value) == "an index delete of '/b/x': only what lies under /{bucket}/.blobsdk/"
        assert (await store.get_plan("/b/x")).version == 1

    async def test_an_unknown_kind_is_bad_request(self, store: Any) -> None:
        with pytest.raises(BadRequest) as exc:
            await store.commit_many([CommitOp(path="/b/x", plan=one_chunk("/b/x"), kind="admin")])  # type: ignore[arg-type]
        assert str(exc.value) == "kind must be 'blob' or 'index', got 'admin'"
        with pytest.raises(BadRequest) as exc:
            await store.delete("/b/x", kind="admin")
        assert str(exc.value) == "kind must be 'blob' or 'index', got 'admin'"
