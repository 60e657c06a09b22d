"""The ``blobsdk`` command: ``blobsdk.cli.main`` in this process, and as a real subprocess
(``python -m blobsdk``) where a test needs one (fd 0, the entry point)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from unittest import mock

import pytest

import blobsdk
from blobsdk.cli import MMAP_THRESHOLD, NO_STORE, main
from blobsdk.runtime.progress import ProgressLine
from blobsdk.testing.plans import bad_plan
from tests.helpers import ROOT, stored_files
from tests.metadata.unchecked import plant_plan

RESERVED_TAIL = " (it can be read and listed, not written or deleted)"


def run(
    *args: str,
    store: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes = b"",
    umask: int = -1,
    process: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """``blobsdk [--local STORE] ARGS`` with no ``BLOBSDK_*`` variables but ``env``'s: its exit
    code, stdout and stderr.  In this process (``main(argv)`` with the standard streams, the
    environment and the umask swapped for the call) unless ``process``: an interpreter per
    call cost 1-3 s on a loaded 2-core box, most of the CLI tests' time."""
    argv = [*(["--local", str(store)] if store else []), *args]
    if process:
        base = {k: v for k, v in os.environ.items() if not k.startswith("BLOBSDK_")}
        full = {**base, "PYTHONPATH": str(ROOT), **(env or {})}
        command = [sys.executable, "-m", "blobsdk", *argv]
        return subprocess.run(command, cwd=ROOT, env=full, input=stdin, capture_output=True, timeout=120, umask=umask)
    out, err = io.BytesIO(), io.BytesIO()
    with _called_as_a_command(env or {}, stdin, umask, out, err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors, --version, --help
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["blobsdk", *argv], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _called_as_a_command(env: dict[str, str], stdin: bytes, umask: int, out: io.BytesIO, err: io.BytesIO) -> Iterator[None]:
    environ = {**{k: v for k, v in os.environ.items() if not k.startswith("BLOBSDK_")}, **env}
    streams = [io.TextIOWrapper(b, encoding="utf-8", write_through=True) for b in (io.BytesIO(stdin), out, err)]
    old_umask = os.umask(umask) if umask >= 0 else None
    try:
        with (
            mock.patch.dict(os.environ, environ, clear=True),
            mock.patch.multiple(sys, stdin=streams[0], stdout=streams[1], stderr=streams[2]),
        ):
            yield
    finally:
        if old_umask is not None:
            os.umask(old_umask)
        for stream in streams:
            stream.flush()
            stream.detach()


def ok(*args: str, store: Path, stdin: bytes = b"", process: bool = False) -> bytes:
    result = run(*args, store=store, stdin=stdin, process=process)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    """The one stderr line of a failed command (and no traceback)."""
    lines = result.stderr.decode().strip().splitlines()
    assert "Traceback" not in result.stderr.decode()
    return lines[-1]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def test_put_get_cat_stat_ls_rm_round_trip(tmp_path, store):
    data = os.urandom(300_000)
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    put = json.loads(ok("put", str(tmp_path / "a.bin"), "/bkt/dir/a.bin", store=store))
    assert (put["path"], put["size"], put["version"]) == ("/bkt/dir/a.bin", len(data), 1)
    assert json.loads(ok("put", str(tmp_path / "empty"), "/bkt/empty", store=store))["size"] == 0

    ok("get", "/bkt/dir/a.bin", str(tmp_path / "out.bin"), store=store)
    assert (tmp_path / "out.bin").read_bytes() == data
    assert ok("get", "/bkt/dir/a.bin", "-", "--offset", "1000", "--length", "500", store=store) == data[1000:1500]
    assert ok("get", "/bkt/dir/a.bin", "--offset", str(len(data) - 7), "--length", "100", store=store) == data[-7:]
    assert ok("cat", "/bkt/dir/a.bin", store=store) == data
    assert ok("cat", "/bkt/empty", store=store) == b""

    stat = json.loads(ok("stat", "/bkt/dir/a.bin", store=store))
    assert stat["size"] == len(data) and stat["etag"] == put["etag"] and stat["version"] == 1
    assert ok("ls", "/bkt/", store=store).decode().splitlines() == ["/bkt/dir/a.bin", "/bkt/empty"]
    long = ok("ls", "/bkt/dir/", "--long", store=store).decode().split()
    assert long[0] == str(len(data)) and long[1] == "v1" and long[-1] == "/bkt/dir/a.bin"

    assert json.loads(ok("rm", "/bkt/dir/a.bin", store=store))["path"] == "/bkt/dir/a.bin"
    assert ok("ls", "/bkt/", store=store).decode().splitlines() == ["/bkt/empty"]
    gone = run("stat", "/bkt/dir/a.bin", store=store)
    assert gone.returncode == 1 and error_line(gone).startswith("blobsdk: error: ")


def test_put_and_rm_honour_if_version(tmp_path, store):
    (tmp_path / "f").write_bytes(b"x")
    ok("put", str(tmp_path / "f"), "/b/f", "--if-version", "0", store=store)
    again = run("put", str(tmp_path / "f"), "/b/f", "--if-version", "0", store=store)
    assert again.returncode == 1 and "blobsdk: error:" in error_line(again)
    assert run("rm", "/b/f", "--if-version", "7", store=store).returncode == 1
    assert json.loads(ok("rm", "/b/f", "--if-version", "1", store=store))["version"] == 1


def test_import_tree_skips_symlinks_and_round_trips(tmp_path, store):
    src = tmp_path / "src"
    files = {
        "top.txt": b"top",
        "a/one.bin": os.urandom(1000),
        "a/b/c/deep.bin": b"deep",
        "a/empty": b"",
        "big/large.bin": os.urandom(5 << 20),  # large enough to be mapped, not read
    }
    for rel, content in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(content)
    (src / "link.txt").symlink_to(src / "top.txt")
    (src / "linkdir").symlink_to(src / "a", target_is_directory=True)

    result = run("import", str(src), "/ds/v1", store=store)
    assert result.returncode == 0, result.stderr.decode()
    assert "5 files" in result.stderr.decode() and "skipped: 2 symlinks" in result.stderr.decode()
    listed = ok("ls", "/ds/v1/", store=store).decode().splitlines()
    assert listed == sorted(f"/ds/v1/{rel}" for rel in files)
    for rel, content in files.items():
        assert ok("cat", f"/ds/v1/{rel}", store=store) == content


def test_import_reports_invalid_paths_and_imports_the_rest(tmp_path, store):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_bytes(b"good")
    bad = os.path.join(os.fsencode(src), b"bad-\xff.txt")  # not UTF-8: no valid blob path
    with open(bad, "wb") as f:
        f.write(b"bad")
    result = run("import", str(src), "/ds/", store=store)
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert "invalid blob path" in stderr and "bad-" in stderr and "1 invalid paths" in stderr
    assert ok("ls", "/ds/", store=store).decode().splitlines() == ["/ds/good.txt"]


def test_invalid_path_is_one_line_exit_1(tmp_path, store):
    (tmp_path / "f").write_bytes(b"x")
    result = run("put", str(tmp_path / "f"), "no-slash", store=store)
    assert result.returncode == 1
    assert error_line(result) == "blobsdk: error: path must be absolute (start with '/'): 'no-slash'"
    assert len(result.stderr.decode().strip().splitlines()) == 1
    dots = run("cat", "/b/../etc", store=store)
    assert dots.returncode == 1 and "'..' segment" in error_line(dots)


def test_the_reserved_namespace_is_one_line_exit_1_and_readable(tmp_path, store):
    """``/{bucket}/.blobsdk/`` is blobsdk's own (blobsdk/chunks/names.py): written or deleted, it is an
    InvalidPath like any other; read, it is a blob like any other."""
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "tree" / ".blobsdk").mkdir(parents=True)
    (tmp_path / "tree" / ".blobsdk" / "x").write_bytes(b"x")
    (tmp_path / "tree" / "y").write_bytes(b"y")
    entry = "/b/.blobsdk/chunks/" + "0" * 32
    message = f"blobsdk: error: path {{!r}}: /b/.blobsdk/ is reserved for blobsdk's own records{RESERVED_TAIL}"
    for args, path in (
        (["put", str(tmp_path / "f"), entry], entry),
        (["rm", entry], entry),
        (["import", str(tmp_path / "tree"), "/b/.blobsdk/"], "/b/.blobsdk/"),
    ):
        result = run(*args, store=store)
        assert (result.returncode, error_line(result)) == (1, message.format(path)), args
        assert len(result.stderr.decode().strip().splitlines()) == 1
    skipped = run("import", str(tmp_path / "tree"), "/b/", store=store)  # a local .blobsdk directory: skipped
    assert skipped.returncode == 1 and "invalid blob path" in skipped.stderr.decode()
    assert ok("ls", "/b/", store=store).decode().splitlines() == ["/b/y"]
    assert ok("ls", "/b/.blobsdk/", store=store) == b""


