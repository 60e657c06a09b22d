"""The public API refuses an argument of the wrong kind with a TypeError naming it, before any
work, never with the error of whatever trips over it first (blobsdk/_arguments.py); a number
of the right kind that is a bool, a float for an int, nan, ±inf or out of range is the call's
ValueError, as blobsdk/_numbers.py rules a setting.  Through Client, SyncClient, Checkpoints,
the client's config, the torch datasets and DCP storage, and the blob:// filesystem."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

import blobsdk
from blobsdk.config import ClientConfig
from blobsdk.errors import BadRequest
from blobsdk.fsspec import BlobFileSystem
from blobsdk.torch import BlobDataset, BlobIterableDataset, BlobSampler, BlobStorageWriter

BYTES_LIKE = "a bytes-like object (bytes, bytearray, memoryview, ...)"
STEP = "an int from 0 to 999999999999"
Case = tuple[str, Callable[[Any], Any], type[Exception], str]


def cases(rows: list[Case]) -> Any:
    return pytest.mark.parametrize(("call", "error", "message"), [pytest.param(*row[1:], id=row[0]) for row in rows])


def raised(call: Callable[[], Any], error: type[Exception]) -> BaseException:
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    return caught.value


async def called(call: Callable[[Any], Any], client: blobsdk.Client) -> None:
    result = call(client)
    if inspect.isawaitable(result):
        await result


# --- the async client, and its checkpoints --------------------------------------------------------

CLIENT: list[Case] = [
    ("gc grace str", lambda c: c.gc(grace="3600"), TypeError, "gc: grace must be a number > 0 (seconds), not str"),
    ("gc grace None", lambda c: c.gc(grace=None), TypeError, "gc: grace must be a number > 0 (seconds), not NoneType"),
    ("gc grace bool", lambda c: c.gc(grace=True), BadRequest, "gc: grace must be a number > 0 (seconds), got True"),
    ("gc grace nan", lambda c: c.gc(grace=math.nan), BadRequest, "gc: grace must be a number > 0 (seconds), got nan"),
    ("gc grace inf", lambda c: c.gc(grace=math.inf), BadRequest, "gc: grace must be a number > 0 (seconds), got inf"),
    ("gc dry_run", lambda c: c.gc(dry_run="no"), TypeError, "gc: dry_run must be a bool, not str"),
    ("scrub dry_run", lambda c: c.scrub(dry_run=None), TypeError, "scrub: dry_run must be a bool, not NoneType"),
    ("scrub progress", lambda c: c.scrub(progress=5), TypeError, "scrub: progress must be callable or None, not int"),
    (
        "put_many None",
        lambda c: c.put_many(None),
        TypeError,
        "put_many: items must be an iterable of (path, data) pairs, not NoneType",
    ),
    (
        "put_many str",
        lambda c: c.put_many("/b/x"),
        TypeError,
        "put_many: items must be an iterable of (path, data) pairs, not str",
    ),
    ("put_many [None]", lambda c: c.put_many([None]), TypeError, "put_many: each item must be a (path, data) pair, not NoneType"),
    ("put_many [str]", lambda c: c.put_many(["/b/x"]), TypeError, "put_many: each item must be a (path, data) pair, not str"),
    (
        "put_many 1-tuple",
        lambda c: c.put_many([("/b/x",)]),
        TypeError,
        "put_many: each item must be a (path, data) pair, not a tuple of 1",
    ),
    (
        "put_many data",
        lambda c: c.put_many([("/b/x", "text")]),
        TypeError,
        f"put_many: the data of '/b/x' must be {BYTES_LIKE}, not str",
    ),
    (
        "put_many progress",
        lambda c: c.put_many([("/b/x", b"x")], progress=5),
        TypeError,
        "put_many: progress must be callable or None, not int",
    ),
    (
        "put if_version bool",
        lambda c: c.put("/b/x", b"x", if_version=True),
        BadRequest,
        "if_version must be None or an int >= 0, got True",
    ),
    (
        "delete if_version bool",
        lambda c: c.delete("/b/x", if_version=False),
        BadRequest,
        "if_version must be None or an int >= 0, got False",
    ),
    ("get length bool", lambda c: c.get("/r/x", length=True), BadRequest, "length must be None or an int >= 0, got True"),
    (
        "put if_version str",
        lambda c: c.put("/b/x", b"x", if_version="1"),
        TypeError,
        "if_version must be None or an int >= 0, not str",
    ),
    (
        "delete if_version str",
        lambda c: c.delete("/r/x", if_version="1"),
        TypeError,
        "if_version must be None or an int >= 0, not str",
    ),
    ("readahead depth str", lambda c: c.readahead(["/r/x"], depth="4"), TypeError, "depth must be an int >= 1, not str"),
    (
        "readahead max_bytes float",
        lambda c: c.readahead(["/r/x"], max_bytes=1.5),
        BadRequest,
        "max_bytes must be an int >= 1, got 1.5",
    ),
    (
        "prefetch max_bytes str",
        lambda c: c.prefetch(["/b/x"], tier="l1", max_bytes="5"),
        TypeError,
        "max_bytes must be a positive int or None, not str",
    ),
    (
        "get_many_into paths",
        lambda c: c.get_many_into(None, bytearray(1)),
        TypeError,
        "get_many_into: paths must be a sequence of paths, not NoneType",
    ),
    (
        "prefetch paths",
        lambda c: c.prefetch(5, tier="l1"),
        TypeError,
        "prefetch: paths_or_prefixes must be a path or an iterable of paths, not int",
    ),
    (
        "prefetch bytes",
        lambda c: c.prefetch(b"/b/x", tier="l1"),
        TypeError,
        "prefetch: paths_or_prefixes must be a path or an iterable of paths, not bytes",
    ),
    (
        "prefetch pin_seconds",
        lambda c: c.prefetch(["/b/x"], tier="l1", pin_seconds="1"),
        TypeError,
        "pin_seconds must be None or a number >= 0, not str",
    ),
    (
        "prefetch pin_seconds bool",
        lambda c: c.prefetch(["/b/x"], tier="l1", pin_seconds=True),
        BadRequest,
        "pin_seconds must be None or a number >= 0, got True",
    ),
    (
        "prefetch max_bytes bool",
        lambda c: c.prefetch(["/b/x"], tier="l1", max_bytes=True),
        BadRequest,
        "max_bytes must be a positive int or None, got True",
    ),
    ("readahead paths", lambda c: c.readahead(None), TypeError, "readahead: paths must be an iterable of paths, not NoneType"),
    ("readahead str", lambda c: c.readahead("/b/x"), TypeError, "readahead: paths must be an iterable of paths, not str"),
    ("index_s3 url", lambda c: c.index_s3(None, "/b/"), TypeError, "index_s3: url must be a str, not NoneType"),
    (
        "index_s3 progress",
        lambda c: c.index_s3("s3://l/x", "/b/", progress=1),
        TypeError,
        "index_s3: progress must be callable or None, not int",
    ),
    (
        "index_s3 parallel",
        lambda c: c.index_s3("s3://l/x", "/b/", parallel="8"),
        TypeError,
        "index_s3: parallel must be an int >= 1, not str",
    ),
    (
        "index_s3 parallel float",
        lambda c: c.index_s3("s3://l/x", "/b/", parallel=1.5),
        ValueError,
        "index_s3: parallel must be an int >= 1, got 1.5",
    ),
    ("checkpoints None", lambda c: c.checkpoints(None), TypeError, "checkpoints: prefix must be a str, not NoneType"),
    ("checkpoints keep", lambda c: c.checkpoints("/ck/a", keep="3"), TypeError, "keep must be an int >= 1, not str"),
    ("checkpoints dedup", lambda c: c.checkpoints("/ck/a", dedup="no"), TypeError, "checkpoints: dedup must be a bool, not str"),
    ("checkpoints mirror", lambda c: c.checkpoints("/ck/a", mirror=1), TypeError, "checkpoints: mirror must be a bool, not int"),
    (
        "checkpoints trust",
        lambda c: c.checkpoints("/ck/a", trust_version_counters=None),
        TypeError,
        "checkpoints: trust_version_counters must be a bool, not NoneType",
    ),
    ("load step str", lambda c: c.checkpoints("/ck/a").load("1"), TypeError, f"step must be None or {STEP}, not str"),
    ("load step float", lambda c: c.checkpoints("/ck/a").load(1.0), ValueError, f"step must be None or {STEP}, got 1.0"),
    ("load step bool", lambda c: c.checkpoints("/ck/a").load(True), ValueError, f"step must be None or {STEP}, got True"),
    ("load select", lambda c: c.checkpoints("/ck/a").load(select=5), TypeError, "load: select must be callable or None, not int"),
    ("manifest step", lambda c: c.checkpoints("/ck/a").manifest("1"), TypeError, f"step must be None or {STEP}, not str"),
    ("remove step", lambda c: c.checkpoints("/ck/a").remove(None), TypeError, f"step must be {STEP}, not NoneType"),
    ("save step str", lambda c: c.checkpoints("/ck/a").save("1", {}), TypeError, f"step must be {STEP}, not str"),
    (
        "commit parts",
        lambda c: c.checkpoints("/ck/a").commit(1, None),
        TypeError,
        "commit: parts must be a list of parts (what write_part returned), not NoneType",
    ),
    (
        "commit part",
        lambda c: c.checkpoints("/ck/a").commit(1, [None]),
        TypeError,
        "commit: each part must be a Part (what write_part returned), not NoneType",
    ),
]


@cases(CLIENT)
async def test_a_bad_argument_is_refused_naming_it_before_anything_is_written(
    client: blobsdk.Client, call: Callable[[blobsdk.Client], Any], error: type[Exception], message: str
) -> None:
    await client.put("/r/x", b"read")  # what the reads read
    with pytest.raises(error) as caught:
        await called(call, client)
    assert type(caught.value) is error and str(caught.value) == message
    assert [info.path async for info in client.list("/")] == ["/r/x"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"offset": -1}, "offset must be an int >= 0, got -1"),
        ({"length": -1}, "length must be None or an int >= 0, got -1"),
        ({"offset": "1"}, "offset must be an int >= 0, got '1'"),  # a BadRequest, as api.md says of get_into's
    ],
)
async def test_a_bad_range_is_refused_before_the_plan_is_looked_up(
    client: blobsdk.Client, kwargs: dict[str, object], message: str
) -> None:
    """Of a blob that does not exist: the range's error, not BlobNotFound after a lookup."""
    with pytest.raises(BadRequest) as caught:
        await client.get("/missing/x", **kwargs)  # type: ignore[arg-type]
    assert type(caught.value) is BadRequest and str(caught.value) == message


