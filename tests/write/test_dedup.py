"""blobsdk/write/dedup.py: checkpoints name chunks any checkpoint of the same bucket stored,
whatever the prefix; gc sweeps index entries nothing else needs, and never loses what a
kept checkpoint names; on every metadata backend (SQLite, the API server, Redis, Redis Cluster)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from msgspec.structs import replace

import blobsdk
from blobsdk.chunks import INDEX_DIR, is_index_entry
from blobsdk.config import WriteConfig
from blobsdk.errors import BlockCollected
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.metadata.base import MetadataStore
from blobsdk.sources import LocalBlockStore
from blobsdk.wire import CommitOp, WriteKind
from tests.helpers import ROOT, gc_ahead
from tests.metadata_backends import metadata_fixture, redis_cluster_fixture, redis_server_fixture  # noqa: F401

CHUNK = 64 << 10
WRITE = WriteConfig(chunk_size=CHUNK, block_size=1 << 20)  # gc runs on a clock ahead (gc_ahead)


def weights(seed: int, chunks: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(chunks * CHUNK // 4, dtype=np.float32)


def blocks_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "blocks").rglob("*") if p.is_file())


async def index_entries(client: blobsdk.Client, bucket: str) -> list[str]:
    return [info.path async for info in client.list(f"/{bucket}/{INDEX_DIR}/")]


async def stored_blocks(blocks: LocalBlockStore) -> set[str]:
    return {info.block_id async for info in blocks.list_blocks()}


async def assert_index_sound_after_gc(client: blobsdk.Client, bucket: str) -> list[str]:
    """After a gc pass: each index entry of ``bucket`` reads back bytes whose xxh3-128 is its
    name, and names only blocks that exist and that a live plan other than the index names
    (the index pins nothing of its own).  Its entries."""
    state = client._open
    stored = {info.block_id async for info in state.blocks.list_blocks()}
    named = {b async for plan in state.metadata.iter_plans() if not is_index_entry(plan.path) for b in plan.block_ids()}
    entries = await index_entries(client, bucket)
    for path in entries:
        assert (await client.plan(path)).block_ids() <= stored & named, path
        assert xxhash.xxh3_128_hexdigest(await client.get(path)) == path.rsplit("/", 1)[1], path
    return entries


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    async with blobsdk.Client.local(tmp_path, write=WRITE) as c:
        yield c


async def test_a_second_prefix_names_the_first_ones_chunks(client: blobsdk.Client, tmp_path: Path) -> None:
    base = {"frozen": weights(0), "head": weights(1, chunks=1)}
    first = await (await client.checkpoints("/bkt/jobs/base").save(1, base)).wait()
    assert first.new_bytes == 9 * CHUNK
    assert len(await index_entries(client, "bkt")) == 9
    grown = blocks_bytes(tmp_path)
    tuned = {"frozen": base["frozen"], "head": weights(2, chunks=1)}  # a fine-tuning job: only its head differs
    manifest = await (await client.checkpoints("/bkt/jobs/tuned").save(1, tuned)).wait()
    assert (manifest.new_bytes, manifest.reused_bytes) == (CHUNK, 8 * CHUNK)
    assert blocks_bytes(tmp_path) - grown < 2 * CHUNK  # the new head chunk and the manifest
    loaded = await client.checkpoints("/bkt/jobs/tuned").load()
    assert np.array_equal(loaded["frozen"], base["frozen"]) and np.array_equal(loaded["head"], tuned["head"])
    assert len(await index_entries(client, "bkt")) == 10


async def test_each_index_entry_holds_the_bytes_its_name_hashes(client: blobsdk.Client) -> None:
    await (await client.checkpoints("/bkt/a").save(1, {"w": weights(0, chunks=3)})).wait()
    for path in await index_entries(client, "bkt"):
        assert xxhash.xxh3_128_hexdigest(await client.get(path)) == path.rsplit("/", 1)[1]
        assert is_index_entry(path)
    assert not is_index_entry("/bkt/a/000000000001/data")


async def test_repeated_chunks_in_one_save_are_written_once(client: blobsdk.Client) -> None:
    w = weights(0, chunks=2)
    manifest = await (await client.checkpoints("/bkt/a").save(1, {"a": w, "b": w.copy(), "z": np.zeros(CHUNK, np.uint8)})).wait()
    assert (manifest.new_bytes, manifest.reused_bytes) == (3 * CHUNK, 2 * CHUNK)
    loaded = await client.checkpoints("/bkt/a").load()
    assert np.array_equal(loaded["b"], w) and not loaded["z"].any()


async def test_another_bucket_does_not_dedup(client: blobsdk.Client) -> None:
    """The index is per bucket: the scope a tenant's token grants (DESIGN §7)."""
    state = {"w": weights(0)}
    await (await client.checkpoints("/one/ck").save(1, state)).wait()
    manifest = await (await client.checkpoints("/two/ck").save(1, state)).wait()
    assert manifest.new_bytes == 8 * CHUNK
    assert len(await index_entries(client, "two")) == 8