def test_cat_of_a_bad_plan_is_one_line_exit_1_not_a_memory_error(store):
    store.mkdir()
    asyncio.run(plant_plan(store / "meta.sqlite", "/b/huge", bad_plan("/b/huge", {"size": 2**50, "chunks": ()})))
    for command in (["cat", "/b/huge"], ["get", "/b/huge", "--offset", "5", "--length", "3"]):
        result = run(*command, store=store)
        assert result.returncode == 1 and result.stdout == b""
        assert error_line(result) == (
            "blobsdk: error: metadata store returned an invalid plan: "
            "plan for '/b/huge': chunks cover 0 bytes, size is 1125899906842624"
        )


def test_a_plan_row_corrupted_by_hand_is_one_line_exit_1_not_the_usage_code(tmp_path, store):
    """issue 20 item 7: msgspec's DecodeError (a ValueError) used to exit 2, the usage code."""
    (tmp_path / "in").write_bytes(b"data")
    ok("put", str(tmp_path / "in"), "/b/x", store=store)
    with sqlite3.connect(store / "meta.sqlite") as conn:
        conn.execute("UPDATE plans SET plan = x'c1' WHERE path = '/b/x'")
    conn.close()
    for command in (["cat", "/b/x"], ["get", "/b/x", str(tmp_path / "out")], ["stat", "/b/x"]):
        result = run(*command, store=store)
        assert result.returncode == 1 and result.stdout == b""
        assert error_line(result) == (
            "blobsdk: error: the stored plan of '/b/x' is corrupt: MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)"
        )


