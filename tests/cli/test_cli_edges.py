"""The CLI's rough edges of issue 22 (section "CLI"), each with its exact message and exit
code.  Item 1 (a new file's mode follows the umask) is tests/cli/test_cli_out.py's
``test_a_new_file_gets_the_umasks_mode``; item 6 (``get PATH DIR``) is there too."""

from __future__ import annotations

import io
import json
from importlib import metadata
from pathlib import Path

import pytest

from blobsdk.cli.admin import STATS_NOTE, _show, dataset_bytes_done
from blobsdk.read.prefetch import PrefetchProgress
from tests.cli.test_cli import error_line, ok, run


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A local store holding /b/x, /b2/z and /bucketx/k."""
    (tmp_path / "in").write_bytes(b"xyz")
    for path in ("/b/x", "/b2/z", "/bx/k"):
        ok("put", str(tmp_path / "in"), path, store=tmp_path / "store")
    return tmp_path / "store"


def test_ls_of_a_bucket_lists_that_bucket_only(store):
    """item 2: ``/b`` is bucket b, as ``/b/`` is; ``/`` lists every bucket."""
    assert ok("ls", "/b", store=store).decode().splitlines() == ["/b/x"]
    assert ok("ls", "/b/", store=store).decode().splitlines() == ["/b/x"]
    assert ok("ls", "/", store=store).decode().splitlines() == ["/b/x", "/b2/z", "/bx/k"]


@pytest.mark.parametrize("command", [["put", "IN", "/bucketx"], ["get", "/bucketx"], ["stat", "/bucketx"], ["rm", "/bucketx"]])
def test_a_path_with_no_key_is_refused(tmp_path, store, command):
    """item 3."""
    result = run(*[str(tmp_path / "in") if a == "IN" else a for a in command], store=store)
    assert result.returncode == 1 and result.stdout == b""
    assert error_line(result) == "blobsdk: error: path '/bucketx' names a bucket, not a blob: a blob path is /bucket/key"


READS = [
    ["ls", "/"],
    ["get", "/b/x"],
    ["cat", "/b/x"],
    ["stat", "/b/x"],
    ["rm", "/b/x"],
    ["plan", "/b/x"],
    ["prefetch", "/b/", "--tier", "l2"],
    ["ckpt", "ls", "/b/ck"],
    ["stats"],
    ["gc", "--dry-run"],
    ["scrub"],
]


@pytest.mark.parametrize("command", READS, ids=[" ".join(c) for c in READS])
def test_a_command_on_a_store_that_does_not_exist_creates_nothing(tmp_path, command):
    """item 4: a typo'd --local is refused, and no directory nor meta.sqlite appears."""
    missing = tmp_path / "nonexistent" / "deep" / "dir"
    result = run(*command, store=missing)
    assert result.returncode == 2 and result.stdout == b""
    assert error_line(result) == (
        f"blobsdk: error: no store in '{missing}' (no meta.sqlite): a put or import makes one, or pass --create"
    )
    assert not (tmp_path / "nonexistent").exists()


def test_an_empty_directory_is_no_store_either(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run("ls", "/", store=tmp_path / "empty")
    assert result.returncode == 2 and list((tmp_path / "empty").iterdir()) == []


def test_create_makes_the_store_and_a_write_makes_one_too(tmp_path):
    made = tmp_path / "a" / "b"
    assert ok("--create", "ls", "/", store=made) == b"" and (made / "meta.sqlite").exists()
    (tmp_path / "in").write_bytes(b"1")
    ok("put", str(tmp_path / "in"), "/b/k", store=tmp_path / "put")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"2")
    ok("import", str(src), "/b/d", store=tmp_path / "imported")
    assert ok("cat", "/b/d/f", store=tmp_path / "imported") == b"2"