@pytest.mark.parametrize(
    ("if_version", "error", "message"),
    [
        (-1, BadRequest, "if_version must be None or an int >= 0, got -1"),
        ("1", TypeError, "if_version must be None or an int >= 0, not str"),
    ],
)
async def test_a_bad_if_version_is_refused_before_the_data_is_written(
    client: blobsdk.Client, tmp_path: Path, if_version: object, error: type[Exception], message: str
) -> None:
    blocks = tmp_path / "data" / "blocks"
    before = sorted(blocks.rglob("*"))
    with pytest.raises(error) as caught:
        await client.put("/b/x", bytes(1 << 20), if_version=if_version)  # type: ignore[arg-type]
    assert type(caught.value) is error and str(caught.value) == message
    assert sorted(blocks.rglob("*")) == before  # it was refused at the commit, after 1 MiB went to L4


# --- the blocking client, constructors and the config ---------------------------------------------

CONSTRUCTORS: list[Case] = [
    (
        "Client config",
        lambda d: blobsdk.Client("client.toml"),
        TypeError,
        "Client: config must be a ClientConfig (ClientConfig.from_toml(path) reads a client.toml), not str",
    ),
    (
        "Client stores",
        lambda d: blobsdk.Client(ClientConfig(), stores=5),
        TypeError,
        "Client: stores must be None or a Stores (ClusterStores, LocalStores, GivenStores), not int",
    ),
    (
        "Client.local root",
        lambda d: blobsdk.Client.local(None),
        TypeError,
        "Client.local: root must be a directory path, not NoneType",
    ),
    ("Client.local l1", lambda d: blobsdk.Client.local(d, l1=0), TypeError, "l1 must be an L1Config, not int"),
    ("Client.local l2", lambda d: blobsdk.Client.local(d, l2=str(d)), TypeError, "l2 must be None or an L2Config, not str"),
    ("Client.local write", lambda d: blobsdk.Client.local(d, write={}), TypeError, "write must be a WriteConfig, not dict"),
    (
        "from_stores",
        lambda d: blobsdk.Client.from_stores(None, None),
        TypeError,
        "from_stores: metadata must be a MetadataStore, not NoneType",
    ),
    (
        "SyncClient config",
        lambda d: blobsdk.SyncClient(None),
        TypeError,
        "SyncClient: config must be a ClientConfig or a Client, not NoneType",
    ),
    (
        "SyncClient.local root",
        lambda d: blobsdk.SyncClient.local(5),
        TypeError,
        "Client.local: root must be a directory path, not int",
    ),
    ("ClientConfig read", lambda d: ClientConfig(read=None), TypeError, "read must be a ReadConfig, not NoneType"),
    ("ClientConfig s3", lambda d: ClientConfig(s3={"region": "x"}), TypeError, "s3 must be an S3Config, not dict"),
]