def test_missing_blob_exits_1(store):
    ok("--create", "ls", "/", store=store)
    result = run("cat", "/b/missing", store=store)
    assert result.returncode == 1 and result.stdout == b""
    assert error_line(result).startswith("blobsdk: error: ") and "/b/missing" in error_line(result)


def test_missing_local_file_exits_1(tmp_path, store):
    result = run("put", str(tmp_path / "nope"), "/b/x", store=store)
    assert result.returncode == 1 and "No such file" in error_line(result)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_put_to_an_unreachable_cluster_is_one_line_exit_1(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = tmp_path / "client.toml"
    config.write_text(f'api_url = "{url}"\nblock_urls = ["{url}"]\n')
    (tmp_path / "big").write_bytes(os.urandom(MMAP_THRESHOLD + 1))  # mapped, not read
    (tmp_path / "small").write_bytes(b"x" * 1000)
    for name in ("big", "small"):
        result = run("--config", str(config), "put", str(tmp_path / name), "/b/x")
        assert result.returncode == 1 and result.stdout == b""
        line = error_line(result)  # no traceback: the BufferError of closing a mapped file with views left
        assert line == (
            "blobsdk: error: a write needs 1 of the 1 block servers and 1 failed: connection refused at"
            f" {url.removeprefix('http://')} (nothing listens there: the cluster is down, or client.toml is from an earlier run)"
        )
        assert len(result.stderr.decode().strip().splitlines()) == 1


DOWN = "(nothing listens there: the cluster is down, or client.toml is from an earlier run)"


def test_ls_with_the_api_server_down_names_it_and_the_likely_cause(tmp_path):
    port = free_port()
    config = tmp_path / "client.toml"
    config.write_text(f'api_url = "http://127.0.0.1:{port}"\nblock_urls = ["http://127.0.0.1:{free_port()}"]\n')
    result = run("--config", str(config), "ls", "/bucket")
    assert result.returncode == 1 and result.stdout == b""
    assert result.stderr.decode() == (
        f"blobsdk: error: cannot reach the API server at 127.0.0.1:{port} (POST /v1/list): connection refused {DOWN}\n"
    )


def test_stats_exits_1_when_a_node_does_not_answer_after_showing_the_report(tmp_path):
    other, down = "http://127.0.0.1:1", free_port()  # port 1: nothing listens there either
    config = tmp_path / "client.toml"
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{down}"]
    config.write_text(f'api_url = "{other}"\nblock_urls = ["{other}"]\nl3_urls = {json.dumps(urls)}\n')
    result = run("--config", str(config), "stats", process=True)
    assert result.returncode == 1
    nodes = json.loads(result.stdout)["nodes"]["l3"]
    assert nodes[urls[1]] == {
        "error": f"Unreachable: cannot reach an L3 node at 127.0.0.1:{down} (GET /stats): connection refused {DOWN}"
    }
    assert json.loads(result.stdout)["metadata"] == {
        "error": f"Unreachable: cannot reach the API server at 127.0.0.1:1 (POST /v1/list): connection refused {DOWN}"
    }
    error = 'blobsdk: error: the metadata store and 2 of the 2 nodes did not answer (their "error" above)\n'
    assert result.stderr.decode() == error
    assert "exits 1 if any node did not answer" in " ".join(run("stats", "--help").stdout.decode().split())


def test_stats_exits_1_when_a_cluster_without_l3_nodes_is_down(tmp_path):
    """No L3 node to ask: the metadata store's silence is what says the cluster is down."""
    api = free_port()
    config = tmp_path / "client.toml"
    config.write_text(f'api_url = "http://127.0.0.1:{api}"\nblock_urls = ["http://127.0.0.1:{free_port()}"]\n')
    result = run("--config", str(config), "stats", process=True)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["nodes"] == {} and report["metadata"] == {
        "error": f"Unreachable: cannot reach the API server at 127.0.0.1:{api} (POST /v1/list): connection refused {DOWN}"
    }
    assert result.stderr.decode() == 'blobsdk: error: the metadata store did not answer (their "error" above)\n'


def test_stats_takes_a_refused_listing_as_the_metadata_store_answering(tmp_path, monkeypatch):
    """A tenant's token may not list ``/``: the store answered, and nothing is said."""

    async def refused(self: blobsdk.Client, prefix: str, **_: object) -> AsyncIterator[blobsdk.BlobInfo]:
        raise blobsdk.Forbidden(f"the token does not allow listing {prefix!r}")
        yield  # an async generator, as Client.list is

    monkeypatch.setattr(blobsdk.Client, "list", refused)
    config = tmp_path / "client.toml"
    config.write_text(f'api_url = "http://127.0.0.1:{free_port()}"\nblock_urls = ["http://127.0.0.1:{free_port()}"]\n')
    result = run("--config", str(config), "stats")
    assert (result.returncode, result.stderr) == (0, b"") and "metadata" not in json.loads(result.stdout)


@pytest.mark.parametrize("size", [0, 6, MMAP_THRESHOLD + 1])
def test_put_of_stdin_stores_what_was_piped(store, size):
    data = os.urandom(size)
    info = json.loads(ok("put", "/dev/stdin", "/b/piped", store=store, stdin=data, process=True))  # fd 0
    assert info["size"] == size
    assert ok("cat", "/b/piped", store=store) == data


def test_put_of_a_proc_file_stores_its_contents(store):
    info = json.loads(ok("put", "/proc/self/status", "/b/status", store=store))
    assert info["size"] > 0  # /proc files report st_size 0
    assert ok("cat", "/b/status", store=store).startswith(b"Name:")


@pytest.mark.parametrize(
    ("grace", "message"),
    [
        ("nan", "argument --grace: must be a finite number of seconds, got nan"),
        ("inf", "argument --grace: must be a finite number of seconds, got inf"),
        ("-inf", "argument --grace: must be a finite number of seconds, got -inf"),
        ("soon", "argument --grace: not a number of seconds: 'soon'"),
    ],
)
def test_gc_grace_must_be_a_finite_number(store, grace, message):
    result = run("gc", f"--grace={grace}", store=store)
    assert result.returncode == 2 and result.stdout == b""
    assert error_line(result) == f"blobsdk gc: error: {message}"


def test_no_store_is_a_usage_error():
    result = run("ls", "/")
    assert result.returncode == 2
    assert error_line(result) == f"blobsdk: error: {NO_STORE}"


def test_store_from_environment_and_bad_config(tmp_path):
    missing = run("ls", "/", env={"BLOBSDK_CONFIG": str(tmp_path / "missing.toml")})
    assert missing.returncode == 2 and "cannot load client config" in error_line(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text('api_url = "http://127.0.0.1:1"\n')  # no block_urls
    result = run("--config", str(bad), "ls", "/")
    assert result.returncode == 2 and "cannot load client config" in error_line(result)


@pytest.mark.parametrize(
    "args", [["frobnicate"], ["get", "/b/x", "--offset", "-1"], ["--local", "a", "--config", "b", "ls", "/"]]
)
def test_usage_errors_exit_2(args):
    assert run(*args).returncode == 2
    assert run(*args, process=True).returncode == 2  # the real entry point too


def test_gc(tmp_path, store):
    (tmp_path / "f").write_bytes(b"x" * 1000)
    ok("put", str(tmp_path / "f"), "/b/f", store=store)
    short = run("gc", "--grace", "5", store=store)
    assert short.returncode == 2 and "max_write_seconds" in error_line(short)
    report = json.loads(ok("gc", "--dry-run", store=store))
    assert report["blocks_scanned"] >= 1 and report["blocks_deleted"] == 0 and report["dry_run"] is True
    stats = json.loads(ok("stats", store=store))
    assert stats["client"]["l4"]["enabled"] is True and stats["nodes"] == {}


def test_demo_command(tmp_path):
    result = run("demo", "--dir", str(tmp_path / "demo"), "--size-mb", "3")
    assert result.returncode == 0, result.stderr.decode()
    assert "OK: every byte verified" in result.stdout.decode()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_rewrites_in_place_on_a_tty():
    stream = _Tty()
    progress = ProgressLine(stream, interval=0.0)
    progress.update(3, 3 << 20)
    progress.note("a message")
    progress.finish()
    text = stream.getvalue()
    assert text.startswith("\r\x1b[K3 files, 3.0 MiB, ") and "\r\x1b[Ka message\n" in text and text.endswith("MiB/s\n")


def test_progress_line_prints_lines_at_an_interval_elsewhere():
    stream = io.StringIO()
    progress = ProgressLine(stream, interval=3600.0)
    for n in range(1, 100):
        progress.update(n, n * 1024)
    assert stream.getvalue() == ""  # not yet due
    progress.finish()
    assert stream.getvalue().startswith("99 files, 0.1 MiB") and "\r" not in stream.getvalue()


def test_scrub_verifies_every_block_and_exits_1_for_a_copy_it_cannot_repair(tmp_path, store):
    (tmp_path / "f").write_bytes(os.urandom(10_000))
    ok("put", str(tmp_path / "f"), "/b/f", store=store)
    healthy = run("scrub", store=store)
    assert healthy.returncode == 0, healthy.stderr.decode()
    report = json.loads(healthy.stdout)
    assert (report["blocks_checked"], report["copies_checked"], report["copies_bad"], report["bytes_verified"]) == (
        1,
        1,
        0,
        10_000,
    )
    assert "1/1 blocks, " in healthy.stderr.decode()
    (block,) = stored_files(store / "blocks")
    data = bytearray(block.read_bytes())
    data[5000] ^= 0xFF
    block.write_bytes(data)
    for args in (["scrub", "--dry-run"], ["scrub"]):  # a sole copy: nothing to repair it from
        bad = run(*args, store=store)
        report = json.loads(bad.stdout)
        assert bad.returncode == 1 and (report["copies_bad"], report["copies_repaired"], report["blocks_unrepaired"]) == (1, 0, 1)
    assert block.read_bytes() == data


# --- token ------------------------------------------------------------------------------


def test_token_keygen_create_show_and_rotate(tmp_path):
    keys = tmp_path / "keys.toml"
    made = run("token", "keygen", str(keys))
    assert made.returncode == 0 and b"keys k1; k1 signs from now on" in made.stderr
    assert keys.stat().st_mode & 0o777 == 0o600  # a secret
    token = run("token", "create", "--keys", str(keys), "--tenant", "acme", "--bucket", "train", "--ttl", "2h")
    assert token.returncode == 0
    old = token.stdout.decode().strip()
    assert old.startswith("bst1.k1.")
    claims = json.loads(run("token", "show", old, "--keys", str(keys)).stdout)
    assert (claims["tenant"], claims["buckets"], claims["admin"], claims["expires"] - claims["not_before"]) == (
        "acme",
        ["train"],
        False,
        7200,
    )
    assert b"keys k1, k2; k2 signs from now on" in run("token", "keygen", str(keys)).stderr
    new = run("token", "create", "--keys", str(keys), "--tenant", "ops", "--admin", "--ttl", "90s").stdout.decode().strip()
    assert new.startswith("bst1.k2.") and json.loads(run("token", "show", new).stdout)["admin"] is True
    assert run("token", "show", old, "--keys", str(keys)).returncode == 0  # still verifies after rotation


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["create", "--tenant", "a", "--bucket", "b", "--ttl", "1h"], 2, "the following arguments are required: --keys"),
        (["create", "--keys", "K", "--tenant", "a", "--bucket", "b", "--ttl", "0"], 2, "must be a positive duration, got '0'"),
        (["create", "--keys", "K", "--tenant", "a", "--bucket", "b", "--ttl", "1y"], 2, "not a duration: '1y'"),
        (
            ["create", "--keys", "K", "--tenant", "default", "--bucket", "b", "--ttl", "1h"],
            2,
            "reserved for a server's static --token",
        ),
        (
            ["create", "--keys", "K", "--tenant", "a", "--ttl", "1h"],
            2,
            "a token needs at least one bucket ('*' for all) or admin",
        ),
        (["create", "--keys", "MISSING", "--tenant", "a", "--bucket", "b", "--ttl", "1h"], 2, "cannot read keyring"),
        (["show", "not-a-token"], 2, "not a signed blobsdk token"),
        (["show", "bst1.k1.AAAA.BBBB", "--keys", "K"], 1, "bearer token signature does not verify"),
        (["keygen", "K", "--key-id", "k1"], 2, "key id 'k1' is already in the keyring"),
    ],
)
def test_token_errors_are_one_line(tmp_path, args, code, message):
    keys = tmp_path / "keys.toml"
    assert run("token", "keygen", str(keys)).returncode == 0
    argv = [str(keys) if a == "K" else str(tmp_path / "missing.toml") if a == "MISSING" else a for a in args]
    result = run("token", *argv)
    assert result.returncode == code
    assert message in error_line(result)