async def test_dedup_false_writes_everything_and_records_nothing(client: blobsdk.Client) -> None:
    state = {"w": weights(0)}
    await (await client.checkpoints("/bkt/a").save(1, state)).wait()
    manifest = await (await client.checkpoints("/bkt/b", dedup=False).save(1, state)).wait()
    assert manifest.new_bytes == 8 * CHUNK
    assert len(await index_entries(client, "bkt")) == 8  # the first save's only


async def test_gc_keeps_what_a_kept_checkpoint_names_through_the_index_then_sweeps(client: blobsdk.Client) -> None:
    state = {"w": weights(0)}
    a, b = client.checkpoints("/bkt/a"), client.checkpoints("/bkt/b")
    await (await a.save(1, state)).wait()
    await (await b.save(1, state)).wait()  # names a's blocks
    await a.remove(1)
    report = await gc_ahead(client)
    assert (report.blocks_deleted, report.index_entries_deleted) == (1, 0)  # a's manifest block only
    assert np.array_equal((await b.load())["w"], state["w"])
    await b.remove(1)
    report = await gc_ahead(client)
    assert report.index_entries_deleted == 8
    assert await index_entries(client, "bkt") == []
    left = await gc_ahead(client)
    assert (left.blocks_scanned, left.blocks_deleted) == (0, 0)  # nothing pinned, nothing leaked


async def test_an_index_entry_recorded_again_during_the_sweep_is_kept(tmp_path: Path) -> None:
    class Racing(SqliteMetadataStore):
        """Re-records every index entry just before gc deletes it (a save that wrote them anew)."""

        async def delete(self, path: str, if_version: int | None = None, *, kind: WriteKind = "blob") -> Any:
            if is_index_entry(path):
                await self.commit_many([CommitOp(path=path, plan=await self.get_plan(path), kind="index")])
            return await super().delete(path, if_version, kind=kind)

    async with (
        Racing(tmp_path / "meta.sqlite") as meta,
        LocalBlockStore(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=WRITE) as c,
    ):
        ck = c.checkpoints("/bkt/a")
        await (await ck.save(1, {"w": weights(0, chunks=2)})).wait()
        await ck.remove(1)
        report = await gc_ahead(c)
        assert report.index_entries_deleted == 0  # each changed since the scan: kept, with its block
        entries = await index_entries(c, "bkt")
        assert len(entries) == 2
        assert [len(await c.get(path)) for path in entries] == [CHUNK, CHUNK]


async def test_a_save_naming_an_indexed_block_gc_fenced_is_refused_not_committed(client: blobsdk.Client) -> None:
    state = {"w": weights(0, chunks=2)}
    await (await client.checkpoints("/bkt/a").save(1, state)).wait()
    plan = await client.plan(f"/bkt/{INDEX_DIR}/{xxhash.xxh3_128_hexdigest(state['w'][: CHUNK // 4].tobytes())}")
    await client._open.metadata.fence_blocks(sorted(plan.block_ids()))  # gc's step 3, between lookup and commit
    b = client.checkpoints("/bkt/b")
    pending = await b.save(1, state)
    with pytest.raises(BlockCollected):
        await pending.wait()
    assert await b.list() == []


