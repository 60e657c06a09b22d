"""``checkpoints(prefix, mirror=True)`` (blobsdk/write/stage.py, blobsdk/write/patch.py): a
changed chunk whose previous bytes the mirror holds writes only a patch of its changed runs,
appended to its base's refs, until its patches would pass the budget (``rewrite_at``,
MAX_PATCHES): then it is written whole.  Every restore stays exact, gc keeps the bases the
patches need, and a mirror that no longer matches the base is never trusted."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.errors import CorruptData
from blobsdk.wire import ChunkRef, ReadPlan
from blobsdk.write import patch
from blobsdk.write.manifest import Entry, Manifest
from blobsdk.write.restore import restore
from blobsdk.write.stage import GRANULE, MAX_PATCHES
from tests.helpers import gc_ahead

CHUNK = 256 << 10
WRITE = WriteConfig(chunk_size=CHUNK, block_size=4 << 20, compression="none")  # gc runs on a clock an hour ahead


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
        runs = 20 + 16  # a region, maybe cut in two by a chunk's end
        overhead = 20 * 2 * GRANULE + 16 * 12 + runs * 8  # a granule each side; the records' headers and run tables
        assert changed * 0.5 < manifest.new_bytes <= changed + overhead
        saved.append(array.copy())
    for step, expected in enumerate(saved):  # every step reads back whole, through its patches
        assert np.array_equal((await ck.load(step))["w"], expected)


async def test_without_the_mirror_a_changed_chunk_is_written_whole(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(0)
    array = rng.standard_normal(4 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck")
    await (await ck.save(0, {"w": array})).wait()
    array[:: CHUNK // 4] += 1.0  # one float in each chunk
    assert (await (await ck.save(1, {"w": array})).wait()).new_bytes == 4 * CHUNK


async def test_a_chunk_is_its_base_and_its_patches_until_it_is_written_whole(client: blobsdk.Client) -> None:
    """Each save appends one patch to the chunk's refs; the save whose patches would pass
    ``rewrite_at`` of the chunk writes it whole, and the next patches start from that."""
    array = np.zeros(CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", keep=20, mirror=True, rewrite_at=0.25, dedup=False)
    first = await (await ck.save(0, {"w": array})).wait()
    assert first.new_bytes == CHUNK
    one = patch.record_size([(0, CHUNK // 16)])  # each save below changes 1/16 of the chunk
    shapes = []
    for step in range(1, 7):
        array[: CHUNK // 64] += 1.0
        manifest = await (await ck.save(step, {"w": array})).wait()
        shapes.append((manifest.new_bytes, manifest.entries[0].extents, manifest.entries[0].patches))
        assert np.array_equal((await ck.load(step))["w"], array)
    budget = int(0.25 * CHUNK) // one  # patches that fit: 3
    assert budget == 3
    assert shapes == [
        (one, (2,), (1,)),
        (one, (3,), (2,)),
        (one, (4,), (3,)),
        (CHUNK, (), ()),  # a 4th would pass the budget: written whole
        (one, (2,), (1,)),
        (one, (3,), (2,)),
    ]


async def test_a_chunk_is_written_whole_after_max_patches(client: blobsdk.Client) -> None:
    array = np.zeros(CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", keep=2, mirror=True, rewrite_at=100.0, dedup=False)
    await (await ck.save(0, {"w": array})).wait()
    for step in range(1, MAX_PATCHES + 2):
        array[0] += 1.0
        manifest = await (await ck.save(step, {"w": array})).wait()
        assert manifest.entries[0].patches == ((step,) if step <= MAX_PATCHES else ())
    assert manifest.new_bytes == CHUNK
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


async def test_retention_and_gc_keep_the_bases_and_patches_a_kept_checkpoint_names(client: blobsdk.Client) -> None:
    rng = np.random.default_rng(2)
    array = rng.standard_normal(4 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", keep=1, mirror=True)
    for step in range(4):
        if step:
            scatter(array, rng, 4, 100)
        await (await ck.save(step, {"w": array})).wait()
    report = await gc_ahead(client)
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


async def test_a_compressed_chunk_is_patched_like_a_plain_one(tmp_path: Path) -> None:
    write = WriteConfig(chunk_size=CHUNK, block_size=4 << 20, compression="lz4")
    async with blobsdk.Client.local(tmp_path, write=write) as c:
        array = np.repeat(np.arange(2, dtype=np.float32), CHUNK // 4)  # two chunks that compress, and differ
        ck = c.checkpoints("/bkt/ck", mirror=True)
        await (await ck.save(0, {"w": array})).wait()
        array[CHUNK // 4 + 3] = 5.0  # the second chunk only
        manifest = await (await ck.save(1, {"w": array})).wait()
        assert manifest.entries[0].patches == (0, 1)
        plan = await c.plan("/bkt/ck/000000000001/data")
        assert [ref.codec for ref in plan.chunks[:2]] == ["lz4", "lz4"]  # the bases, as step 0 stored them
        assert np.array_equal((await ck.load())["w"], array)


async def test_a_selective_and_an_in_place_load_apply_patches(client: blobsdk.Client) -> None:
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
    compared with its own mirror copy and written (whole: every granule changed, over the
    budget)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal(CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"a": a, "b": rng.standard_normal(CHUNK // 4, dtype=np.float32)})).wait()
    a[7] = 0.5
    manifest = await (await ck.save(1, {"a": a, "b": a.copy()})).wait()  # b: the same bytes as patched a
    assert manifest.entries[0].new_bytes == patch.record_size([(0, GRANULE)]) and manifest.entries[1].new_bytes == CHUNK
    loaded = await ck.load()
    assert np.array_equal(loaded["a"], a) and np.array_equal(loaded["b"], a)


@pytest.mark.parametrize("rewrite_at", [0, -1.0, float("nan"), float("inf"), True, "0.5", None])
async def test_a_bad_rewrite_at_is_refused(client: blobsdk.Client, rewrite_at: Any) -> None:
    error = ValueError if isinstance(rewrite_at, int | float) else TypeError  # a number out of range, or not a number
    with pytest.raises(error) as exc:
        client.checkpoints("/bkt/ck", mirror=True, rewrite_at=rewrite_at)
    shown = f"got {rewrite_at!r}" if error is ValueError else f"not {type(rewrite_at).__name__}"
    assert type(exc.value) is error and str(exc.value) == f"rewrite_at must be a number > 0 (a share of a chunk), {shown}"


async def test_a_patched_chunk_is_not_recorded_in_the_chunk_index(client: blobsdk.Client) -> None:
    """The index maps a digest to refs holding the chunk's bytes back to back: a base and its
    patches are not that, so another prefix writes that chunk whole (and then indexes it)."""
    array = np.random.default_rng(8).standard_normal(2 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/a", mirror=True)
    await (await ck.save(0, {"w": array})).wait()
    array[3] += 1.0  # the first chunk: patched; the second: unchanged, indexed by step 0
    await (await ck.save(1, {"w": array})).wait()
    other = await (await client.checkpoints("/bkt/b").save(0, {"w": array})).wait()
    assert other.new_bytes == CHUNK  # the first chunk written whole, the second found
    assert np.array_equal((await client.checkpoints("/bkt/b").load())["w"], array)


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
        assert manifest.new_bytes == patch.record_size([(0, GRANULE)])
    assert ck.hashed_bytes == 4 * CHUNK
    assert manifest.entries[0].digests[0] == xxhash.xxh3_128_digest(array[: CHUNK // 4].tobytes())


def _ref(n: int, block: str = "b", offset: int = 0) -> ChunkRef:
    return ChunkRef(block_id=block, offset=offset, length=n, raw_length=n, checksum=0)


@pytest.mark.parametrize(
    ("entry", "refs", "message"),
    [
        (
            Entry(name=("w",), kind="bytes", nbytes=8, digests=(b"d",), extents=(2,), patches=(1,)),
            [_ref(8)],
            "checkpoint 3: its manifest names 2 refs, its data plan holds 1",
        ),
        (
            Entry(name=("w",), kind="bytes", nbytes=8, first=1, digests=(b"d",), extents=(2,), patches=(1,)),
            [_ref(8), _ref(20)],
            "checkpoint 3: its manifest names 2 refs, its data plan holds 2",
        ),
        (
            Entry(name=("w",), kind="bytes", nbytes=8, digests=(b"d",), extents=(2,), patches=(1,)),
            [_ref(6), _ref(20)],
            "checkpoint 3 leaf 'w' chunk 0: its base refs do not hold its 8 bytes",
        ),
        (
            Entry(name=("w",), kind="bytes", nbytes=8, digests=(b"d",), extents=(2,), patches=(3,)),
            [_ref(8), _ref(20)],
            "checkpoint 3 leaf 'w' chunk 0: its base refs do not hold its 8 bytes",
        ),
        (
            Entry(name=("w",), kind="bytes", nbytes=16, digests=(b"d",), extents=(2,)),
            [_ref(8), _ref(8)],
            "checkpoint 3 leaf 'w': its manifest lists 1 digests for 2 chunks",  # the rest would go unchecked
        ),
    ],
)
async def test_a_manifest_that_does_not_match_its_plan_is_refused_before_anything_is_read(
    entry: Entry, refs: list[ChunkRef], message: str
) -> None:
    manifest = Manifest(step=3, created=0.0, chunk_size=8, entries=(entry,), new_bytes=0, reused_bytes=0)
    plan = ReadPlan(path="/b/x", version=1, etag="", size=sum(r.raw_length for r in refs), chunk_size=8, chunks=tuple(refs))
    reads: list[ReadPlan] = []

    async def read(part: ReadPlan, outs: list[memoryview]) -> None:
        reads.append(part)

    with ThreadPoolExecutor(1) as executor, pytest.raises(CorruptData) as exc:
        await restore(manifest, plan, {}, read, executor=executor, where="checkpoint 3 under /b/ck")
    assert str(exc.value) == message
    assert reads == []


async def test_patches_are_read_in_the_order_they_are_stored_and_applied_in_the_order_saved() -> None:
    """Bases first, in plan order; then the patch records sorted by block and offset (one
    save's records lie back to back), each chunk's applied oldest first."""
    old = bytes(range(8))
    first = patch.encode(b"AB" + old[2:], [(0, 2)])
    second = patch.encode(b"xyz" + old[3:], [(0, 3)])  # overwrites what the first wrote
    stored = {("z1", 0): first, ("a2", 0): second, ("base", 0): old}  # the later save's block sorts first
    digest = xxhash.xxh3_128_digest(b"xyz" + old[3:])  # of the chunk once patched
    entry = Entry(name=("w",), kind="bytes", nbytes=8, digests=(digest,), extents=(3,), patches=(2,))
    refs = (_ref(8, "base"), _ref(len(first), "z1"), _ref(len(second), "a2"))
    manifest = Manifest(step=1, created=0.0, chunk_size=8, entries=(entry,), new_bytes=0, reused_bytes=0)
    plan = ReadPlan(path="/b/x", version=1, etag="", size=sum(r.raw_length for r in refs), chunk_size=8, chunks=refs)
    reads: list[list[str]] = []

    async def read(part: ReadPlan, outs: list[memoryview]) -> None:
        reads.append([ref.block_id for ref in part.chunks])
        for ref, out in zip(part.chunks, outs, strict=True):
            out[:] = stored[(ref.block_id, ref.offset)]

    state: dict[str, Any] = {}
    with ThreadPoolExecutor(1) as executor:
        await restore(manifest, plan, state, read, executor=executor, where="checkpoint 1 under /b/ck")
    assert reads == [["base"], ["a2", "z1"]]
    assert bytes(state["w"]) == b"xyz" + old[3:]


async def test_a_corrupt_patch_record_fails_the_restore_with_corrupt_data(client: blobsdk.Client) -> None:
    array = np.random.default_rng(9).standard_normal(2 * CHUNK // 4, dtype=np.float32)
    ck = client.checkpoints("/bkt/ck", mirror=True)
    await (await ck.save(0, {"w": array})).wait()
    array[5] += 1.0
    await (await ck.save(1, {"w": array})).wait()
    plan = await client.plan("/bkt/ck/000000000001/data")
    record = plan.chunks[1]  # chunk 0: its base, then its patch
    assert record.raw_length == patch.record_size([(0, GRANULE)])
    _flip(client._open.blocks.block_path(record.block_id), record.offset + record.length - 1)
    with pytest.raises(CorruptData) as exc:
        await ck.load(into={"w": np.zeros_like(array)})
    assert str(exc.value).startswith(f"chunk {record.key}: no replica returned bytes matching its checksum")


def _flip(path: Path, offset: int) -> None:
    """Invert one byte of a file."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(data)
