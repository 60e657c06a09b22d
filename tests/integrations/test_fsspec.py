"""blobsdk.fsspec: the ``blob://`` filesystem, through fsspec's own abstract suite, our
semantics (ranges, pinned reads, atomic writes, directories), pandas/pyarrow, a fork, and a
real cluster."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import fsspec
import fsspec.tests.abstract as abstract
import pytest

import blobsdk
import blobsdk.fsspec as blobfs
from blobsdk.config import ClientConfig, ReadConfig
from blobsdk.fsspec import BlobFileSystem, BlobWriteFile
from servers.cluster import start_cluster
from tests.fsspec_fixtures import SMALL, SMALL_WRITE, BlobFixtures, local_fs
from tests.helpers import until, wait_for_child

# --- fsspec's abstract suite ------------------------------------------------------------------


class TestBlobCopy(abstract.AbstractCopyTests, BlobFixtures):
    pass


class TestBlobGet(abstract.AbstractGetTests, BlobFixtures):
    pass


class TestBlobPut(abstract.AbstractPutTests, BlobFixtures):
    pass


class TestBlobPipe(abstract.AbstractPipeTests, BlobFixtures):
    pass


class TestBlobOpen(abstract.AbstractOpenTests, BlobFixtures):
    pass


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[BlobFileSystem]:
    with local_fs(tmp_path / "store") as fs:
        yield fs


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


SIZE = 300_000  # about 4.6 chunks of 64 KiB
DATA = payload(SIZE)


# --- construction -----------------------------------------------------------------------------


def test_the_entry_point_registers_blob(tmp_path: Path) -> None:
    assert fsspec.get_filesystem_class("blob") is BlobFileSystem
    fs = fsspec.filesystem("blob", local=str(tmp_path / "store"))
    try:
        assert isinstance(fs, BlobFileSystem)
        assert fsspec.filesystem("blob", local=str(tmp_path / "store")) is fs  # one instance per arguments
        fs.pipe_file("blob://b/k", b"x")
        assert fsspec.open("blob://b/k", local=str(tmp_path / "store")).open().read() == b"x"
    finally:
        fs.close()
        BlobFileSystem.clear_instance_cache()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"local": 3}, TypeError, "local must be a directory path, not int"),
        ({"config": 3}, TypeError, "config must be a client.toml path or a ClientConfig, not int"),
        (
            {"local": "d", "config": ClientConfig(api_url="http://127.0.0.1:1", block_urls=("http://127.0.0.1:2",))},
            ValueError,
            "local=DIR is the embedded store: its config must not name stores (api_url, metadata_url)",
        ),
        (
            {"config": ClientConfig()},
            ValueError,
            "no stores configured: need api_url (or metadata_url) and block_urls (or source_url)",
        ),
        ({}, ValueError, "set BLOBSDK_CONFIG, or BLOBSDK_API_URL and BLOBSDK_BLOCK_URLS"),
        ({"lcoal": "d"}, TypeError, "unexpected keyword argument 'lcoal'"),
    ],
)
def test_bad_arguments_fail_at_construction(monkeypatch: pytest.MonkeyPatch, kwargs: dict, error: type, message: str) -> None:
    for var in ("BLOBSDK_CONFIG", "BLOBSDK_API_URL", "BLOBSDK_BLOCK_URLS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(error, match=re.escape(message)):
        BlobFileSystem(**kwargs, skip_instance_cache=True)


def test_a_missing_config_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        BlobFileSystem(config=tmp_path / "absent.toml", skip_instance_cache=True)


def test_names_urls_and_blob_paths_are_one_name(fs: BlobFileSystem) -> None:
    fs.pipe_file("blob://b/dir/k", b"v")
    for name in ("blob://b/dir/k", "blob:///b/dir/k", "/b/dir/k", "b/dir/k"):
        assert fs.cat_file(name) == b"v"
        assert fs.info(name)["name"] == "b/dir/k"
    assert fs.unstrip_protocol("b/dir/k") == "blob://b/dir/k"


@pytest.mark.parametrize("name", ["b//k", "b/../k", "b/./k", "b/k\x00"])
def test_an_invalid_path_is_value_error(fs: BlobFileSystem, name: str) -> None:
    for call in (fs.cat_file, fs.info, fs.exists, lambda p: fs.pipe_file(p, b"x"), lambda p: fs.open(p, "wb")):
        with pytest.raises(blobsdk.InvalidPath) as caught:
            call(name)
        assert isinstance(caught.value, ValueError)


# --- ranged and random-access reads -----------------------------------------------------------


RANGES = [
    (None, None),
    (0, 10),
    (5, None),
    (70_000, 140_000),  # across chunk boundaries
    (-10, None),
    (-10, -2),
    (None, -3),
    (10, -10),
    (-SIZE - 50, None),  # before the start: from the start
    (SIZE - 5, SIZE + 100),  # past the end: up to the end
    (SIZE + 5, None),
    (100, 50),  # empty
    (-5, -10),
    (0, 0),
]


@pytest.mark.parametrize(("start", "end"), RANGES)
def test_cat_file_ranges_are_python_slices(fs: BlobFileSystem, start: int | None, end: int | None) -> None:
    fs.pipe_file("b/blob", DATA)
    assert fs.cat_file("b/blob", start=start, end=end) == DATA[start:end]


def test_cat_ranges_and_bad_bounds(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", DATA)
    assert fs.cat_ranges(["b/blob", "b/blob"], [-100, 3], [None, 9]) == [DATA[-100:], DATA[3:9]]
    with pytest.raises(TypeError, match="start must be an int or None, not str"):
        fs.cat_file("b/blob", start="1")
    with pytest.raises(TypeError, match="end must be an int or None, not float"):
        fs.cat_file("b/blob", end=2.0)
    with pytest.raises(FileNotFoundError, match=re.escape("no blob at '/b/missing'")):
        fs.cat_file("b/missing", start=-1)


def test_random_access_reads_match_the_bytes(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", DATA)
    rng = random.Random(1)
    with fs.open("b/blob", "rb", block_size=10_000) as f:
        assert f.size == SIZE and f.seekable() and f.readable()
        for _ in range(200):
            pos, n = rng.randrange(SIZE + 100), rng.randrange(70_000)
            f.seek(pos)
            expected = DATA[pos : pos + n]
            assert f.read(n) == expected and f.tell() == pos + len(expected)


def test_seek_from_the_end_and_reads_past_it(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", DATA)
    with fs.open("b/blob", "rb", cache_type="none") as f:
        assert f.seek(-100, 2) == SIZE - 100
        assert f.read(1000) == DATA[-100:]  # short: the end
        assert f.read(10) == b""  # at the end
        assert f.seek(-10, 1) == SIZE - 10 and f.read() == DATA[-10:]
        assert f.seek(SIZE + 10) == SIZE + 10 and f.read(5) == b""
        with pytest.raises(ValueError, match="Seek before start of file"):
            f.seek(-SIZE - 1, 2)
        f.seek(0)
        assert f.read() == DATA


def test_an_open_file_reads_only_the_version_it_opened(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", DATA)
    with fs.open("b/blob", "rb", cache_type="none") as f:
        assert f.read(10) == DATA[:10]
        fs.pipe_file("b/blob", payload(SIZE, seed=2))
        message = "'/b/blob' changed while open: version 1 when opened, now 2"
        with pytest.raises(blobsdk.PreconditionFailed, match=re.escape(message)):
            f.read(10)
    with fs.open("b/blob", "rb") as f:
        assert f.read() == payload(SIZE, seed=2)


def test_a_pickled_read_file_reads_on(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", DATA)
    with fs.open("b/blob", "rb") as f:
        f.seek(1000)
        g = pickle.loads(pickle.dumps(f))  # its filesystem pickles as its arguments
    try:
        assert g.fs is not fs and g.fs.storage_options == fs.storage_options
        assert g.tell() == 1000 and g.read(10) == DATA[1000:1010]
    finally:
        g.close()
        g.fs.close()
        BlobFileSystem.clear_instance_cache()


def test_opening_what_is_not_a_blob(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/dir/k", b"x")
    for name in ("b/missing", "b/dir"):
        with pytest.raises(FileNotFoundError, match=re.escape(f"no blob at '/{name}'")):
            fs.open(name, "rb")
    with pytest.raises(NotImplementedError, match=re.escape("mode 'ab' is not supported: blobs are read ('rb') or written")):
        fs.open("b/dir/k", "ab")
    with pytest.raises(TypeError, match="unexpected options for writing 'b/new': cache_type"):
        fs.open("b/new", "wb", cache_type="none")


# --- atomic writes ----------------------------------------------------------------------------


def fail_inside(context, work) -> None:
    with context:
        work()
        raise KeyError("boom")


def test_a_write_is_invisible_until_close(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", b"old")
    with fs.open("b/blob", "wb") as f:
        assert isinstance(f, BlobWriteFile) and f.writable() and not f.seekable()
        for i in range(0, SIZE, 7000):
            f.write(DATA[i : i + 7000])
        assert f.tell() == SIZE
        assert fs.cat_file("b/blob") == b"old"
        fs.pipe_file("b/other", b"")  # the store takes other writes meanwhile
    assert f.closed and f.committed is not None and f.committed.size == SIZE
    assert fs.cat_file("b/blob") == DATA
    with pytest.raises(ValueError, match="I/O operation on closed file"):
        f.write(b"more")


def test_an_exception_in_the_with_block_keeps_the_old_version(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/blob", b"old")
    f = fs.open("b/blob", "wb")
    with pytest.raises(KeyError, match="boom"):
        fail_inside(f, lambda: f.write(b"half of the new"))
    assert f.closed and f.committed is None
    assert fs.cat_file("b/blob") == b"old"
    with fs.open("b/new", "wb") as g:
        g.discard()
        with pytest.raises(ValueError, match="'b/new' was discarded: nothing more can be written"):
            g.write(b"x")
    assert not fs.exists("b/new")


def test_a_file_never_closed_is_discarded(fs: BlobFileSystem) -> None:
    f = fs.open("b/blob", "wb")
    f.write(b"abandoned")
    del f
    gc.collect()
    assert not fs.exists("b/blob")


def test_a_large_write_spools_to_disk(fs: BlobFileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobfs, "SPOOL_MEMORY_BYTES", 10_000)
    with fs.open("b/blob", "wb") as f:
        for i in range(0, SIZE, 3000):
            f.write(memoryview(DATA)[i : i + 3000])
    assert fs.cat_file("b/blob") == DATA


def test_a_transaction_commits_at_its_end_and_discards_on_error(fs: BlobFileSystem) -> None:
    with fs.transaction:
        with fs.open("b/t1", "wb") as f:
            f.write(b"one")
        with fs.open("b/t2", "w") as t:
            t.write("two")
        assert not fs.exists("b/t1") and not fs.exists("b/t2")
    assert fs.cat_file("b/t1") == b"one" and fs.cat_file("b/t2") == b"two"
    with pytest.raises(KeyError, match="boom"):
        fail_inside(fs.transaction, lambda: fs.write_text("b/t1", "changed"))
    assert fs.cat_file("b/t1") == b"one"


def test_xb_creates_only(fs: BlobFileSystem) -> None:
    with fs.open("b/new", "xb") as f:
        f.write(b"first")
    assert fs.cat_file("b/new") == b"first"
    with pytest.raises(FileExistsError, match=re.escape("[Errno 17] already exists: 'b/new'")):
        fs.open("b/new", "xb")
    fs.pipe_file("b/dir/k", b"x")
    with pytest.raises(FileExistsError):
        fs.open("b/dir", "xb")  # a directory is there


def test_xb_loses_a_race_at_close_and_leaves_the_winner(fs: BlobFileSystem) -> None:
    f = fs.open("b/raced", "xb")
    f.write(b"loser")
    fs.pipe_file("b/raced", b"winner")
    with pytest.raises(FileExistsError, match=re.escape("[Errno 17] already exists: 'b/raced'")):
        f.close()
    assert f.closed and fs.cat_file("b/raced") == b"winner"


def test_pipe_file_modes(fs: BlobFileSystem) -> None:
    fs.pipe_file("b/k", b"1", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file("b/k", b"2", mode="create")
    with pytest.raises(ValueError, match="mode must be 'overwrite' or 'create', not 'append'"):
        fs.pipe_file("b/k", b"2", mode="append")
    assert fs.cat_file("b/k") == b"1"


# --- directories, info, ls, find, rm ----------------------------------------------------------


def make_tree(fs: BlobFileSystem) -> None:
    for name in ("b/top", "b/d/f1", "b/d/f2", "b/d/sub/deep", "b/d-x", "b/d0", "c/k"):
        fs.pipe_file(name, name.encode())


def test_directories_are_synthesised_from_slashes(fs: BlobFileSystem) -> None:
    make_tree(fs)
    assert fs.ls("", detail=False) == ["b", "c"]
    assert fs.ls("b", detail=False) == ["b/d", "b/d-x", "b/d0", "b/top"]
    assert fs.ls("b/d/", detail=False) == ["b/d/f1", "b/d/f2", "b/d/sub"]
    assert fs.ls("b/top", detail=False) == ["b/top"]  # ls of a blob: the blob
    assert fs.info("b/d") == {"name": "b/d", "size": 0, "type": "directory"}
    assert fs.info("") == {"name": "", "size": 0, "type": "directory"}
    top = fs.info("b/top")
    assert (top["type"], top["size"], top["version"]) == ("file", 5, 1) and top["mtime"] == fs.modified("b/top")
    assert fs.isdir("b/d/sub") and not fs.isfile("b/d/sub") and fs.isfile("b/d/sub/deep") and not fs.isdir("b/top")
    for missing in ("b/nope", "nobucket", "b/d/f"):
        assert not fs.exists(missing)
        with pytest.raises(FileNotFoundError, match=re.escape(f"no blob or directory: '{missing}'")):
            fs.info(missing)
        with pytest.raises(FileNotFoundError):
            fs.ls(missing)
    with pytest.raises(IsADirectoryError, match="a directory has no modification time"):
        fs.modified("b/d")


def test_find_walk_glob_and_du(fs: BlobFileSystem) -> None:
    make_tree(fs)
    assert fs.find("b/d") == ["b/d/f1", "b/d/f2", "b/d/sub/deep"]
    assert fs.find("b/d", withdirs=True) == ["b/d", "b/d/f1", "b/d/f2", "b/d/sub", "b/d/sub/deep"]
    assert fs.find("b", maxdepth=1) == ["b/d-x", "b/d0", "b/top"]
    assert fs.find("b", maxdepth=2, withdirs=True) == ["b", "b/d", "b/d-x", "b/d/f1", "b/d/f2", "b/d/sub", "b/d0", "b/top"]
    assert fs.find("b/top") == ["b/top"]
    assert fs.find("b/nope") == []
    assert [(root, sorted(dirs), sorted(files)) for root, dirs, files in fs.walk("b/d")] == [
        ("b/d", ["sub"], ["f1", "f2"]),
        ("b/d/sub", [], ["deep"]),
    ]
    assert fs.glob("b/d*") == ["b/d", "b/d-x", "b/d0"]
    assert fs.glob("b/**/deep") == ["b/d/sub/deep"]
    assert fs.du("b/d") == len(b"b/d/f1") * 2 + len(b"b/d/sub/deep")
    with pytest.raises(ValueError, match="maxdepth must be at least 1"):
        fs.find("b", maxdepth=0)


def test_ls_jumps_past_a_big_subdirectory(fs: BlobFileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobfs, "LIST_SKIP_AFTER", 2)
    names = ["b/a", "b/a-", *(f"b/a/{i:02}" for i in range(7)), "b/a/\U0010ffff/x", "b/a0", "b/b/1", "b/b/2", "b/b/3", "b/c"]
    fs.pipe(dict.fromkeys(names, b""))
    assert [(e["name"], e["type"]) for e in fs.ls("b")] == [
        ("b/a", "file"),
        ("b/a", "directory"),
        ("b/a-", "file"),
        ("b/a0", "file"),
        ("b/b", "directory"),
        ("b/c", "file"),
    ]


def test_mkdir_and_makedirs_only_check_the_name(fs: BlobFileSystem) -> None:
    fs.mkdir("b/new/dir")
    fs.makedirs("b/new/dir/deeper", exist_ok=False)
    assert not fs.exists("b/new")  # as in s3fs: a directory appears with its first blob
    with pytest.raises(blobsdk.InvalidPath):
        fs.makedirs("b//x")


def test_rm(fs: BlobFileSystem) -> None:
    make_tree(fs)
    with pytest.raises(IsADirectoryError, match=re.escape("is a directory: pass recursive=True: 'b/d'")):
        fs.rm("b/d")
    fs.rm("b/d-x")
    fs.rm_file("b/d0")
    with pytest.raises(FileNotFoundError):
        fs.rm_file("b/d0")
    with pytest.raises(FileNotFoundError):
        fs.rm("b/nope")
    fs.rm("b/d", recursive=True)
    assert fs.find("b", withdirs=True) == ["b", "b/top"]
    fs.rm("", recursive=True)
    assert fs.ls("") == []


# --- put_file, get_file, cp_file --------------------------------------------------------------


def test_put_file_and_get_file(fs: BlobFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobfs, "RANGE_BYTES", 100_000)  # get_file in four reads
    big = payload(blobfs.LOCAL_MMAP_BYTES + 10, seed=3)  # put_file maps it
    (tmp_path / "small").write_bytes(DATA)
    (tmp_path / "big").write_bytes(big)
    fs.put_file(tmp_path / "small", "b/small")
    fs.put_file(str(tmp_path / "big"), "b/big")
    with pytest.raises(FileExistsError):
        fs.put_file(tmp_path / "small", "b/small", mode="create")
    fs.get_file("b/small", tmp_path / "out" / "small")
    fs.get_file("b/big", str(tmp_path / "out" / "big"))
    assert (tmp_path / "out" / "small").read_bytes() == DATA
    assert (tmp_path / "out" / "big").read_bytes() == big
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert (tmp_path / "out" / "small").stat().st_mode == plain.stat().st_mode  # not mkstemp's 0600
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["big", "small"]  # no temporary left
    with pytest.raises(FileNotFoundError):
        fs.get_file("b/missing", tmp_path / "out" / "missing")
    assert not (tmp_path / "out" / "missing").exists()


def test_a_download_of_a_blob_replaced_midway_fails_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobfs, "RANGE_BYTES", 100_000)
    uncached = ClientConfig(write=SMALL_WRITE, read=ReadConfig(plan_cache_ttl_seconds=0))  # sees the other writer at once
    with (
        BlobFileSystem(local=tmp_path / "store", config=uncached, skip_instance_cache=True) as fs,
        blobsdk.SyncClient.local(tmp_path / "store") as other,
    ):
        fs.pipe_file("b/blob", DATA)

        class ReplaceAfterTheFirstRange:
            def set_size(self, size: int) -> None:
                pass

            def relative_update(self, n: int) -> None:
                other.put("/b/blob", b"new")

        (tmp_path / "out").mkdir()
        with pytest.raises(blobsdk.PreconditionFailed, match="changed while open: version 1 when opened, now 2"):
            fs.get_file("b/blob", tmp_path / "out" / "blob", callback=ReplaceAfterTheFirstRange())
        assert list((tmp_path / "out").iterdir()) == []


def test_cp_file_small_and_large(fs: BlobFileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    fs.pipe_file("b/src", DATA)
    fs.cp_file("b/src", "b/copy")
    assert fs.cat_file("b/copy") == DATA
    monkeypatch.setattr(blobfs, "SPOOL_MEMORY_BYTES", 50_000)
    monkeypatch.setattr(blobfs, "RANGE_BYTES", 64 << 10)
    fs.cp_file("b/src", "b/copy2")  # through a temporary file, 64 KiB at a time
    assert fs.cat_file("b/copy2") == DATA
    fs.mv("b/copy2", "b/moved")
    assert fs.cat_file("b/moved") == DATA and not fs.exists("b/copy2")
    with pytest.raises(FileNotFoundError):
        fs.cp_file("b/missing", "b/x")


# --- pandas and pyarrow -----------------------------------------------------------------------


def test_pandas_and_pyarrow_write_and_read_parquet(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    store = str(tmp_path / "store")
    frame = pd.DataFrame({"i": range(5000), "s": [f"row {i}" for i in range(5000)], "f": [i / 7 for i in range(5000)]})
    try:
        frame.to_parquet("blob://data/frame.parquet", storage_options={"local": store}, row_group_size=1000)
        back = pd.read_parquet("blob://data/frame.parquet", storage_options={"local": store})
        pd.testing.assert_frame_equal(back, frame)
        fs = fsspec.filesystem("blob", local=store)
        table = pa.table({"x": list(range(1000)), "y": [str(i) for i in range(1000)]})
        pq.write_table(table, "data/table.parquet", filesystem=fs, row_group_size=100)
        assert pq.read_table("data/table.parquet", filesystem=fs).equals(table)
        assert pq.read_table("data/table.parquet", filesystem=fs, columns=["y"]).column("y") == table.column("y")
        assert fs.ls("data", detail=False) == ["data/frame.parquet", "data/table.parquet"]
    finally:
        fsspec.filesystem("blob", local=store).close()
        BlobFileSystem.clear_instance_cache()


# --- the client's lifetime --------------------------------------------------------------------


def sqlite_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("blobsdk-sqlite")}


def test_close_and_garbage_collection_close_the_client(tmp_path: Path) -> None:
    """An open client has a SQLite worker thread; closing the client stops it."""
    before = sqlite_threads()
    fs = local_fs(tmp_path / "store")
    fs.pipe_file("b/k", b"v")
    (first,) = sqlite_threads() - before
    fs.close()
    until(lambda: not first.is_alive())
    assert fs.cat_file("b/k") == b"v"  # the next call opens a new client
    (second,) = sqlite_threads() - before
    del fs
    gc.collect()
    until(lambda: not second.is_alive())


async def test_asynchronous_use_on_the_callers_loop(tmp_path: Path) -> None:
    async with BlobFileSystem(local=tmp_path / "store", config=SMALL, asynchronous=True, skip_instance_cache=True) as fs:
        await fs._pipe_file("b/k", DATA)
        assert await fs._cat_file("b/k", start=-10) == DATA[-10:]
        assert await fs._ls("b", detail=False) == ["b/k"]
        message = "this blob:// filesystem's client is open on another event loop: close it first"
        with pytest.raises(RuntimeError, match=re.escape(message)):
            await asyncio.to_thread(asyncio.run, fs._cat_file("b/k"))
        with pytest.raises(RuntimeError, match=re.escape("fs.close() on the loop its client runs on would block it")):
            fs.close()
    async with fs:  # closed: it opens again on first use
        assert await fs._cat_file("b/k") == DATA


def test_asynchronous_use_on_a_loop_run_by_hand(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    try:
        fs = BlobFileSystem(local=tmp_path / "store", asynchronous=True, skip_instance_cache=True)
        loop.run_until_complete(fs._pipe_file("b/k", b"v"))
        message = "this blob:// filesystem's client is open on an event loop that is not running: close it there"
        with pytest.raises(RuntimeError, match=re.escape(message)):
            fs.close()
        loop.run_until_complete(fs.aclose())
        fs.close()  # closed: nothing to do
    finally:
        loop.close()


def test_a_forked_child_opens_its_own_client(fs: BlobFileSystem) -> None:
    fork_and_check(fs)


def fork_and_check(fs: BlobFileSystem) -> None:
    """A child forked while ``fs`` is open reads and writes through it; the parent's client
    still works after (the child never touched its loop or sockets)."""
    fs.pipe_file("b/parent", b"from the parent")
    pid = os.fork()
    if pid == 0:  # the child: the parent's loop thread does not exist here
        code = 1
        try:
            code = 0 if fs.cat_file("b/parent") == b"from the parent" else 2
            fs.pipe_file("b/child", b"from the child")
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    assert fs.cat_file("b/child") == b"from the child"
    assert fs.cat_file("b/parent") == b"from the parent"


# --- a real cluster ---------------------------------------------------------------------------


def test_over_a_cluster_through_its_client_toml(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    with start_cluster(tmp_path / "cluster", block_servers=1, l3_nodes=0, trackers=0) as cluster:
        with BlobFileSystem(config=cluster.config_path, skip_instance_cache=True) as fs:
            fs.pipe_file("b/dir/k", DATA)
            with fs.open("b/dir/big", "wb") as f:
                f.write(DATA * 3)
            assert fs.cat_file("b/dir/k", start=-1000) == DATA[-1000:]
            with fs.open("b/dir/big", "rb", block_size=50_000) as f:
                f.seek(-5, 2)
                assert f.read() == DATA[-5:]
            assert fs.ls("b", detail=False) == ["b/dir"] and fs.find("b") == ["b/dir/big", "b/dir/k"]
            frame = pd.DataFrame({"a": range(100)})
            frame.to_parquet("blob://b/frame.parquet", filesystem=fs)
            pd.testing.assert_frame_equal(pd.read_parquet("blob://b/frame.parquet", filesystem=fs), frame)
            fork_and_check(fs)
            fs.rm("b", recursive=True)
            assert fs.ls("") == []
        assert cluster.config is not None
        with BlobFileSystem(config=cluster.config, skip_instance_cache=True) as fs:
            fs.pipe_file("b/k", b"through a ClientConfig")
            assert fs.cat_file("b/k") == b"through a ClientConfig"
