"""The disk cache (L2, the L3 node) on a directory it shares: with other processes' writers
(a live writer's temp file is never swept, a dead one's is), with symlinks (never followed
out of the root, by the cache nor by the L2 tier over it) and with other builds (the FORMAT
marker)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import xxhash

from blobsdk.cache import DiskCache
from blobsdk.errors import IncompatibleFormat, Unavailable
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.testing.cache import blob
from blobsdk.tiers import L2Tier
from blobsdk.wire import ChunkRef
from tests.helpers import stored_files
from tests.writer_process import FIRST, SECOND, WriterProcess

HOUR = 3600.0
NOTE = "(nothing is followed out of the root)"
SHARD = "ab"


def key_in(shard: str, n: int) -> str:
    return f"{shard}{n:030x}"


def l2(root: Path, capacity: int = 1 << 20) -> DiskCache:
    return DiskCache(root, capacity_bytes=capacity, min_free_ratio=0, name="l2")


def age(path: Path, seconds: float) -> None:
    st = path.stat(follow_symlinks=False)
    os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds), follow_symlinks=False)


def contents(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "blobsdk.cache.disk"]


async def cache_file(tmp_path: Path, key: str, data: bytes) -> bytes:
    """The bytes of a valid cache file of ``key``, made by a cache elsewhere."""
    async with l2(tmp_path / "maker") as maker:
        assert await maker.put(key, data)
    return (tmp_path / "maker" / key[:2] / key).read_bytes()


class Outside:
    """An L2 root whose shard ``ab`` is a symlink to a directory outside it, which holds a
    temp file, a dead writer's old temp file, a damaged entry and a valid entry of that shard."""

    def __init__(self, tmp_path: Path, valid: bytes) -> None:
        self.root, self.dir = tmp_path / "l2", tmp_path / "outside"
        self.dir.mkdir()
        files = {
            "x.tmp": b"not yours",
            f"{key_in(SHARD, 1)}.dead0000-0123abcd.tmp": b"not yours",
            key_in(SHARD, 2): b"not a cache file",
            key_in(SHARD, 3): valid,
        }
        for name, data in files.items():
            (self.dir / name).write_bytes(data)
            age(self.dir / name, HOUR)
        self.root.mkdir()
        (self.root / SHARD).symlink_to(self.dir)
        self.before = snapshot(self.dir)
        self.warning = f"cache l2: ignored {self.root / SHARD}: it is a symlink, not a directory {NOTE}"

    def untouched(self) -> bool:
        return snapshot(self.dir) == self.before


@pytest.fixture
async def outside(tmp_path: Path) -> Outside:
    return Outside(tmp_path, await cache_file(tmp_path, key_in(SHARD, 3), blob(3)))


# --- temp files of live and dead writers (issue 20 item 3) -----------------------------------


async def test_a_live_writer_in_another_process_keeps_its_temp_file_however_old(tmp_path: Path) -> None:
    root, key = tmp_path / "l2", key_in(SHARD, 1)
    async with WriterProcess("cache", root, key) as writer:
        (temp,) = root.rglob("*.tmp")
        age(temp, HOUR)  # stalled for an hour, past any grace a clock could give: still alive
        async with l2(root):  # another process opens the cache: a sweep
            assert temp.exists()
        assert await writer.finish() == "committed"
    async with l2(root) as cache:
        assert await cache.get(key) == FIRST + SECOND
    assert not list(root.rglob("*.tmp"))


async def test_the_temp_file_of_a_killed_writer_is_swept_at_the_next_open(tmp_path: Path) -> None:
    root = tmp_path / "l2"
    async with WriterProcess("cache", root, key_in(SHARD, 1)) as writer:
        (temp,) = root.rglob("*.tmp")
        writer.kill()  # SIGKILL mid-fill, a moment ago: no clock says it is dead, its lock does
        assert temp.exists()
        async with l2(root) as cache:
            assert not temp.exists() and cache.stats()["entries"] == 0


# --- symlinks never lead out of the root (issue 20 item 4) ----------------------------------


