"""``python -m benchmarks walk``: how much of blobsdk one operation runs, walked by a profiler.

Counted, not timed: the same on any machine, so the figures are exact and need no baseline.
Each operation runs in this process against a local cluster (an API server and three block
servers, each a process of its own, no L3 node, no tracker), under a profile hook
(``sys.setprofile``, and ``threading.setprofile`` for the threads started meanwhile: a
SyncClient's loop thread, an executor's workers).  The rule:

- only ``blobsdk/`` code counts (the package this module imports, wherever it is installed):
  not the servers (other processes), the standard library, aiohttp, torch or numpy;
- ``files``: distinct source files of which a function ran; ``functions``: distinct code
  objects that ran (file, first line, name); ``calls``: the profiler's ``call`` events of
  those functions, a coroutine's or generator's every resumption counting as one, as a
  profiler sees it;
- only what runs between the start and the end of the operation counts, in every thread
  the hook is in; the setup before it (servers, the client opened, what warms it) does not;
- each operation is walked several times (3 with ``--quick``, 9 without): what runs depends a
  little on timing (a read that waited in its limiter's queue, a deadline that fired), so
  each figure is reported as the median of its walks, every walk's in the JSON.

The operations:

- ``cold_read``: a ``Client.get`` of a 16 KiB blob (one chunk) that no cache of the client
  holds, plan or chunk (a new blob each walk), served by the L4 block servers, hedged as
  the default config has it; the client opened and warmed by a get of another blob first
  (its connections, its hedger's first samples), so the walk is the read's, not the
  client's start;
- ``save``: a checkpoint ``save`` of a small state (two float32 arrays of 64 KiB) and the
  wait for it to be committed, the first save under its prefix (a new prefix each walk),
  after a save under another prefix warmed the client;
- ``epoch``: one epoch of a torch ``DataLoader`` (0 workers, batches of 8) over a
  ``BlobIterableDataset`` of 32 samples of 16 KiB with the dataset's defaults, after a
  first epoch (which opens the dataset's client); its client's L1 is 64 KiB, smaller than
  the dataset, so the epoch reads every sample from L4 again, as a dataset larger than the
  host's memory does.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import numpy as np
from torch.utils.data import DataLoader

import blobsdk
from blobsdk.torch import BlobIterableDataset
from servers.cluster import start_cluster

from ._report import Report

PACKAGE = str(Path(blobsdk.__file__).resolve().parent) + os.sep
SAMPLE = 16 << 10
SAMPLES = 32
QUICK_REPEATS = 3
FULL_REPEATS = 9


@dataclass
class Count:
    """One walk: the calls per function (file, first line, name) of the package's code."""

    calls: dict[tuple[str, int, str], int] = field(default_factory=dict)

    @property
    def files(self) -> set[str]:
        return {path for path, _, _ in self.calls}


class Walker:
    """A profile hook that counts the package's functions into ``count`` while it is set."""

    def __init__(self, package: str = PACKAGE) -> None:
        self.package = package
        self.count: Count | None = None

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        count = self.count
        if count is None or event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(self.package):
            key = (code.co_filename, code.co_firstlineno, code.co_name)
            count.calls[key] = count.calls.get(key, 0) + 1

    @contextmanager
    def hooked(self) -> Iterator[None]:
        """The hook in this thread and in every thread started inside the block (counting
        only inside :meth:`walk`), taken out after."""
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    @contextmanager
    def walk(self, into: list[Count]) -> Iterator[None]:
        """Count what runs inside the block, as one more walk of ``into``."""
        self.count = Count()
        try:
            yield
        finally:
            into.append(self.count)
            self.count = None


