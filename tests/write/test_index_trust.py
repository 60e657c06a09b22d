"""The chunk index is a shared namespace (blobsdk/write/dedup.py): the poisoning attack of the
issue is refused, an entry another writer made is reused only once checked against the chunk
being saved, and a restore checks every chunk against its manifest, on every metadata backend
(the same attack across two tenants of a bucket: tests/test_tenancy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import xxhash

import blobsdk
from blobsdk.chunks import INDEX_DIR
from blobsdk.config import WriteConfig
from blobsdk.errors import CorruptData, InvalidPath
from blobsdk.metadata.base import MetadataStore
from blobsdk.sources import LocalBlockStore
from blobsdk.testing.reserved import reserved
from blobsdk.wire import ChunkRef, CommitOp
from blobsdk.write.writer import plan_of
from tests.metadata.unchecked import move_plan
from tests.metadata_backends import metadata_fixture, redis_cluster_fixture, redis_server_fixture  # noqa: F401

MiB = 1 << 20
WRITE = WriteConfig(chunk_size=MiB, block_size=4 * MiB)
ZERO_ENTRY = f"/ml/{INDEX_DIR}/{xxhash.xxh3_128_hexdigest(bytes(MiB))}"  # 1 MiB of zeros: a fresh optimizer moment
POISON = b"\x66" * MiB


def fresh_state(seed: int = 0) -> dict[str, Any]:
    """A job's state: weights, and a zero-initialised optimizer moment of one chunk."""
    weights = np.random.default_rng(seed).standard_normal(2 * MiB // 4, dtype=np.float32)
    return {"w": weights, "opt": {"exp_avg": np.zeros(MiB // 4, np.float32), "step": 0}}


def assert_state(loaded: dict[str, Any], state: dict[str, Any]) -> None:
    assert np.array_equal(loaded["w"], state["w"])
    assert loaded["opt"]["exp_avg"].tobytes() == bytes(MiB)
    assert loaded["opt"]["step"] == state["opt"]["step"]


async def plant_entry(client: blobsdk.Client, path: str, data: bytes, checksum: int | None = None) -> ChunkRef:
    """What any writer of the bucket can still do: its bytes written as a blob, then named by
    an index entry through blobsdk's own kind of commit (no store can check the bytes), the
    ref's checksum forged to ``checksum`` if given (no store can check that either)."""
    junk = await client.plan((await client.put("/ml/mallory/junk", data)).path)
    ref = junk.chunks[0].unsigned()
    if checksum is not None:
        ref = msgspec.structs.replace(ref, checksum=checksum)
    await client._open.metadata.commit_many([CommitOp(path=path, plan=plan_of(path, [ref]), kind="index")])
    return ref


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    async with blobsdk.Client.local(tmp_path, write=WRITE) as c:
        yield c


async def test_the_issues_attack_is_refused_and_an_entry_that_is_not_its_chunk_is_never_reused(
    metadata: MetadataStore, tmp_path: Path
) -> None:
    async with (
        LocalBlockStore(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(metadata, blocks, write=WRITE) as c,
    ):
        with pytest.raises(InvalidPath) as exc:
            await c.put(ZERO_ENTRY, POISON)
        assert str(exc.value) == reserved(ZERO_ENTRY, "ml")
        assert [b async for b in blocks.list_blocks()] == []  # refused before any I/O
        await plant_entry(c, ZERO_ENTRY, POISON)
        state = fresh_state()
        ck = c.checkpoints("/ml/job2")
        manifest = await (await ck.save(1, state)).wait()
        assert (ck.index_entries_refused, manifest.reused_bytes) == (1, 0)  # the moment is written, not named
        assert_state(await c.checkpoints("/ml/job2").load(), state)
        into = {"w": np.ones_like(state["w"]), "opt": {"exp_avg": np.full(MiB // 4, 7.0, np.float32)}}
        assert_state(await c.checkpoints("/ml/job2").load(into=into), state)
        assert await c.get(ZERO_ENTRY) == bytes(MiB)  # recorded anew: the entry is the chunk now
        job3 = c.checkpoints("/ml/job3")
        manifest = await (await job3.save(1, fresh_state(1))).wait()
        assert (job3.index_entries_refused, manifest.reused_bytes) == (0, MiB)  # and, checked, it is reused


@pytest.mark.parametrize("entry", ["same length, other bytes", "other bytes, checksum forged", "other length", "two refs"])
async def test_an_entry_whose_ref_is_not_its_chunk_is_ignored_and_logged_once(
    client: blobsdk.Client, tmp_path: Path, entry: str, caplog: pytest.LogCaptureFixture
) -> None:
    if entry == "two refs":  # the zeros in two halves, left by an older build that let a user write there
        halves = await client._open.writer.write_chunks([memoryview(bytes(MiB // 2))] * 2)
        await client._open.metadata.commit("/ml/halves", plan_of("/ml/halves", halves))
        move_plan(tmp_path / "meta.sqlite", "/ml/halves", ZERO_ENTRY)
    elif entry == "other bytes, checksum forged":  # its ref claims the zeros' xxh3-64: only reading it tells
        await plant_entry(client, ZERO_ENTRY, POISON, checksum=xxhash.xxh3_64_intdigest(bytes(MiB)))
    else:
        await plant_entry(client, ZERO_ENTRY, POISON if entry == "same length, other bytes" else bytes(MiB - 1))
    ck = client.checkpoints("/ml/job2")
    state = {"a": np.zeros(MiB // 4, np.float32), "b": np.zeros(MiB // 4, np.float32)}  # the chunk twice: one lookup
    manifest = await (await ck.save(1, state)).wait()
    assert (ck.index_entries_refused, manifest.new_bytes) == (1, MiB)
    warnings = [r.getMessage() for r in caplog.records if r.name == "blobsdk.write.dedup"]
    assert warnings == [
        "chunk index of bucket 'ml': 1 entry ignored, their ref is not the chunk their name says"
        f" (first: {ZERO_ENTRY}); those chunks are written anew"
    ]
    assert (await ck.load())["b"].tobytes() == bytes(MiB)


# --- a restore checks what the manifest promises -----------------------------------------------------


async def saved(client: blobsdk.Client, **options: Any) -> tuple[blobsdk.Checkpoints, dict[str, Any]]:
    state = fresh_state()
    ck = client.checkpoints("/ml/job2", **options)
    await (await ck.save(1, state)).wait()
    return ck, state


async def rewrite_data_plan(client: blobsdk.Client, index: int, ref: ChunkRef) -> None:
    """Checkpoint 1's data plan with ref ``index`` replaced: what an older build's save over a
    poisoned entry committed, or a writer of the prefix rewrote."""
    path = "/ml/job2/000000000001/data"
    plan = await client.plan(path)
    chunks = [c.unsigned() for c in plan.chunks]
    chunks[index] = ref
    await client._open.metadata.commit(path, plan_of(path, chunks, plan.chunk_size))


MOMENT_IS_NOT_SAVED = (
    "checkpoint 1 under /ml/job2 leaf 'opt/exp_avg' chunk 0: the bytes read are not the ones saved"
    " (their xxh3-128 is not the digest its manifest holds)"
)


async def test_a_checkpoint_an_older_build_saved_over_a_poisoned_entry_is_corrupt_data(client: blobsdk.Client) -> None:
    ck, state = await saved(client)
    await rewrite_data_plan(client, 2, await plant_entry(client, ZERO_ENTRY, POISON))  # w's 2 chunks, then the moment
    into = {"opt": {"exp_avg": np.ones(MiB // 4, np.float32)}}
    for options in ({}, {"into": into}, {"select": lambda name: name[0] == "opt"}):
        with pytest.raises(CorruptData) as exc:
            await ck.load(**options)
        assert str(exc.value) == MOMENT_IS_NOT_SAVED
    assert "w" not in into  # a leaf read into fresh memory is not set once a check failed
    assert np.array_equal((await ck.load(select=lambda name: name == ("w",)))["w"], state["w"])


async def test_a_poisoned_manifest_digest_is_corrupt_data(client: blobsdk.Client) -> None:
    ck, _ = await saved(client)
    manifest = await ck.manifest(1)
    entries = [
        msgspec.structs.replace(e, digests=(xxhash.xxh3_128_digest(POISON),)) if e.name == ("opt", "exp_avg") else e
        for e in manifest.entries
    ]
    forged = msgspec.structs.replace(manifest, entries=tuple(entries))
    await client.put("/ml/job2/000000000001/manifest", msgspec.msgpack.encode(forged))
    with pytest.raises(CorruptData) as exc:
        await client.checkpoints("/ml/job2").load()
    assert str(exc.value) == MOMENT_IS_NOT_SAVED


async def test_a_patched_chunk_is_checked_once_its_patches_are_applied(client: blobsdk.Client) -> None:
    state = {"w": np.random.default_rng(3).standard_normal(2 * MiB // 4, dtype=np.float32)}
    ck = client.checkpoints("/ml/job2", mirror=True)
    await (await ck.save(0, state)).wait()
    state["w"][5] += 1.0
    manifest = await (await ck.save(1, state)).wait()
    assert manifest.entries[0].patches == (1, 0)  # chunk 0: its base and a patch
    assert np.array_equal((await ck.load())["w"], state["w"])  # checked after the patch, not before
    plan = await client.plan("/ml/job2/000000000001/data")
    await rewrite_data_plan(client, 0, plan.chunks[2].unsigned())  # chunk 0's base: chunk 1's bytes
    with pytest.raises(CorruptData) as exc:
        await client.checkpoints("/ml/job2").load(into={"w": np.zeros_like(state["w"])})
    assert str(exc.value) == (
        "checkpoint 1 under /ml/job2 leaf 'w' chunk 0: the bytes read are not the ones saved"
        " (their xxh3-128 is not the digest its manifest holds)"
    )


async def test_a_client_reads_back_only_the_entries_it_neither_wrote_nor_confirmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry's bytes are read before reuse, but once per client: a save of a path per step
    (DCP) reads none of what its client wrote the step before; a new client reads each once."""
    state = fresh_state()

    async def saved_reading(client: blobsdk.Client, prefix: str) -> tuple[int, int]:
        reads: list[str] = []
        read = client._read

        async def counted(plan: Any, *args: Any) -> bytearray:
            reads.append(plan.path)
            return await read(plan, *args)

        monkeypatch.setattr(client, "_read", counted)
        manifest = await (await client.checkpoints(prefix).save(1, state)).wait()
        monkeypatch.undo()
        return len(reads), manifest.reused_bytes

    async with blobsdk.Client.local(tmp_path, write=WRITE) as c:
        assert await saved_reading(c, "/ml/step1") == (0, 0)  # written, recorded
        assert await saved_reading(c, "/ml/step2") == (0, 3 * MiB)  # its own chunks: nothing read
    async with blobsdk.Client.local(tmp_path, write=WRITE) as c:
        assert await saved_reading(c, "/ml/step3") == (3, 3 * MiB)  # another client: each entry read once
        assert await saved_reading(c, "/ml/step4") == (0, 3 * MiB)
