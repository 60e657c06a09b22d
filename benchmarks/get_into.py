"""get_into: reads into the caller's memory against ``get`` (and ``get`` then a copy into the
caller's array, what such a reader did before), in one run, interleaved.

``python -m benchmarks get_into [--quick] [--json FILE]``.  Each scenario reads the same blobs
with each method in turn, ``rounds`` times, the order of the methods turned each round; each
round's ratio is a method's time over ``get_into``'s (or ``get_many_into``'s), reported as the
median with the round's lowest and highest (``_lo``, ``_hi``).  Beside each, the client's CPU
per GB delivered (``time.process_time``: every thread of this process, the executor's reads
and hashes included; in the cluster scenario the servers are other processes).

Scenarios (FULL / QUICK):

- ``4m_l4``: embedded, no L1, 64 / 16 blobs of 4 MiB (one chunk each), one read at a time,
  from the page cache: ``get`` hands over a buffer of its own per read; ``get_into`` reads
  each chunk straight into one reused numpy array and hashes it there.
- ``4m_l1``: the same blobs held in L1: ``get`` copies out of L1 into a new bytearray,
  ``get_into`` into the reused array.
- ``16k_l4``: embedded, no L1, 4096 / 1024 blobs of 16 KiB written by ``put_many`` (packed in
  shared blocks), one read at a time: the cost of one small read.
- ``16k_batch``: the same blobs in batches of 64: ``gather`` of 64 ``get`` then a copy of each
  into a batch array, against one ``get_many_into`` into it (a block's chunks in one request).
- ``4m_cluster``: a lone block server process over HTTP, no L1, the 4 MiB blobs.
- ``loader``: a torch DataLoader, 4 workers, over 300 / 100 embedded samples of 64 KiB-8 MiB
  (log-uniform), no L1: ``BlobDataset`` and a collate copy against ``BlobBatchDataset``
  (``loader_into_vs_map``, and each one's workers' CPU per GB).

Measured (three full runs, shared 2-core machine at load 7-10; docs/benchmarks.md has the
table): ``get_into`` over ``get`` + copy 1.9-2.8 (``4m_l4``), 1.7-1.8 (``4m_l1``), 1.3
(``4m_cluster``); client CPU for 4 MiB embedded reads 0.19-0.25 s/GB against 0.36-0.38 for
``get``; ``get_many_into`` over 64 ``get`` + copies 7.4-9.1 (``16k_batch``).
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

import blobsdk
from blobsdk.config import L1Config, WriteConfig
from servers.cluster import start_cluster

from ._report import Report

MiB = 1 << 20
KiB = 1 << 10
NO_L1 = L1Config(capacity_bytes=0)
BATCH = 64
Method = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Sizes:
    big: int  # 4 MiB blobs
    small: int  # 16 KiB blobs
    rounds: int
    loader_samples: int  # the DataLoader scenario's samples, 64 KiB-8 MiB


FULL = Sizes(big=64, small=4096, rounds=7, loader_samples=300)
QUICK = Sizes(big=16, small=1024, rounds=3, loader_samples=100)


@dataclass
class Scenario:
    """One scenario's methods, timed in turn, and its rounds' wall and CPU seconds."""

    name: str
    nbytes: int  # delivered by one call of a method
    methods: dict[str, Method]
    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    async def play(self, rounds: int) -> None:
        names = list(self.methods)
        for method in names:  # warm: page cache, plan cache, buffers
            await self.methods[method]()
        for r in range(rounds):
            for method in names if r % 2 == 0 else names[::-1]:
                wall, cpu = time.perf_counter(), time.process_time()
                await self.methods[method]()
                self.wall.setdefault(method, []).append(time.perf_counter() - wall)
                self.cpu.setdefault(method, []).append(time.process_time() - cpu)

    def report(self, out: Report, ours: str) -> None:
        gb = self.nbytes / 1e9
        for method in self.methods:
            out.metrics[f"{self.name}_{method}_GBps"] = gb / statistics.median(self.wall[method])
            out.metrics[f"{self.name}_{method}_cpu_s_per_GB"] = statistics.median(self.cpu[method]) / gb
            if method == ours:
                continue
            ratios = [theirs / mine for theirs, mine in zip(self.wall[method], self.wall[ours], strict=True)]
            key = f"{self.name}_{ours}_vs_{method}"
            out.ratios[key] = statistics.median(ratios)
            out.metrics[f"{key}_lo"], out.metrics[f"{key}_hi"] = min(ratios), max(ratios)
        _say(self.name, self.wall, self.cpu, gb)


def _say(name: str, wall: dict[str, list[float]], cpu: dict[str, list[float]], gb: float) -> None:
    parts = [f"{m} {gb / statistics.median(w):.2f} GB/s, {statistics.median(cpu[m]) / gb:.2f} CPU-s/GB" for m, w in wall.items()]
    print(f"{name:>11}: " + "; ".join(parts), flush=True)


def one_at_a_time(client: blobsdk.Client, paths: list[str], size: int) -> dict[str, Method]:
    """``get``, ``get`` + a copy into the caller's array, ``get_into`` that array: each path once."""
    array = np.empty(size, np.uint8)
    view = memoryview(array)

    async def get() -> None:
        for path in paths:
            await client.get(path)

    async def get_copy() -> None:
        for path in paths:
            data = await client.get(path)
            view[: len(data)] = data

    async def get_into() -> None:
        for path in paths:
            await client.get_into(path, array)

    return {"get": get, "get_copy": get_copy, "get_into": get_into}