async def test_a_lookup_ignores_an_entry_of_the_wrong_length(client: blobsdk.Client) -> None:
    w = weights(0, chunks=1)
    path = f"/bkt/{INDEX_DIR}/{xxhash.xxh3_128_hexdigest(w.tobytes())}"
    wrong = await client.put("/bkt/junk", b"not the chunk")  # a bucket writer's bad entry:
    await client._open.metadata.commit_many(
        [CommitOp(path=path, plan=replace(await client.plan(wrong.path), path=path), kind="index")]
    )
    ck = client.checkpoints("/bkt/a")
    manifest = await (await ck.save(1, {"w": w})).wait()
    assert (manifest.new_bytes, ck.index_entries_refused) == (CHUNK, 1)
    assert np.array_equal((await client.checkpoints("/bkt/a").load())["w"], w)


# --- every metadata backend keeps the index: it is ordinary metadata --------------------------------


async def test_every_metadata_backend_dedups_across_prefixes_and_gc_sweeps_the_index(
    metadata: MetadataStore, tmp_path: Path
) -> None:
    async with LocalBlockStore(tmp_path / "blocks") as blocks, blobsdk.Client.from_stores(metadata, blocks, write=WRITE) as c:
        state = {"w": weights(0, chunks=4)}
        x, y = c.checkpoints("/b/x"), c.checkpoints("/b/y")
        assert (await (await x.save(1, state)).wait()).new_bytes == 4 * CHUNK
        manifest = await (await y.save(1, state)).wait()
        assert (manifest.new_bytes, manifest.reused_bytes) == (0, 4 * CHUNK)
        named = [(await c.plan(f"/b/{p}/000000000001/data")).block_ids() for p in "xy"]
        assert named[0] == named[1]  # y names x's blocks
        assert np.array_equal((await y.load())["w"], state["w"])
        assert len(await index_entries(c, "b")) == 4
        await x.remove(1)
        kept = await gc_ahead(c)
        assert kept.index_entries_deleted == 0 and named[1] <= await stored_blocks(blocks)
        assert np.array_equal((await y.load())["w"], state["w"])  # y names them: kept, and their entries
        await y.remove(1)
        report = await gc_ahead(c)
        assert report.index_entries_deleted == 4 and report.blocks_deleted == report.blocks_scanned > 0
        assert await index_entries(c, "b") == []
        assert [plan.path async for plan in metadata.iter_plans()] == []
        left = await gc_ahead(c)
        assert (left.blocks_scanned, left.blocks_deleted) == (0, 0)  # nothing pinned, nothing leaked


# --- a process SIGKILLed at each step of a deduplicating save -----------------------------------------

SAVER = """
import asyncio, sys
import numpy as np
import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.sources import LocalBlockStore
from blobsdk.chunks import is_index_entry
from blobsdk.write import checkpoint, dedup

store, kill_at = sys.argv[1], sys.argv[2]
armed = False


def stop_in(cls, name, when=lambda *args: True):
    real = getattr(cls, name)

    async def stopped(self, *args):
        if armed and when(*args):
            print("stopped", flush=True)
            await asyncio.Event().wait()  # SIGKILLed here
        return await real(self, *args)

    setattr(cls, name, stopped)


def nth(n, which):
    seen = []

    def when(*args):
        seen.extend([args] if which(*args) else [])
        return bool(seen) and seen[-1] is args and len(seen) == n

    return when


dedup.MAX_OPS_PER_REQUEST = 4  # the index is recorded 4 entries per transaction
if kill_at == "upload":  # the first of the save's 4 blocks written, not the others
    write_block, first = LocalBlockStore.write_block, []

    async def first_only(self, block_id, parts):
        if not armed:
            return await write_block(self, block_id, parts)
        if not first:
            first.append(asyncio.ensure_future(write_block(self, block_id, parts)))
        else:
            await first[0]
            print("stopped", flush=True)
            await asyncio.Event().wait()  # SIGKILLed here
        return await first[0]

    LocalBlockStore.write_block = first_only
elif kill_at == "commit":  # its chunks written, nothing committed
    stop_in(checkpoint.Checkpoints, "_commit")
elif kill_at == "record":  # committed, nothing recorded in the index
    stop_in(checkpoint.Checkpoints, "_record")
elif kill_at == "mid-record":  # 4 of its 16 entries recorded
    stop_in(SqliteMetadataStore, "commit_many", nth(2, lambda ops: is_index_entry(ops[0].path)))
elif kill_at == "retire":  # recorded, not yet retired or returned
    stop_in(checkpoint.Checkpoints, "_retire")


async def main():
    async with blobsdk.Client.local(store, write=WriteConfig(chunk_size=65536, block_size=1 << 18)) as c:
        w = np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32)
        await (await c.checkpoints("/ck/base").save(1, {"w": w})).wait()
        global armed
        for n in (2, 3):
            w[::65536] += 1.0  # 16 chunks of 64 change
            armed = n == 3
            await (await c.checkpoints(f"/ck/run/step-{n}").save(1, {"w": w})).wait()


asyncio.run(main())
"""