# --- plan and prefetch -------------------------------------------------------------------------


def test_plan_prints_the_read_plan(tmp_path, store):
    (tmp_path / "f").write_bytes(os.urandom(10_000))
    ok("put", str(tmp_path / "f"), "/b/f", store=store)
    plan = json.loads(ok("plan", "/b/f", store=store))
    assert (plan["path"], plan["size"], len(plan["chunks"])) == ("/b/f", 10_000, 1)
    assert error_line(run("plan", "/b/none", store=store)).startswith("blobsdk: error: no blob at '/b/none'")


def test_prefetch_into_l3_shows_progress_and_reports_failures(tmp_path):
    from servers.cluster import start_cluster

    with start_cluster(tmp_path / "c", block_servers=1, l3_nodes=1, trackers=0) as cluster:
        config = str(cluster.config_path)
        for i in range(3):
            (tmp_path / f"f{i}").write_bytes(os.urandom(300_000))
            assert run("--config", config, "put", str(tmp_path / f"f{i}"), f"/ds/f{i}").returncode == 0
        done = run("--config", config, "prefetch", "/ds/", "--pin-seconds", "60")
        assert done.returncode == 0, done.stderr.decode()
        report = json.loads(done.stdout)
        assert report["failed"] == {} and report["progress"]["chunks_done"] == report["progress"]["chunks_total"] == 3
        assert b"prefetch into l3" in done.stderr and b"100%" in done.stderr  # the tqdm bar
        missing = run("--config", config, "prefetch", "/ds/f0", "/ds/nope")
        assert missing.returncode == 1
        assert json.loads(missing.stdout)["failed"] == {"/ds/nope": "BlobNotFound: no blob at '/ds/nope'"}
        assert error_line(missing) == "blobsdk: error: no blob at '/ds/nope'"
        empty = run("--config", config, "prefetch", "/ds/nope/")  # issue 22 CLI item 10
        assert empty.returncode == 1 and error_line(empty) == "blobsdk: error: no blobs under '/ds/nope/'"
        assert json.loads(empty.stdout)["failed"] == {"/ds/nope/": "BlobNotFound: no blobs under '/ds/nope/'"}
        assert b"prefetch into l3" in done.stderr and b" 900k/900k " in done.stderr  # 3 x 300 kB, once each


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["prefetch", "/a/b", "--tier", "l1"], 2, "argument --tier: invalid choice: 'l1'"),
        (["prefetch", "/a/b"], 2, "prefetch warms a shared cache (--tier l3, the default: the L3 flash nodes;"),
        (["prefetch", "/a/b", "--tier", "l2"], 2, "--tier l2 warms an L2 cache, and a --local store has none"),
        (["prefetch", "/a/b", "--pin-seconds", "nan"], 2, "must be a finite number of seconds"),
    ],
)
def test_prefetch_errors(store, args, code, message):
    ok("--create", "ls", "/", store=store)
    result = run(*args, store=store)
    assert result.returncode == code and message in error_line(result)
