"""The local block store on a directory it shares: with other processes' writers (a live
writer's temp file is never swept, a dead one's is), with symlinks (never followed out of
the root) and with other builds (the FORMAT marker)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import xxhash

import blobsdk
from blobsdk.errors import IncompatibleFormat, Unavailable
from blobsdk.runtime import rootdir as _rootdir
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.testing.sources import listed
from tests.helpers import stored_files
from tests.writer_process import FIRST, SECOND, WriterProcess

HOUR = 3600.0
NOTE = "(nothing is followed out of the root)"


def shard_of(block_id: str) -> str:
    return xxhash.xxh3_64_hexdigest(block_id.encode())[:2]


def block_in_shard(shard: str, *, minted_ms: int | None = None) -> str:
    """A block id (minted at ``minted_ms``, default now) whose shard is ``shard``."""
    while True:
        block_id = new_block_id() if minted_ms is None else f"{minted_ms:012x}{os.urandom(10).hex()}"
        if shard_of(block_id) == shard:
            return block_id


def temp_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.tmp"))


def age(path: Path, seconds: float) -> None:
    st = path.stat()
    os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def contents(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --- temp files of live and dead writers (issue 20 item 3) -----------------------------------


async def test_a_live_writer_in_another_process_keeps_its_temp_file_however_old(tmp_path: Path) -> None:
    root, block = tmp_path / "blocks", new_block_id()
    async with WriterProcess("store", root, block) as writer:
        (temp,) = temp_files(root)
        age(temp, HOUR)  # a writer stalled for an hour (SIGSTOP, a hung disk) is still alive
        async with LocalBlockStore(root) as store:  # another process opens the store: a sweep
            assert temp_files(root) == [temp]
            assert await writer.finish() == "committed"
            assert await store.read_range(block, 0, len(FIRST + SECOND)) == FIRST + SECOND
    assert temp_files(root) == []


async def test_the_temp_file_of_a_killed_writer_is_swept_at_the_next_open(tmp_path: Path) -> None:
    root = tmp_path / "blocks"
    async with WriterProcess("store", root, new_block_id()) as writer:
        (temp,) = temp_files(root)
        writer.kill()  # SIGKILL mid-write: the kernel drops its lock
        assert temp.exists()
        async with LocalBlockStore(root) as store:
            assert temp_files(root) == []
            assert await listed(store) == []


async def test_a_second_store_in_the_same_process_keeps_the_first_ones_temp_file(tmp_path: Path) -> None:
    root, block = tmp_path / "blocks", new_block_id()
    async with LocalBlockStore(root) as first:
        async with first.block_writer(block) as writer:
            await writer.write([FIRST])
            async with LocalBlockStore(root):
                assert len(temp_files(root)) == 1
            await writer.write([SECOND])
            await writer.commit()
        assert await first.read_range(block, 0, len(FIRST + SECOND)) == FIRST + SECOND


# --- symlinks never lead out of the root (issue 20 item 4) ----------------------------------


class Outside:
    """A store whose shard ``shard`` is a symlink to a directory outside its root, which
    holds a temp file, a dead writer's temp file and a block-named file of that shard."""

    def __init__(self, tmp_path: Path) -> None:
        self.root, self.dir = tmp_path / "blocks", tmp_path / "outside"
        self.dir.mkdir(parents=True)
        self.old_block = block_in_shard("ab", minted_ms=1_500_000_000_000)  # 2017: any gc takes it
        self.shard = shard_of(self.old_block)
        for name in ("x.tmp", f"{self.old_block}.deadbeef-0123456789ab.tmp", self.old_block):
            (self.dir / name).write_bytes(b"not yours")
            age(self.dir / name, HOUR)
        self.root.mkdir()
        (self.root / self.shard).symlink_to(self.dir)
        self.before = snapshot(self.dir)
        self.path = self.root / self.shard

    def untouched(self) -> bool:
        return snapshot(self.dir) == self.before


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside(tmp_path)


async def test_opening_and_listing_never_follow_a_symlinked_shard(outside: Outside, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "blobsdk.sources._local")
    async with LocalBlockStore(outside.root) as store:
        assert await listed(store) == []
        assert (await store.list_page(None, 10))[0] == []
    assert outside.untouched()
    message = f"block store {outside.root}: ignored {outside.path}: it is a symlink, not a directory {NOTE}"
    assert [r.getMessage() for r in caplog.records] == [message]  # once per entry, not per scan


