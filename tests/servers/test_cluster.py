"""servers.cluster: a whole local cluster of real server processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import blobsdk
from blobsdk.config import ClientConfig, WriteConfig
from servers.cluster import (
    KINDS,
    Cluster,
    ClusterError,
    ClusterOptions,
    ServerKind,
    start_cluster,
)
from tests.helpers import ROOT

START_TIMEOUT = 60.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


@pytest.fixture
def cluster_cli(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``python -m servers.cluster --dir tmp`` running, its client.toml written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "servers.cluster", "--dir", str(tmp_path), "--block-servers", "3"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: (tmp_path / "client.toml").exists() or proc.poll() is not None, START_TIMEOUT, "client.toml")
        assert proc.poll() is None, proc.stderr.read().decode()
        yield proc, tmp_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _servers(dir: Path) -> list[dict]:
    return json.loads((dir / "cluster.json").read_text())


async def test_cli_serves_a_client_and_stops_every_server_on_sigterm(cluster_cli):
    proc, dir = cluster_cli
    servers = _servers(dir)
    assert [s["name"] for s in servers] == ["api", "block-0", "block-1", "block-2", "l3-0", "l3-1"]
    config = ClientConfig.from_toml(dir / "client.toml")
    assert config.api_url == servers[0]["url"] and list(config.block_urls) == [s["url"] for s in servers[1:4]]
    assert list(config.l3_urls) == [s["url"] for s in servers[4:]]

    data = os.urandom(3 << 20)
    async with blobsdk.Client(config) as client:
        await client.put("/bkt/blob", data)
        assert bytes(await client.get("/bkt/blob")) == data

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert not [s["name"] for s in servers if _alive(s["pid"])]


def test_cli_stops_the_rest_and_exits_1_when_a_server_dies(cluster_cli):
    proc, dir = cluster_cli
    servers = _servers(dir)
    os.kill(servers[2]["pid"], signal.SIGKILL)
    assert proc.wait(20) == 1
    assert "block-1 exited unexpectedly" in proc.stderr.read().decode()
    assert not [s["name"] for s in servers if _alive(s["pid"])]


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


async def test_reads_survive_dead_block_servers_and_the_token_is_required(tmp_path):
    async with start_cluster(tmp_path, block_servers=3, token="s3cret") as cluster:
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


def test_a_server_that_fails_to_start_stops_the_others(tmp_path):
    broken = ServerKind(
        name="broken", module="servers.no_such_server", count=lambda o: 1, args=lambda launch, i: [], to_config=lambda urls: {}
    )
    cluster = Cluster(tmp_path, ClusterOptions(block_servers=1, l3_nodes=0), kinds=(*KINDS, broken))
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
    cluster = start_cluster(tmp_path, block_servers=2)

    async def use() -> None:
        async with cluster:
            raise AssertionError("the start should have been cancelled")

    task = asyncio.create_task(use())
    await asyncio.sleep(0.3)  # the servers are spawned, not yet healthy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cluster.processes and all(p.popen.poll() is not None for p in cluster.processes)