def batches(client: blobsdk.Client, paths: list[str], size: int) -> dict[str, Method]:
    """Batches of BATCH paths into one array: ``gather`` of ``get`` + copies, or ``get_many_into``."""
    array = np.empty(BATCH * size, np.uint8)
    view = memoryview(array)
    cut = [paths[i : i + BATCH] for i in range(0, len(paths), BATCH)]

    async def get_copy() -> None:
        for batch in cut:
            at = 0
            for data in await asyncio.gather(*(client.get(p) for p in batch)):
                view[at : at + len(data)] = data
                at += len(data)

    async def get_many_into() -> None:
        for batch in cut:
            await client.get_many_into(batch, array)

    return {"get_copy": get_copy, "get_many_into": get_many_into}


async def run(quick: bool = False) -> Report:
    sizes = QUICK if quick else FULL
    out = Report("get_into")
    big = [(f"/bench/big/{i:04d}", os.urandom(4 * MiB)) for i in range(sizes.big)]
    small = [(f"/bench/small/{i:05d}", os.urandom(16 * KiB)) for i in range(sizes.small)]
    with tempfile.TemporaryDirectory(prefix="bench-get-into-") as tmp:
        root = Path(tmp)
        async with blobsdk.Client.local(root / "embedded", l1=NO_L1) as client:
            await client.put_many(big)
            await client.put_many(small)
            scenarios = [
                (Scenario("4m_l4", 4 * MiB * len(big), one_at_a_time(client, _paths(big), 4 * MiB)), "get_into"),
                (Scenario("16k_l4", 16 * KiB * len(small), one_at_a_time(client, _paths(small), 16 * KiB)), "get_into"),
                (Scenario("16k_batch", 16 * KiB * len(small), batches(client, _paths(small), 16 * KiB)), "get_many_into"),
            ]
            for scenario, ours in scenarios:
                await scenario.play(sizes.rounds)
                scenario.report(out, ours)
        async with blobsdk.Client.local(root / "embedded", l1=L1Config(capacity_bytes=2 * 4 * MiB * len(big))) as client:
            scenario = Scenario("4m_l1", 4 * MiB * len(big), one_at_a_time(client, _paths(big), 4 * MiB))
            await scenario.play(sizes.rounds)  # the warm-up fills L1
            assert client.stats()["l4"]["hits"] == len(big), "L1 did not hold the blobs"
            scenario.report(out, "get_into")
        await _cluster(root / "cluster", big, sizes, out)
        await asyncio.to_thread(_loaders, root / "loader", sizes, out)
    return out