async def test_writes_into_a_symlinked_shard_are_refused(outside: Outside) -> None:
    refused = f"block store {outside.root}: refused {outside.path}: it is a symlink, not a directory {NOTE}"
    async with LocalBlockStore(outside.root) as store:
        with pytest.raises(Unavailable) as put:
            await store.write_block(block_in_shard(outside.shard), [b"block"])
        assert str(put.value) == refused
        with pytest.raises(Unavailable) as streamed:
            async with store.block_writer(block_in_shard(outside.shard)):
                pass
        assert str(streamed.value) == refused
    assert outside.untouched()


async def test_reads_and_deletes_through_a_symlinked_shard_are_refused(outside: Outside) -> None:
    refused = f"block store {outside.root}: refused {outside.path}: it is a symlink, not a directory {NOTE}"
    async with LocalBlockStore(outside.root) as store:
        for call in (
            store.read_range(outside.old_block, 0, 3),
            store.read_clipped(outside.old_block, 0, 3),
            store.read_into(outside.old_block, 0, memoryview(bytearray(3))),
            store.delete_block(outside.old_block),
        ):
            with pytest.raises(Unavailable) as refusal:
                await call
            assert str(refusal.value) == refused
    assert outside.untouched()


async def test_gc_never_deletes_through_a_symlinked_shard(tmp_path: Path) -> None:
    outside = Outside(tmp_path / "data")
    async with blobsdk.Client.local(tmp_path / "data") as client:
        report = await client.gc()
    assert report.blocks_scanned == 0 and report.blocks_deleted == 0
    assert outside.untouched()


async def test_a_symlinked_block_file_is_never_read_nor_listed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "blobsdk.sources._local")
    secret = tmp_path / "secret"
    secret.write_bytes(b"private bytes")
    root = tmp_path / "blocks"
    async with LocalBlockStore(root) as store:
        real = new_block_id()
        await store.write_block(real, [b"abc"])
        linked = block_in_shard(shard_of(real))
        store.block_path(linked).symlink_to(secret)
        assert await listed(store) == [(real, 3)]
        with pytest.raises(Unavailable) as read:
            await store.read_range(linked, 0, 7)
        entry = store.block_path(linked)
        assert str(read.value) == f"block store {root}: refused {entry}: it is a symlink, not a regular file {NOTE}"
        with pytest.raises(Unavailable) as rewrite:  # a write never replaces what it is not
            await store.write_block(linked, [b"private bytes"])
        assert str(rewrite.value) == str(read.value)
        await store.delete_block(linked)  # the link goes, never what it points to
        assert not entry.is_symlink() and secret.read_bytes() == b"private bytes"
    assert [r.getMessage() for r in caplog.records] == [
        f"block store {root}: ignored {entry}: it is a symlink, not a regular file {NOTE}"
    ]


async def test_a_fifo_named_as_a_block_is_refused_not_waited_on(store_root: Path) -> None:
    async with LocalBlockStore(store_root) as store:
        block = new_block_id()
        await store.write_block(block, [b"x"])
        fifo = store.block_path(block_in_shard(shard_of(block)))
        os.mkfifo(fifo)
        with pytest.raises(Unavailable) as read:
            await store.read_range(fifo.name, 0, 1)
        assert str(read.value) == f"block store {store_root}: refused {fifo}: it is a FIFO, not a regular file {NOTE}"


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "blocks"


# --- the FORMAT marker (issue 20 item 10) ------------------------------------------------------


async def test_a_new_store_is_marked_format_1(store_root: Path) -> None:
    async with LocalBlockStore(store_root):
        pass
    assert (store_root / "FORMAT").read_text() == "blobsdk block-store format 1\n"


