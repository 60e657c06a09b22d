"""``checkpoints(prefix, mirror=True)`` (blobsdk/write/stage.py, blobsdk/write/delta.py): a
changed chunk whose previous bytes the mirror holds writes only its changed runs; the rest
is named from the previous version's stored bytes.  Every restore stays exact, gc keeps
what the tilings name, and a mirror that no longer matches the base is never trusted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.ops import gc as gc_module
from blobsdk.write.stage import GRANULE, MAX_EXTENTS

CHUNK = 256 << 10
WRITE = WriteConfig(chunk_size=CHUNK, block_size=4 << 20, compression="none", max_write_seconds=0.2)


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    async with blobsdk.Client.local(tmp_path, write=WRITE) as c:
        yield c


def scatter(array: np.ndarray, rng: np.random.Generator, regions: int, length: int) -> int:
    """Overwrite ``regions`` runs of ``length`` floats, one in each ``regions``-th of ``array``;
    the bytes changed."""
    slot = len(array) // regions
    for i in range(regions):
        start = i * slot + int(rng.integers(0, slot - length + 1))
        array[start : start + length] = rng.standard_normal(length, dtype=np.float32)
    return regions * length * 4


async def test_scattered_changes_write_close_to_the_bytes_changed(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(0)
    array = rng.standard_normal(16 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", keep=10, mirror=True)
    await (await ck.save(0, {"w": array})).wait()
    saved = [array.copy()]
    for step in range(1, 5):
        changed = scatter(array, rng, 20, 4000)  # 16 KB regions, over every chunk
        manifest = await (await ck.save(step, {"w": array})).wait()
        assert changed * 0.5 < manifest.new_bytes <= changed + 20 * 2 * GRANULE  # at most a granule each side
        saved.append(array.copy())
    for step, expected in enumerate(saved):  # every step reads back whole, through its tiling
        assert np.array_equal((await ck.load(step))["w"], expected)


async def test_without_the_mirror_a_changed_chunk_is_written_whole(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(0)
    array = rng.standard_normal(4 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck")
    await (await ck.save(0, {"w": array})).wait()
    array[:: CHUNK // 4] += 1.0  # one float in each chunk
    assert (await (await ck.save(1, {"w": array})).wait()).new_bytes == 4 * CHUNK


async def test_a_patched_chunk_has_at_most_max_extents_refs(client: blobsdk.Client) -> None:
    array = np.zeros(CHUNK // 4, dtype=np.float32) + 1.0
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"w": array})).wait()
    array[:: 2 * GRANULE // 4] += 1.0  # a change in every other granule: far more runs than the cap
    manifest = await (await ck.save(1, {"w": array})).wait()
    plan = await client.plan("/bkt/ck/000000000001/data")
    assert len(plan.chunks) <= MAX_EXTENTS
    assert manifest.entries[0].extents == (len(plan.chunks),)
    assert np.array_equal((await ck.load())["w"], array)


async def test_zipf_rows_of_a_table_write_about_the_rows_changed(client: blobsdk.Client) -> None:
    """Check-N-Run's case, small: 1% of 512-byte rows change per save, by a Zipf law over
    their popularity, the hot rows spread over the table as hashed ids are."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((8192, 128), dtype=np.float32)  # 4 MiB, 16 chunks
    popularity = rng.permutation(np.arange(1, len(table) + 1, dtype=np.float64) ** -1.05)
    ck = client.checkpoints("/bkt/emb", keep=3, mirror=True)
    await (await ck.save(0, {"table": table})).wait()
    for step in range(1, 4):
        rows = rng.choice(len(table), size=len(table) // 100, replace=False, p=popularity / popularity.sum())
        table[rows] += 1.0
        manifest = await (await ck.save(step, {"table": table})).wait()
        assert manifest.new_bytes <= 1.2 * len(rows) * 512
    assert np.array_equal((await ck.load())["table"], table)


async def test_retention_and_gc_keep_the_old_blocks_a_tiling_names(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(2)
    array = rng.standard_normal(4 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", keep=1, mirror=True)
    for step in range(4):
        if step:
            scatter(array, rng, 4, 100)
        await (await ck.save(step, {"w": array})).wait()
    state = client._open
    report = await gc_module.collect(state.metadata, state.blocks, 0.3, 0.2, clock=lambda: time.time() + 3600)
    assert report.blocks_deleted > 0  # the retired steps' manifests went, the first step's data did not
    assert np.array_equal((await ck.load())["w"], array)


async def test_a_mirror_that_does_not_hold_the_base_is_not_trusted(client: blobsdk.Client) -> None:
    """Another writer saves in between: the mirror holds this writer's last bytes, not the
    base's, so every changed chunk is written whole, and the restore is exact."""
    rng = np.random.default_rng(3)
    mine = rng.standard_normal(2 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"w": mine})).wait()
    other = mine.copy()
    other[:10] = 7.0
    await (await client.checkpoints("/bkt/ck").save(1, {"w": other})).wait()
    mine[5] = 3.0  # differs from the base (other) in its first chunk's first 10 floats
    manifest = await (await ck.save(2, {"w": mine})).wait()
    assert manifest.new_bytes == CHUNK
    assert np.array_equal((await ck.load())["w"], mine)


async def test_a_failed_save_leaves_no_trusted_mirror(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(4)
    array = rng.standard_normal(CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"w": array})).wait()
    array[0] = 1.0
    await (await ck.save(1, {"w": array})).wait()
    array[1] = 2.0
    with pytest.raises(blobsdk.PreconditionFailed):
        await (await ck.save(1, {"w": array})).wait()  # step 1 exists: nothing committed, the mirror moved on
    array[2] = 3.0
    manifest = await (await ck.save(2, {"w": array})).wait()
    assert manifest.new_bytes == CHUNK  # the mirror held step "1bis", not the base: written whole
    assert np.array_equal((await ck.load())["w"], array)