async def run(quick: bool = False) -> Report:
    """Each operation walked ``QUICK_REPEATS`` or ``FULL_REPEATS`` times: the median of each
    figure, its range beside it (what runs depends a little on timing: whether a read
    waited in its limiter's queue, whether a deadline fired)."""
    repeats = QUICK_REPEATS if quick else FULL_REPEATS
    report = Report("walk")
    walker = Walker()
    with tempfile.TemporaryDirectory(prefix="bench-walk-") as tmp:
        async with start_cluster(Path(tmp) / "cluster", block_servers=3, l3_nodes=0, trackers=0) as cluster:
            config = cluster.config
            assert config is not None
            with walker.hooked():
                for name, operation in WALKS.items():
                    counts: list[Count] = []
                    await operation(config, walker, counts, repeats)
                    _report(report, name, counts)
    return report


def _report(report: Report, name: str, counts: list[Count]) -> None:
    figures = {
        "files": [len(c.files) for c in counts],
        "functions": [len(c.calls) for c in counts],
        "calls": [sum(c.calls.values()) for c in counts],
    }
    for figure, values in figures.items():
        report.metrics[f"{name}_{figure}"] = statistics.median(values)
        report.details[f"{name}_{figure}"] = values
    parent = str(Path(PACKAGE).parent) + os.sep
    calls_per_file: dict[str, int] = {}
    for (path, _, _), calls in counts[0].calls.items():
        calls_per_file[path.removeprefix(parent)] = calls_per_file.get(path.removeprefix(parent), 0) + calls
    report.details[f"{name}_first_walk_calls_per_file"] = dict(sorted(calls_per_file.items()))


async def cold_read(config: blobsdk.ClientConfig, walker: Walker, counts: list[Count], repeats: int) -> None:
    async with blobsdk.Client(config) as writer:
        for i in range(repeats + 1):
            await writer.put(f"/walk/get/{i}", os.urandom(SAMPLE))
    async with blobsdk.Client(config) as c:
        await c.get(f"/walk/get/{repeats}")  # warms the client
        for i in range(repeats):
            with walker.walk(counts):
                data = await c.get(f"/walk/get/{i}")
            assert len(data) == SAMPLE


def _state(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"w": rng.random(16 << 10, dtype=np.float32), "b": rng.random(16 << 10, dtype=np.float32)}


async def save(config: blobsdk.ClientConfig, walker: Walker, counts: list[Count], repeats: int) -> None:
    async with blobsdk.Client(config) as c:
        await (await c.checkpoints("/walk/ck-warm").save(1, _state(0))).wait()
        for i in range(repeats):
            checkpoints = c.checkpoints(f"/walk/ck-{i}")
            with walker.walk(counts):
                await (await checkpoints.save(1, _state(i + 1))).wait()
            assert await checkpoints.list() == [1]


async def epoch(config: blobsdk.ClientConfig, walker: Walker, counts: list[Count], repeats: int) -> None:
    async with blobsdk.Client(config) as writer:
        for i in range(SAMPLES):
            await writer.put(f"/walk/ds/{i:03d}", os.urandom(SAMPLE))
    small_l1 = msgspec.structs.replace(config, l1=blobsdk.L1Config(capacity_bytes=4 * SAMPLE))
    await asyncio.to_thread(_epochs, small_l1, walker, counts, repeats)


def _epochs(config: blobsdk.ClientConfig, walker: Walker, counts: list[Count], repeats: int) -> None:
    dataset = BlobIterableDataset(config, "/walk/ds/")
    try:
        loader = DataLoader(dataset, batch_size=8, num_workers=0, collate_fn=list)
        assert sum(map(len, loader)) == SAMPLES  # the first epoch opens the client
        for i in range(repeats):
            dataset.set_epoch(i + 1)
            with walker.walk(counts):
                seen = sum(map(len, loader))
            assert seen == SAMPLES
    finally:
        dataset.close()


Operation = Callable[[blobsdk.ClientConfig, Walker, list[Count], int], Awaitable[None]]
WALKS: dict[str, Operation] = {"cold_read": cold_read, "save": save, "epoch": epoch}
