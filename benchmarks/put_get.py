"""put_get: the foundation's data path against the plainest baselines, in one run.

- ``get_vs_file``: embedded ``get`` of a blob vs ``readinto`` of the same bytes from a local
  file (both from the page cache).  Goal >= 0.5.
- ``put_vs_file``: embedded ``put`` vs ``write`` + ``fsync`` of the same bytes.  Goal >= 0.5.
- ``cluster_get_vs_http``: cluster ``get`` (API server + 3 block servers, separate
  processes) vs one plain aiohttp GET of the same bytes from a trivial aiohttp server
  process.  Goal >= 0.5.
- ``plan_p50_ms`` / ``plan_p99_ms``: getReadPlan latency through the API server, single
  path; ``plan_batch100_*``: a batch of 100 paths.  Goal p50 single <= 2 ms.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

import blobsdk
from blobsdk.config import L1Config, Timeouts
from blobsdk.metadata.http import HttpMetadataStore
from blobsdk.net.rpc import new_session
from servers.cluster import start_cluster

from ._report import Report, best_of, percentile

MiB = 1 << 20
NO_L1 = L1Config(capacity_bytes=0)  # every get reads L4: this benchmark is about the data path, not caches


async def run(quick: bool = False) -> Report:
    size = (64 if quick else 256) * MiB
    repeats = 2 if quick else 4
    data = os.urandom(size)
    report = Report("put_get")
    with tempfile.TemporaryDirectory(prefix="bench-put-get-") as tmp:
        root = Path(tmp)
        await _embedded(report, root, data, repeats)
        await _cluster(report, root, data, repeats, plan_samples=300 if quick else 2000)
    report.goals.update(get_vs_file=">= 0.5", put_vs_file=">= 0.5", cluster_get_vs_http=">= 0.5", plan_p50_ms="<= 2")
    return report


async def _embedded(report: Report, root: Path, data: bytes, repeats: int) -> None:
    size = len(data)
    plain = root / "plain.bin"
    put_file = await best_of(repeats, lambda: asyncio.to_thread(_write_fsync, plain, data))
    get_file = await best_of(repeats, lambda: asyncio.to_thread(_readinto, plain, size))
    async with blobsdk.Client.local(root / "embedded", l1=NO_L1) as client:
        counter = iter(range(1_000_000))
        put_ours = await best_of(repeats, lambda: client.put(f"/bench/put-{next(counter)}", data))
        await client.put("/bench/blob", data)
        get_ours = await best_of(repeats, lambda: client.get("/bench/blob"))
    _record(report, "embedded_get", size, get_ours, "file_read", get_file, "get_vs_file")
    _record(report, "embedded_put", size, put_ours, "file_write_fsync", put_file, "put_vs_file")


async def _cluster(report: Report, root: Path, data: bytes, repeats: int, plan_samples: int) -> None:
    size = len(data)
    with TrivialServer(root, size) as url:
        async with new_session(Timeouts()) as session:
            await _http_get(session, url)  # warm the connection
            get_http = await best_of(repeats, lambda: _http_get(session, url))
    async with (
        start_cluster(root / "cluster", block_servers=3) as cluster,
        blobsdk.Client(msgspec.structs.replace(cluster.config, l1=NO_L1)) as client,
    ):
        await client.put("/bench/blob", data)
        await client.get("/bench/blob")
        get_ours = await best_of(repeats, lambda: client.get("/bench/blob"))
        await _plan_latency(report, cluster.config, client, plan_samples)
    _record(report, "cluster_get", size, get_ours, "http_get", get_http, "cluster_get_vs_http")


async def _plan_latency(report: Report, config: blobsdk.ClientConfig, client: blobsdk.Client, samples: int) -> None:
    paths = [f"/bench/plan/{i:05d}" for i in range(100)]
    await client.put_many((p, b"x" * 100) for p in paths)
    async with new_session(config.timeouts) as session:
        store = HttpMetadataStore(session, config.api_url, config.token)
        single = await _latencies(samples, lambda i: store.get_plan(paths[i % 100]))
        batch = await _latencies(max(50, samples // 10), lambda i: store.get_plans(paths))
    for name, values in (("plan", single), ("plan_batch100", batch)):
        report.metrics[f"{name}_p50_ms"] = percentile(values, 0.50) * 1000
        report.metrics[f"{name}_p99_ms"] = percentile(values, 0.99) * 1000


async def _latencies(n: int, call) -> list[float]:
    for i in range(20):  # warm-up
        await call(i)
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - start)
    return samples


def _record(report: Report, ours: str, size: int, t_ours: float, base: str, t_base: float, ratio: str) -> None:
    report.metrics[f"{ours}_MBps"] = size / t_ours / 1e6
    report.metrics[f"{base}_MBps"] = size / t_base / 1e6
    report.ratios[ratio] = t_base / t_ours


def _write_fsync(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _readinto(path: Path, size: int) -> None:
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(buf)
        while view:
            n = f.readinto(view)
            if not n:
                raise EOFError(path)
            view = view[n:]


async def _http_get(session: aiohttp.ClientSession, url: str) -> None:
    async with session.get(url) as resp:
        body = await resp.read()
    assert resp.status == 200 and len(body) > 0


class TrivialServer:
    """A trivial aiohttp server process that serves ``size`` bytes at /blob."""

    def __init__(self, root: Path, size: int) -> None:
        self._port_file = root / "trivial.port"
        self._size = size

    def __enter__(self) -> str:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._trivial_server", str(self._size), str(self._port_file)],
            cwd=Path(__file__).resolve().parent.parent,
        )
        deadline = time.monotonic() + 20
        while not self._port_file.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("trivial server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self._port_file.read_text()}/blob"

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(10)