async def test_opening_never_follows_a_symlinked_shard(outside: Outside, caplog: pytest.LogCaptureFixture) -> None:
    async with l2(outside.root) as cache:
        assert cache.stats()["entries"] == 0 and cache.stats()["corrupt"] == 0
        assert await cache.get(key_in(SHARD, 3)) is None
    assert outside.untouched()
    assert messages(caplog) == [outside.warning]


async def test_fills_and_deletes_through_a_symlinked_shard_touch_nothing(
    outside: Outside, caplog: pytest.LogCaptureFixture
) -> None:
    async with l2(outside.root) as cache:
        assert await cache.put(key_in(SHARD, 4), blob(4)) is False
        assert await cache.delete(key_in(SHARD, 2)) is False
        assert await cache.delete(key_in(SHARD, 3)) is False
        assert cache.stats()["errors"] == 3
    assert outside.untouched()
    assert messages(caplog) == [outside.warning]  # once per entry


async def test_a_shard_swapped_for_a_symlink_after_open_is_never_read_evicted_or_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, moved = tmp_path / "l2", tmp_path / "moved"
    async with l2(root, capacity=200) as cache:
        assert await cache.put(key_in(SHARD, 1), blob(1))
        assert await cache.put(key_in(SHARD, 2), blob(2))
        (root / SHARD).rename(moved)
        (root / SHARD).symlink_to(moved)
        before = snapshot(moved)
        assert await cache.put(key_in("cd", 3), blob(3))  # evicts key 1: its file is not ours now
        assert not cache.contains(key_in(SHARD, 1))
        assert await cache.get(key_in(SHARD, 2)) is None  # indexed, but never read through the link
        assert await cache.delete(key_in(SHARD, 1)) is False
        assert await cache.delete(key_in(SHARD, 2)) is False
    assert snapshot(moved) == before
    assert messages(caplog) == [f"cache l2: ignored {root / SHARD}: it is a symlink, not a directory {NOTE}"]


async def test_a_symlinked_entry_is_never_indexed_nor_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = key_in("cd", 1)
    target = tmp_path / "elsewhere"
    target.write_bytes(await cache_file(tmp_path, key, blob(1)))
    root = tmp_path / "l2"
    (root / "cd").mkdir(parents=True)
    (root / "cd" / key).symlink_to(target)
    async with l2(root) as cache:
        assert cache.stats()["entries"] == 0 and await cache.get(key) is None
        assert await cache.put(key, blob(2))  # replaces the link itself, never writes through it
        assert await cache.get(key) == blob(2)
    assert target.read_bytes() == await cache_file(tmp_path, key, blob(1))
    assert messages(caplog) == [f"cache l2: ignored {root / 'cd' / key}: it is a symlink, not a regular file {NOTE}"]


def chunk_in(shard: str) -> tuple[ChunkRef, bytes]:
    raw = b"chunk bytes"
    while True:
        ref = ChunkRef(block_id=new_block_id(), offset=0, length=11, raw_length=11, checksum=xxhash.xxh3_64_intdigest(raw))
        if ref.key.startswith(shard):
            return ref, raw


async def test_the_l2_tier_never_fills_nor_reads_through_a_symlinked_shard(
    outside: Outside, caplog: pytest.LogCaptureFixture
) -> None:
    ref, raw = chunk_in(SHARD)

    async def never(ref: ChunkRef, raw: memoryview) -> memoryview:
        raise AssertionError("L2 never decodes")

    async with L2Tier(l2(outside.root)) as tier:
        await tier.fill(ref, memoryview(raw))
        await tier.flush()
        await tier.keep(ref, memoryview(raw))  # a prefetch writes past the queue: refused alike
        assert await tier.fetch(ref, never) is None  # looking for another process's file: refused too
        assert not tier.holds(ref)
        assert tier.fills_dropped == 2 and tier.fill_failures == 0 and tier.cache.stats()["errors"] == 3
    assert outside.untouched()
    assert messages(caplog) == [outside.warning]


# --- the FORMAT marker (issue 20 item 10) ------------------------------------------------------