async def test_a_store_written_before_markers_is_adopted(store_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "blobsdk.sources._local")
    async with LocalBlockStore(store_root) as store:
        block = new_block_id()
        await store.write_block(block, [b"old bytes"])
    (store_root / "FORMAT").unlink()  # as every build before markers left it
    async with LocalBlockStore(store_root) as store:
        assert await store.read_range(block, 0, 9) == b"old bytes"
    assert (store_root / "FORMAT").read_text() == "blobsdk block-store format 1\n"
    assert [r.getMessage() for r in caplog.records] == [
        f"block store {store_root}: no FORMAT, every block where format 1 puts it: marked as format 1"
    ]


async def test_an_unmarked_store_with_a_misplaced_block_is_refused(store_root: Path) -> None:
    block = new_block_id()
    wrong = "00" if shard_of(block) != "00" else "01"
    (store_root / wrong).mkdir(parents=True)
    (store_root / wrong / block).write_bytes(b"laid out by another layout")
    with pytest.raises(IncompatibleFormat) as refusal:
        async with LocalBlockStore(store_root):
            pass
    assert str(refusal.value) == (
        f"block store {store_root} has no FORMAT and {store_root / wrong / block} is not where format 1 puts it: "
        "refusing to open it (its blocks are left as they are)"
    )
    assert stored_files(store_root) == [store_root / wrong / block] and not (store_root / "FORMAT").exists()


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        ("blobsdk block-store format 2\n", "{root} is in format 2, this build of blobsdk reads format 1"),
        ("blobsdk block-store format 0\n", "{root} is in format 0, this build of blobsdk reads format 1"),
    ],
)
async def test_another_format_is_refused_and_left_as_it_is(store_root: Path, marker: str, why: str) -> None:
    await _refused_and_untouched(
        store_root, marker, f"block store {why.format(root=store_root)}: refusing to open it (its blocks are left as they are)"
    )


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        (
            "blobsdk disk-cache format 1\n",
            "{root}/FORMAT says {root} holds a blobsdk disk-cache, not a block-store: refusing to open it",
        ),
        ("hello\n", "{root}/FORMAT is not a blobsdk format marker: refusing to open {root} as a block-store"),
        (
            "blobsdk block-store format 1",
            "{root}/FORMAT is not a blobsdk format marker: refusing to open {root} as a block-store",
        ),
    ],
)
async def test_another_kind_of_directory_is_refused_and_left_as_it_is(store_root: Path, marker: str, why: str) -> None:
    await _refused_and_untouched(store_root, marker, f"block store {store_root}: " + why.format(root=store_root))


async def _refused_and_untouched(root: Path, marker: str, message: str) -> None:
    block = new_block_id()
    (root / shard_of(block)).mkdir(parents=True)
    (root / shard_of(block) / block).write_bytes(b"kept")
    dead_temp = root / shard_of(block) / f"{block}.deadbeef-0123456789ab.tmp"
    dead_temp.write_bytes(b"kept too")
    (root / "FORMAT").write_text(marker)
    before = contents(root)
    with pytest.raises(IncompatibleFormat) as refusal:
        async with LocalBlockStore(root):
            pass
    assert str(refusal.value) == message
    store = LocalBlockStore(root)  # without async with (the block server): every operation refuses
    with pytest.raises(IncompatibleFormat):
        await store.write_block(new_block_id(), [b"x"])
    with pytest.raises(IncompatibleFormat):
        await store.read_range(block, 0, 4)
    await store.aclose()
    assert contents(root) == before


async def test_a_symlinked_format_marker_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "blocks"
    root.mkdir()
    (tmp_path / "elsewhere").write_text("blobsdk block-store format 1\n")
    (root / "FORMAT").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Unavailable) as refusal:
        async with LocalBlockStore(root):
            pass
    assert str(refusal.value) == f"block store {root}: refused {root / 'FORMAT'}: it is a symlink, not a regular file {NOTE}"


async def test_an_unmarked_store_on_a_read_only_root_opens_without_a_marker(
    store_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with LocalBlockStore(store_root) as store:
        block = new_block_id()
        await store.write_block(block, [b"old bytes"])
    (store_root / "FORMAT").unlink()

    def read_only(*args: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(_rootdir, "write_marker", read_only)
    async with LocalBlockStore(store_root) as store:
        assert await store.read_range(block, 0, 9) == b"old bytes"
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"block store {store_root}: cannot write FORMAT (Read-only file system): opened without it"
    ]