async def test_a_compressed_chunk_is_written_whole_or_named_whole(tmp_path: Path) -> None:
    write = WriteConfig(chunk_size=CHUNK, block_size=4 << 20, compression="lz4")
    async with blobsdk.Client.local(tmp_path, write=write) as c:
        array = np.zeros(2 * CHUNK // 4, dtype=np.float32)  # compresses
        ck = c.checkpoints("/bkt/ck", mirror=True)
        await (await ck.save(0, {"w": array})).wait()
        array[CHUNK // 4 + 3] = 1.0  # the second chunk only
        await (await ck.save(1, {"w": array})).wait()
        plan = await c.plan("/bkt/ck/000000000001/data")
        assert all(ref.codec == "lz4" or ref.raw_length == CHUNK for ref in plan.chunks)
        assert np.array_equal((await ck.load())["w"], array)


async def test_a_selective_and_an_in_place_load_read_tilings(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(5)
    state = {"a": rng.standard_normal(3 * CHUNK // 4, dtype=np.float32), "b": rng.standard_normal(1000, dtype=np.float32)}
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, state)).wait()
    state["a"][100:200] = 0.0
    state["a"][CHUNK // 4 + 50] = 1.0
    await (await ck.save(1, state)).wait()
    only = await ck.load(select=lambda name: name == ("a",))
    assert list(only) == ["a"] and np.array_equal(only["a"], state["a"])
    into = {"a": np.zeros_like(state["a"]), "b": np.zeros_like(state["b"])}
    await ck.load(into=into)
    assert np.array_equal(into["a"], state["a"]) and np.array_equal(into["b"], state["b"])


async def test_a_chunk_that_becomes_a_copy_of_a_patched_one_restores_exactly(client: blobsdk.Client) -> None:
    """Patched chunks are hashed after the stall, so a repeat of one is not found: b is
    compared with its own mirror copy and written (whole: every granule changed)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal(CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"a": a, "b": rng.standard_normal(CHUNK // 4, dtype=np.float32)})).wait()
    a[7] = 0.5
    manifest = await (await ck.save(1, {"a": a, "b": a.copy()})).wait()  # b: the same bytes as patched a
    assert manifest.entries[0].new_bytes == GRANULE and manifest.entries[1].new_bytes == CHUNK
    loaded = await ck.load()
    assert np.array_equal(loaded["a"], a) and np.array_equal(loaded["b"], a)


@pytest.mark.parametrize("max_extents", [0, 1.5, True, CHUNK + 1])
async def test_a_bad_max_extents_is_refused(client: blobsdk.Client, max_extents: Any) -> None:
    with pytest.raises(ValueError) as exc:
        client.checkpoints("/bkt/ck", mirror=True, max_extents=max_extents)
    assert str(exc.value) == f"max_extents must be an int from 1 to {CHUNK}, got {max_extents!r}"


async def test_a_higher_max_extents_writes_fewer_bytes_for_wide_scatter(client: blobsdk.Client) -> None:
    written = []
    for cap in (8, 128):
        array = np.zeros(CHUNK // 4, dtype=np.float32) + 1.0
        ck = client.checkpoints(f"/bkt/cap{cap}", mirror=True, max_extents=cap, dedup=False)
        await (await ck.save(0, {"w": array})).wait()
        array[:: CHUNK // 4 // 40] += 1.0  # 40 changes spread over the chunk: 81 spans uncapped
        written.append((await (await ck.save(1, {"w": array})).wait()).new_bytes)
        assert len((await client.plan(f"/bkt/cap{cap}/000000000001/data")).chunks) <= cap
    assert written[1] < written[0] / 4


async def test_with_the_mirror_a_save_compares_instead_of_hashing(client: blobsdk.Client) -> None:
    """During the stall a mirrored chunk is compared, not hashed; a patched chunk's digest is
    made in the background, and the next save patches against it."""
    array = np.random.default_rng(7).standard_normal(4 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"w": array})).wait()
    assert ck.hashed_bytes == 4 * CHUNK  # the first save hashes everything
    for step in (1, 2):
        array[step] += 1.0
        manifest = await (await ck.save(step, {"w": array})).wait()
        assert manifest.new_bytes == GRANULE
    assert ck.hashed_bytes == 4 * CHUNK
    assert manifest.entries[0].digests[0] == xxhash.xxh3_128_digest(array[: CHUNK // 4].tobytes())