def test_create_needs_local(tmp_path):
    result = run("--create", "--config", str(tmp_path / "client.toml"), "ls", "/")
    assert result.returncode == 2 and error_line(result) == "blobsdk: error: --create makes a local store: it needs --local DIR"


def test_put_of_dash_reads_stdin(store):
    """item 5."""
    info = json.loads(ok("put", "-", "/b/piped", store=store, stdin=b"from stdin"))
    assert info["size"] == 10 and ok("cat", "/b/piped", store=store) == b"from stdin"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "/b/x", "--offset", "abc"], "blobsdk get: error: argument --offset: not a whole number: 'abc'"),
        (["get", "/b/x", "--length", "1.5"], "blobsdk get: error: argument --length: not a whole number: '1.5'"),
        (["get", "/b/x", "--offset", "-1"], "blobsdk get: error: argument --offset: must be >= 0, got -1"),
        (["rm", "/b/x", "--if-version", "v1"], "blobsdk rm: error: argument --if-version: not a whole number: 'v1'"),
        (["ckpt", "show", "/b/ck", "last"], "blobsdk ckpt show: error: argument STEP: not a whole number: 'last'"),
    ],
)
def test_a_bad_number_names_the_argument_not_a_function(store, args, message):
    """item 7."""
    result = run(*args, store=store)
    assert result.returncode == 2 and error_line(result) == message


def test_ckpt_ls_takes_a_prefix_ending_in_a_slash(tmp_path):
    """item 8."""
    import blobsdk

    with blobsdk.SyncClient.local(tmp_path / "store") as client:
        client.checkpoints("/bucket/ckpt/job1").save(7, {"step": 7})
    for prefix in ("/bucket/ckpt/job1/", "/bucket/ckpt/job1"):
        lines = ok("ckpt", "ls", prefix, store=tmp_path / "store").decode().splitlines()
        assert len(lines) == 1 and lines[0].split()[0] == "7"
    bad = run("ckpt", "ls", "/bucket/ckpt/job1//", store=tmp_path / "store")
    assert bad.returncode == 1
    assert error_line(bad) == "blobsdk: error: empty segment ('//' or trailing '/') in '/bucket/ckpt/job1//x'"


def bar_of(progress: PrefetchProgress) -> str:
    from tqdm import tqdm

    stream = io.StringIO()
    with tqdm(unit="B", unit_scale=True, file=stream, mininterval=0) as bar:
        _show(bar, progress)
        bar.refresh()
    return stream.getvalue().rsplit("\r", 1)[-1]


def test_the_prefetch_bar_counts_the_datasets_bytes_and_the_copies_apart():
    """item 11: 200 MiB in 2 L3 copies is a 210M bar (tqdm's SI units), copies apart."""
    mib = 1 << 20
    half = PrefetchProgress(100, 200, 200 * mib, 400 * mib, 0, 100, 200 * mib)
    assert dataset_bytes_done(half) == 100 * mib
    text = bar_of(half)
    assert " 105M/210M " in text and "100/200 chunk copies, 210MB copied" in text
    l2 = PrefetchProgress(3, 6, 3 * mib, 6 * mib, 0, 6, 6 * mib)
    assert " 3.15M/6.29M " in bar_of(l2) and "3/6 chunks" in bar_of(l2) and "copies" not in bar_of(l2)
    assert dataset_bytes_done(PrefetchProgress()) == 0


def test_version():
    """item 12."""
    result = run("--version")
    assert result.returncode == 0 and result.stdout.decode() == f"blobsdk {metadata.version('blobsdk')}\n"


def test_stats_on_a_local_store_says_what_it_shows_and_the_stores_totals(store):
    """item 12: each call is a new client, so its counters are zero: the report says so and
    gives the store's totals."""
    report = json.loads(ok("stats", store=store))
    assert report["about"] == STATS_NOTE and report["store"] == {"blobs": 3, "bytes": 9}
    assert report["client"]["l4"]["hits"] == 0 and report["nodes"] == {}