def _loaders(root: Path, sizes: Sizes, out: Report) -> None:
    """``loader``: a DataLoader (4 workers, persistent, shuffled, batches of 8) over an embedded
    store without L1, ``BlobDataset`` + the ingest benchmark's collate (a bytearray per sample,
    then one copy into a shared-memory batch) against ``BlobBatchDataset`` (each batch read
    straight into its shared-memory tensor); 2 epochs a round, in turn.  The workers' CPU is
    theirs once joined (``RUSAGE_CHILDREN``)."""
    from blobsdk.torch import BlobBatchDataset, BlobDataset, collate_batch

    from ._ingest_variants import _as_batch, _tensor_item, collate

    rng = np.random.default_rng(0)
    lengths = np.exp(rng.uniform(np.log(64 * KiB), np.log(8 * MiB), sizes.loader_samples)).astype(int).tolist()
    paths = [f"/bench/loader/{i:04d}" for i in range(len(lengths))]
    with blobsdk.SyncClient.local(root) as client:
        client.put_many((path, os.urandom(n)) for path, n in zip(paths, lengths, strict=True))
    gb = 2 * sum(lengths) / 1e9
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for r in range(sizes.rounds):
        for kind in ("map", "into") if r % 2 == 0 else ("into", "map"):
            if kind == "map":
                dataset: Any = BlobDataset.local(root, paths, l1=NO_L1, transform=_tensor_item, readahead=8)
                collate_fn: Any = collate
            else:
                dataset, collate_fn = BlobBatchDataset.local(root, paths, l1=NO_L1, transform=_as_batch), collate_batch
            seconds, workers = _two_epochs(dataset, collate_fn)
            wall.setdefault(kind, []).append(seconds)
            cpu.setdefault(kind, []).append(workers)
    ratios = [m / i for m, i in zip(wall["map"], wall["into"], strict=True)]
    out.ratios["loader_into_vs_map"] = statistics.median(ratios)
    out.metrics["loader_into_vs_map_lo"], out.metrics["loader_into_vs_map_hi"] = min(ratios), max(ratios)
    for kind in wall:
        out.metrics[f"loader_{kind}_GBps"] = gb / statistics.median(wall[kind])
        out.metrics[f"loader_{kind}_workers_cpu_s_per_GB"] = statistics.median(cpu[kind]) / gb
    _say("loader", wall, cpu, gb)


def _two_epochs(dataset: Any, collate_fn: Any) -> tuple[float, float]:
    """Wall seconds of two epochs once the workers are up, and the workers' CPU seconds."""
    import torch
    from torch.utils.data import DataLoader

    before = _children_cpu_s()
    generator = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        loader = DataLoader(
            dataset,
            batch_size=8,
            shuffle=True,
            generator=generator,
            num_workers=4,
            persistent_workers=True,
            collate_fn=collate_fn,
        )
        batches = iter(loader)
    first = next(batches)
    start = time.perf_counter()
    for epoch in range(2):
        for _ in batches if epoch == 0 else iter(loader):
            pass
    seconds = time.perf_counter() - start
    del first, batches, loader  # the workers stop and are joined
    dataset.close()
    return seconds, _children_cpu_s() - before


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _cluster(root: Path, big: list[tuple[str, bytes]], sizes: Sizes, out: Report) -> None:
    async with start_cluster(root, block_servers=1, l3_nodes=0, trackers=0) as cluster:
        assert cluster.config is not None
        config = msgspec.structs.replace(cluster.config, l1=NO_L1, write=WriteConfig(chunk_size=4 * MiB))
        async with blobsdk.Client(config) as client:
            await client.put_many(big)
            scenario = Scenario("4m_cluster", 4 * MiB * len(big), one_at_a_time(client, _paths(big), 4 * MiB))
            await scenario.play(sizes.rounds)
            scenario.report(out, "get_into")


def _paths(items: list[tuple[str, bytes]]) -> list[str]:
    return [path for path, _ in items]