@cases(CONSTRUCTORS)
def test_a_client_or_config_of_bad_arguments_is_refused_naming_them(
    tmp_path: Path, call: Callable[[Path], Any], error: type[Exception], message: str
) -> None:
    assert str(raised(lambda: call(tmp_path), error)) == message


SYNC: list[Case] = [
    (
        "prefetch paths",
        lambda c: c.prefetch(5, tier="l1"),
        TypeError,
        "prefetch: paths_or_prefixes must be a path or an iterable of paths, not int",
    ),
    ("gc grace", lambda c: c.gc(grace="3600"), TypeError, "gc: grace must be a number > 0 (seconds), not str"),
    ("put_many [None]", lambda c: c.put_many([None]), TypeError, "put_many: each item must be a (path, data) pair, not NoneType"),
    ("checkpoints None", lambda c: c.checkpoints(None), TypeError, "checkpoints: prefix must be a str, not NoneType"),
    ("load step", lambda c: c.checkpoints("/ck/a").load("1"), TypeError, f"step must be None or {STEP}, not str"),
]


@cases(SYNC)
def test_the_blocking_client_refuses_them_as_the_async_one(
    tmp_path: Path, call: Callable[[blobsdk.SyncClient], Any], error: type[Exception], message: str
) -> None:
    """SyncClient.prefetch reads its paths into a list first, in the caller's thread: there too."""
    with blobsdk.SyncClient.local(tmp_path) as client:
        assert str(raised(lambda: call(client), error)) == message
        assert list(client.list("/")) == []