async def test_a_new_cache_is_marked_format_1(tmp_path: Path) -> None:
    async with l2(tmp_path / "l2"):
        pass
    assert (tmp_path / "l2" / "FORMAT").read_text() == "blobsdk disk-cache format 1\n"


async def test_a_cache_written_before_markers_keeps_its_entries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "blobsdk.cache.disk")
    root = tmp_path / "l2"
    async with l2(root) as cache:
        assert await cache.put(key_in(SHARD, 1), blob(1))
    (root / "FORMAT").unlink()  # as every build before markers left it
    async with l2(root) as cache:
        assert await cache.get(key_in(SHARD, 1)) == blob(1)
    assert (root / "FORMAT").read_text() == "blobsdk disk-cache format 1\n"
    assert messages(caplog) == [
        f"cache l2: {root} has no FORMAT (written before markers): marked as format 1, its entries checked by their headers"
    ]


@pytest.mark.parametrize("version", [2, 0])
async def test_another_version_is_discarded_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    root = tmp_path / "l2"
    async with l2(root) as cache:
        for n in (1, 2):
            assert await cache.put(key_in(SHARD, n), blob(n))
    (root / SHARD / "a-newer-name").write_bytes(b"an entry of that format")
    (root / "notes.txt").write_bytes(b"not an entry")  # not in a shard: not the cache's to remove
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / key_in("cd", 1)).write_bytes(b"not yours")
    (root / "cd").symlink_to(tmp_path / "outside")
    (root / "FORMAT").write_text(f"blobsdk disk-cache format {version}\n")
    async with l2(root) as cache:
        assert await cache.get(key_in(SHARD, 1)) is None and cache.stats()["entries"] == 0
    assert (root / "FORMAT").read_text() == "blobsdk disk-cache format 1\n"
    assert stored_files(root) == [root / "notes.txt"]
    assert (tmp_path / "outside" / key_in("cd", 1)).read_bytes() == b"not yours"
    assert messages(caplog) == [
        f"cache l2: ignored {root / 'cd'}: it is a symlink, not a directory {NOTE}",
        f"cache l2: {root} is in format {version}, this build uses format 1: discarded its 3 files",
    ]


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        (
            "blobsdk block-store format 1\n",
            "{root}/FORMAT says {root} holds a blobsdk block-store, not a disk-cache: refusing to open it",
        ),
        ("hello\n", "{root}/FORMAT is not a blobsdk format marker: refusing to open {root} as a disk-cache"),
    ],
)
async def test_another_kind_of_directory_is_refused_and_left_as_it_is(tmp_path: Path, marker: str, why: str) -> None:
    root = tmp_path / "l2"
    async with l2(root) as cache:
        assert await cache.put(key_in(SHARD, 1), blob(1))
    (root / SHARD / "junk").write_bytes(b"kept")
    (root / "FORMAT").write_text(marker)
    before = contents(root)
    with pytest.raises(IncompatibleFormat) as refusal:
        async with l2(root):
            pass
    assert str(refusal.value) == "cache l2: " + why.format(root=root)
    assert contents(root) == before


async def test_a_cache_pointed_at_a_block_store_never_deletes_its_blocks(tmp_path: Path) -> None:
    root = tmp_path / "blocks"
    async with LocalBlockStore(root) as store:
        for _ in range(20):  # some land in shards their names start with: the cache would judge those
            await store.write_block(new_block_id(), [b"durable bytes"])
    before = {p: p.read_bytes() for p in stored_files(root)}
    with pytest.raises(IncompatibleFormat, match="holds a blobsdk block-store, not a disk-cache"):
        async with l2(root):
            pass
    assert {p: p.read_bytes() for p in stored_files(root)} == before


async def test_a_symlinked_format_marker_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "l2"
    root.mkdir()
    (tmp_path / "elsewhere").write_text("blobsdk disk-cache format 1\n")
    (root / "FORMAT").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Unavailable) as refusal:
        async with l2(root):
            pass
    assert (
        str(refusal.value)
        == f"cache l2 cannot open {root}: refused {root / 'FORMAT'}: it is a symlink, not a regular file {NOTE}"
    )
