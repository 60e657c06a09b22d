from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import xxhash

from blobsdk.errors import BlockNotFound, ClientClosed, PreconditionFailed
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.testing.sources import BlockReplicaTests, listed, payload


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LocalBlockStore]:
    async with LocalBlockStore(tmp_path / "blocks") as s:
        yield s


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def leftover_temp(root: Path, block_id: str, age_s: float) -> Path:
    """A temp file as a writer killed mid-write leaves it."""
    shard = root / xxhash.xxh3_64_hexdigest(block_id.encode())[:2]
    shard.mkdir(parents=True, exist_ok=True)
    temp = shard / f"{block_id}.deadbeef-0123456789ab.tmp"
    temp.write_bytes(b"half a block")
    then = time.time() - age_s
    os.utime(temp, (then, then))
    return temp


class TestLocalBlockStore(BlockReplicaTests):
    pass


async def test_layout_is_hashed_shard_then_block_id(store: LocalBlockStore) -> None:
    block = new_block_id()
    await store.write_block(block, [b"abc"])
    expected = store.root / xxhash.xxh3_64_hexdigest(block.encode())[:2] / block
    assert files_under(store.root) == sorted([store.root / "FORMAT", expected]) and store.block_path(block) == expected
    assert expected.read_bytes() == b"abc"


async def test_nothing_is_ever_written_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "root"
    async with LocalBlockStore(root) as s:
        await asyncio.gather(*(s.write_block(new_block_id(), [payload(100, i)]) for i in range(10)))
        async with s.block_writer(new_block_id()) as writer:
            await writer.write([b"streamed"])
            await writer.commit()
        await s.delete_block(new_block_id())
    assert files_under(tmp_path) == files_under(root)
    assert len(files_under(root)) == 12  # and FORMAT


async def test_stale_temp_files_are_swept_at_open(tmp_path: Path) -> None:
    root = tmp_path / "blocks"
    stale = [leftover_temp(root, new_block_id(), age_s=60) for _ in range(3)]
    async with LocalBlockStore(root) as s:
        assert not any(t.exists() for t in stale)
        assert await listed(s) == []


async def test_a_crashed_write_never_shows_as_a_block(store: LocalBlockStore) -> None:
    block = new_block_id()
    leftover_temp(store.root, block, age_s=0)  # appeared after the sweep: a writer that died
    assert await listed(store) == []
    with pytest.raises(BlockNotFound):
        await store.read_range(block, 0, 1)
    await store.write_block(block, [b"whole block"])  # the id is still usable
    assert await store.read_range(block, 0, 11) == b"whole block"