# --- the torch datasets, DCP storage and the blob:// filesystem ------------------------------------

TORCH: list[Case] = [
    (
        "sampler source",
        lambda d: BlobSampler(60),
        TypeError,
        "BlobSampler: data_source must be a dataset with a len (a BlobDataset), not int",
    ),
    (
        "dataset root",
        lambda d: BlobDataset.local(7, ["/b/x"]),
        TypeError,
        "local must be a directory path (the embedded store's root), not int",
    ),
    ("iterable read", lambda d: BlobIterableDataset.local(d, ["/b/x"], read=5), TypeError, "read must be a ReadConfig, not int"),
    ("dcp prefix", lambda d: BlobStorageWriter.local(d, None), TypeError, "prefix must be a str, not NoneType"),
]


@cases(TORCH)
def test_the_datasets_and_dcp_storage_refuse_them_when_built(
    tmp_path: Path, call: Callable[[Path], Any], error: type[Exception], message: str
) -> None:
    assert str(raised(lambda: call(tmp_path), error)) == message


FSSPEC: list[Case] = [
    ("cat_file path", lambda fs: fs.cat_file(5), TypeError, "path must be a str (blob://bucket/key or bucket/key), not int"),
    ("info path", lambda fs: fs.info(None), TypeError, "path must be a str (blob://bucket/key or bucket/key), not NoneType"),
    ("rm path", lambda fs: fs.rm(5), TypeError, "rm: path must be a str or a list of them, not int"),
    (
        "open block_size",
        lambda fs: fs.open("b/x", "rb", block_size="1"),
        TypeError,
        "open: block_size must be None or an int >= 1, not str",
    ),
    ("write data", lambda fs: fs.open("b/y", "wb").write("text"), TypeError, f"write: data must be {BYTES_LIKE}, not str"),
    ("find maxdepth", lambda fs: fs.find("b", maxdepth="2"), TypeError, "find: maxdepth must be None or an int, not str"),
    ("find maxdepth float", lambda fs: fs.find("b", maxdepth=1.5), ValueError, "find: maxdepth must be None or an int, got 1.5"),
]


@cases(FSSPEC)
def test_the_filesystem_refuses_them(tmp_path: Path, call: Callable[[Any], Any], error: type[Exception], message: str) -> None:
    fs = fsspec.filesystem("blob", local=str(tmp_path), skip_instance_cache=True)
    try:
        fs.pipe_file("b/x", b"data")
        assert str(raised(lambda: call(fs), error)) == message
        assert fs.find("b") == ["b/x"]
    finally:
        fs.close()
        BlobFileSystem.clear_instance_cache()
