"""put_get: the foundation's data path against the plainest baselines, in one run.

- ``get_vs_file``: embedded ``get`` of a blob vs ``readinto`` of the same bytes from a local
  file into a new bytearray (both from the page cache).  Goal >= 0.9.
- ``put_vs_file``: embedded ``put`` vs ``write`` + ``fsync`` of the same bytes (best of 2).
  Goal >= 0.5.
- ``cluster_get_vs_http``: cluster ``get`` (API server + 3 block servers, separate
  processes) vs one plain aiohttp GET of the same bytes from a trivial aiohttp server
  process.  Goal >= 0.5.
- ``plan_p50_ms`` / ``plan_p99_ms``: getReadPlan latency through the API server, single
  path; ``plan_batch100_*``: a batch of 100 paths.  Goal p50 single <= 2 ms.

Each get and its baseline are measured interleaved (benchmarks/_cpu.py): one of each per
round, the order reversed every other round, 7 rounds with ``--quick`` and 15 in a full run,
of the same 256 MiB blob; a ratio is the median of the per-round ratios, with ``_min`` and
``_max``.  Client CPU per GB of each (``*_cpu_s_per_GB``), against two floors measured in
the same run: ``floor_cpu_s_per_GB`` (memcpy into a reused buffer + xxh3: ``*_cpu_vs_floor``,
goal <= 1.5) and ``fresh_floor_cpu_s_per_GB`` (the same into a new 256 MiB buffer, as a
get's result is: every page faulted in and zeroed by the kernel at its first touch).
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
from blobsdk.metadata import HttpMetadataStore
from blobsdk.net import new_session
from servers.cluster import start_cluster

from ._cpu import CPU_GOAL, floor_cpu_s_per_gb, fresh_floor_cpu_s_per_gb, interleave, record_cpu_vs, record_ratio, record_rows
from ._report import Report, best_of, percentile

MiB = 1 << 20
SIZE = 256 * MiB  # quick and full alike: the same measurement, quick in fewer rounds
CHUNK = 4 * MiB  # the floor's sample: one chunk
QUICK_ROUNDS = 7
FULL_ROUNDS = 15
PUT_REPEATS = 2
NO_L1 = L1Config(capacity_bytes=0)  # every get reads L4: this benchmark is about the data path, not caches


async def run(quick: bool = False) -> Report:
    size = SIZE
    rounds = QUICK_ROUNDS if quick else FULL_ROUNDS
    data = os.urandom(size)
    report = Report("put_get")
    with tempfile.TemporaryDirectory(prefix="bench-put-get-") as tmp:
        root = Path(tmp)
        await _embedded(report, root, data, rounds)
        await _cluster(report, root, data, rounds, plan_samples=300 if quick else 2000)
    m = report.metrics
    m["floor_cpu_s_per_GB"] = floor_cpu_s_per_gb(data[:CHUNK])
    m["fresh_floor_cpu_s_per_GB"] = fresh_floor_cpu_s_per_gb(data[:CHUNK], size)
    for name in ("embedded_get", "cluster_get"):
        report.ratios[f"{name}_cpu_vs_floor"] = m[f"{name}_cpu_s_per_GB"] / m["floor_cpu_s_per_GB"]
        report.goals[f"{name}_cpu_vs_floor"] = CPU_GOAL
        report.ratios[f"{name}_cpu_vs_fresh_floor"] = m[f"{name}_cpu_s_per_GB"] / m["fresh_floor_cpu_s_per_GB"]
    report.goals.update(put_vs_file=">= 0.5", plan_p50_ms="<= 2")
    return report


async def _embedded(report: Report, root: Path, data: bytes, rounds: int) -> None:
    size = len(data)
    plain = root / "plain.bin"
    put_file = await best_of(PUT_REPEATS, lambda: asyncio.to_thread(_write_fsync, plain, data))
    async with blobsdk.Client.local(root / "embedded", l1=NO_L1) as client:
        counter = iter(range(1_000_000))
        put_ours = await best_of(PUT_REPEATS, lambda: client.put(f"/bench/put-{next(counter)}", data))
        await client.put("/bench/blob", data)
        await client.get("/bench/blob")

        async def get() -> int:
            return len(await client.get("/bench/blob"))

        async def read_file() -> int:
            return len(await asyncio.to_thread(_readinto, plain, size))

        rows = await interleave(rounds, {"file_read": read_file, "embedded_get": get})
    record_rows(report, rows)
    record_ratio(report, "get_vs_file", rows["embedded_get"], rows["file_read"], ">= 0.9")
    record_cpu_vs(report, rows, [("embedded_get", "file_read")])
    report.metrics["embedded_put_MBps"] = size / put_ours / 1e6
    report.metrics["file_write_fsync_MBps"] = size / put_file / 1e6
    report.ratios["put_vs_file"] = put_file / put_ours


async def _cluster(report: Report, root: Path, data: bytes, rounds: int, plan_samples: int) -> None:
    with TrivialServer(root, len(data)) as url:
        async with (
            new_session(Timeouts()) as session,
            start_cluster(root / "cluster", block_servers=3, trackers=0) as cluster,
            blobsdk.Client(msgspec.structs.replace(cluster.config, l1=NO_L1)) as client,
        ):
            await _http_get(session, url)  # warm the connection
            await client.put("/bench/blob", data)
            await client.get("/bench/blob")

            async def get() -> int:
                return len(await client.get("/bench/blob"))

            rows = await interleave(rounds, {"http_get": lambda: _http_get(session, url), "cluster_get": get})
            await _plan_latency(report, cluster.config, client, plan_samples)
    record_rows(report, rows)
    record_ratio(report, "cluster_get_vs_http", rows["cluster_get"], rows["http_get"], ">= 0.5")
    record_cpu_vs(report, rows, [("cluster_get", "http_get")])


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


def _write_fsync(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _readinto(path: Path, size: int) -> bytearray:
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(buf)
        while view:
            n = f.readinto(view)
            if not n:
                raise EOFError(path)
            view = view[n:]
    return buf


async def _http_get(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as resp:
        body = await resp.read()
    assert resp.status == 200 and len(body) > 0
    return len(body)


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

    @property
    def pid(self) -> int:
        return self._proc.pid

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(10)