# Where the save of step 3 stops: whether it is committed, how many blocks it leaves orphaned,
# and how many of its 16 new chunks a later save of the same state writes again (those the
# index did not record).
KILLED = {
    "upload": (False, 1, 16),
    "commit": (False, 4, 16),
    "record": (True, 0, 16),
    "mid-record": (True, 0, 12),
    "retire": (True, 0, 0),
}


def stepped(n: int) -> np.ndarray:
    w = np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32)
    for _ in range(n - 1):
        w[::65536] += 1.0  # as the saver did: float32 sums, one at a time
    return w


@pytest.mark.parametrize("kill_at", KILLED)
async def test_a_process_killed_in_a_deduplicating_save_loses_dedup_at_worst_never_data(tmp_path: Path, kill_at: str) -> None:
    """The killed save (path per step, deduplicating against the earlier prefixes) stops at a
    known point; what is committed loads whole, gc keeps what it names and leaves nothing
    else, and the index holds only sound entries."""
    store = tmp_path / "store"
    saver = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SAVER, str(store), kill_at, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert saver.stdout is not None
    assert await asyncio.wait_for(saver.stdout.readline(), 60) == b"stopped\n"
    saver.send_signal(signal.SIGKILL)
    await saver.wait()
    committed, orphans, rewritten = KILLED[kill_at]
    async with blobsdk.Client.local(store, write=WRITE) as c:
        prefixes = ["/ck/base", "/ck/run/step-2", "/ck/run/step-3"][: 3 if committed else 2]
        assert [await c.checkpoints(p).list() for p in prefixes] == [[1]] * len(prefixes)
        assert await c.checkpoints("/ck/run/step-3").list() == ([1] if committed else [])
        assert (await gc_ahead(c)).blocks_deleted == orphans  # the killed save's orphans go; nothing a checkpoint names does
        for n, prefix in enumerate(prefixes, start=1):
            assert np.array_equal((await c.checkpoints(prefix).load())["w"], stepped(n)), prefix
        assert len(await assert_index_sound_after_gc(c, "ck")) == 64 + 16 + (16 - rewritten)  # base, step 2, what step 3 recorded
        left = await gc_ahead(c)
        assert (left.blocks_deleted, left.index_entries_deleted) == (0, 0)
        again = await (await c.checkpoints("/ck/run/step-4").save(1, {"w": stepped(3)})).wait()
        assert again.new_bytes == rewritten * CHUNK
        assert np.array_equal((await c.checkpoints("/ck/run/step-4").load())["w"], stepped(3))
        for prefix in [*prefixes, "/ck/run/step-4"]:
            await c.checkpoints(prefix).remove(1)
        await gc_ahead(c)
        assert await index_entries(c, "ck") == []
        assert [info async for info in c._open.blocks.list_blocks()] == []  # nothing orphaned is kept