class DiskEvents:
    """Records, in order, every fsync (of which inode) and every os.replace (of which
    inode, once renamed): enough to tell what a power cut right after the ack would keep."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, int, int]] = []
        self._fsync, self._replace = os.fsync, os.replace
        monkeypatch.setattr(os, "fsync", self.fsync)
        monkeypatch.setattr(os, "replace", self.replace)

    def fsync(self, fd: int) -> None:
        st = os.fstat(fd)
        self.events.append(("fsync", st.st_dev, st.st_ino))
        self._fsync(fd)

    def replace(self, src: str | os.PathLike[str], dst: str | os.PathLike[str], **dir_fds: int) -> None:
        self._replace(src, dst, **dir_fds)
        st = os.stat(dst, dir_fd=dir_fds.get("dst_dir_fd"))
        self.events.append(("replace", st.st_dev, st.st_ino))

    def assert_durable(self, block: Path) -> None:
        """The block's bytes were fsynced before its rename, and its directory after it:
        every step a crash could undo happened before the write was acknowledged."""
        f, d = block.stat(), block.parent.stat()
        written = self.events.index(("fsync", f.st_dev, f.st_ino))
        renamed = self.events.index(("replace", f.st_dev, f.st_ino))
        dir_synced = [i for i, event in enumerate(self.events) if event == ("fsync", d.st_dev, d.st_ino)]
        assert written < renamed < max(dir_synced, default=-1), self.events


async def test_an_acknowledged_write_block_was_made_durable(store: LocalBlockStore, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskEvents(monkeypatch)
    block = new_block_id()
    await store.write_block(block, [b"durable ", b"bytes"])
    disk.assert_durable(store.block_path(block))


async def test_an_acknowledged_streamed_block_was_made_durable(store: LocalBlockStore, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskEvents(monkeypatch)
    block = new_block_id()
    async with store.block_writer(block) as writer:
        await writer.write([b"streamed "])
        await writer.write([b"bytes"])
        await writer.commit()
    disk.assert_durable(store.block_path(block))
    assert await store.read_range(block, 0, 14) == b"streamed bytes"


async def test_rewrite_with_another_size_is_refused(store: LocalBlockStore) -> None:
    block = new_block_id()
    await store.write_block(block, [b"abc"])
    with pytest.raises(PreconditionFailed):
        await store.write_block(block, [b"abcd"])
    assert await store.read_range(block, 0, 3) == b"abc"


async def test_block_writer_streams_then_commits(store: LocalBlockStore) -> None:
    block = new_block_id()
    async with store.block_writer(block) as writer:
        await writer.write([b"ab", b"cd"])
        await writer.write([memoryview(b"ef")])
        assert await listed(store) == []  # invisible until committed
        await writer.commit()
    assert writer.size == 6
    assert await store.read_range(block, 0, 6) == b"abcdef"


async def test_block_writer_without_commit_leaves_nothing(store: LocalBlockStore) -> None:
    with pytest.raises(RuntimeError, match="client went away"):  # noqa: PT012 - raised inside the writer's block
        async with store.block_writer(new_block_id()) as writer:
            await writer.write([b"partial"])
            raise RuntimeError("client went away")
    async with store.block_writer(new_block_id()) as writer:
        await writer.write([b"never committed"])
    await store.aclose()  # waits for the queued discards
    assert files_under(store.root) == [store.root / "FORMAT"]


async def test_cancelled_block_writer_leaves_nothing(store: LocalBlockStore) -> None:
    started = asyncio.Event()

    async def write_forever() -> None:
        async with store.block_writer(new_block_id()) as writer:
            while True:
                await writer.write([payload(1 << 16)])
                started.set()

    task = asyncio.create_task(write_forever())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.aclose()
    assert files_under(store.root) == [store.root / "FORMAT"]


async def test_read_clipped_reads_what_lies_inside_and_the_size(store: LocalBlockStore) -> None:
    block, empty = new_block_id(), new_block_id()
    await store.write_block(block, [b"12345"])
    await store.write_block(empty, [])
    assert await store.read_clipped(block, 1, 3) == (b"234", 5)
    assert await store.read_clipped(block, 3, 10) == (b"45", 5)  # clipped at the end
    for offset in (5, 6, 10**19):  # past the end, even past what pread takes: nothing read
        assert await store.read_clipped(block, offset, 1) == (b"", 5)
    assert await store.read_clipped(empty, 0, 1 << 20) == (b"", 0)
    with pytest.raises(BlockNotFound):
        await store.read_clipped(new_block_id(), 0, 1)
    with pytest.raises(ValueError):
        await store.read_clipped(block, -1, 1)


async def test_list_page(store: LocalBlockStore) -> None:
    blocks = sorted(new_block_id() for _ in range(5))
    for b in blocks:
        await store.write_block(b, [b"x"])
    first, after = await store.list_page(None, 2)
    assert [i.block_id for i in first] == blocks[:2] and after == blocks[1]
    last, end = await store.list_page(blocks[3], 2)
    assert [i.block_id for i in last] == blocks[4:] and end is None


async def test_use_after_close_is_client_closed(tmp_path: Path) -> None:
    s = LocalBlockStore(tmp_path)
    await s.aclose()
    await s.aclose()  # idempotent
    with pytest.raises(ClientClosed):
        await s.write_block(new_block_id(), [b"x"])
    with pytest.raises(ClientClosed):
        await s.read_range(new_block_id(), 0, 1)


async def test_a_cancelled_read_into_ends_only_once_its_thread_wrote_its_last_byte(
    store: LocalBlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BlockReplica's contract: a cancelled read_into raises only once nothing writes into its
    buffer.  The store's thread is held inside the read; the cancelled call waits for it (a
    caller that had returned would find its buffer written after)."""
    import threading

    from blobsdk.sources import _local

    block = new_block_id()
    await store.write_block(block, [b"x" * 64])
    inside, release, wrote = threading.Event(), threading.Event(), threading.Event()
    real = _local.read_into_sync

    def held(*args: object) -> None:
        inside.set()
        release.wait()
        real(*args)  # type: ignore[arg-type]
        wrote.set()

    monkeypatch.setattr(_local, "read_into_sync", held)
    out = bytearray(64)
    read = asyncio.create_task(store.read_into(block, 0, memoryview(out)))
    try:
        await asyncio.to_thread(inside.wait, 60)
        read.cancel()
        for _ in range(20):  # the loop turns; the cancelled read is still waiting for its thread
            await asyncio.sleep(0)
        assert not read.done()
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert wrote.is_set() and out == b"x" * 64
