"""The ingest benchmark's workload: every parameter in one place, and the samples it makes.

:class:`Workload` holds the knobs (dataset, job, HDD tier, loaders); :data:`FULL` and
:data:`QUICK` are the two runs.  :class:`Samples` is the dataset itself: deterministic
random bytes (incompressible, so lz4 "auto" stores them raw) cut into samples whose sizes
are log-uniform between ``sample_min`` and ``sample_max`` (many small images, a few large
clips), each with its name, its blob path, its own L4 block id and its xxh3-64 digest.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields

import numpy as np
import xxhash

KiB = 1 << 10
MiB = 1 << 20
PREFIX = "/ingest/train/"  # where the blobsdk copy of the dataset lives


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Everything the run depends on; :meth:`describe` prints it."""

    dataset_bytes: int  # the dataset is the first samples whose sizes add up to at least this
    sample_min: int = 64 * KiB
    sample_max: int = 8 * MiB
    epochs: int = 3
    batch_size: int = 8  # samples per step
    setup_fraction: float = 0.10  # the set-up phase (model load), in epochs of compute
    demand_ratio: float = 1.0  # the job's demand (bytes per second of compute) / the HDD tier's bandwidth
    block_servers: int = 3  # L4: HDD-emulating block servers, each holding every block
    latency_ms: float = 5.0  # per request, each server
    bandwidth_mbps: float = 60.0  # MB/s, each server
    spindles: int = 2  # requests each server serves at once, the rest wait in FIFO order (0: unlimited)
    l3_nodes: int = 2
    workers: int = 4  # DataLoader worker processes (variants b-e)
    copy_parallel: int = 10  # copy-then-train's concurrent downloads (the AWS CLI's default)
    readahead: int = 8  # blobsdk: reads in flight ahead of each worker's loop
    prefetch_window: int = 16  # blobsdk: samples per deep-prefetch window (each worker prefetches its next)
    into_pairs: int = 2  # blobsdk_map / blobsdk_into rows, played in turn (their ratio's spread)
    seed: int = 0

    @property
    def hdd_bandwidth_Bps(self) -> float:
        """The L4 tier's aggregate bandwidth, bytes per second."""
        return self.block_servers * self.bandwidth_mbps * 1e6

    @property
    def demand_Bps(self) -> float:
        return self.demand_ratio * self.hdd_bandwidth_Bps

    def compute_per_sample_s(self, samples: Samples) -> float:
        """A step costs this times its batch's samples: a full batch always costs the same,
        and an epoch's compute is the dataset's bytes at ``demand_Bps``."""
        return samples.total_bytes / self.demand_Bps / len(samples)

    def epoch_compute_s(self, samples: Samples) -> float:
        return self.compute_per_sample_s(samples) * len(samples)

    def setup_s(self, samples: Samples) -> float:
        return self.setup_fraction * self.epoch_compute_s(samples)

    def describe(self, samples: Samples) -> list[str]:
        """The parameters, one per line, with what follows from them."""
        lines = [f"{f.name} = {getattr(self, f.name)}" for f in fields(self)]
        step = self.compute_per_sample_s(samples) * self.batch_size
        lines += [
            f"samples = {len(samples)} ({samples.total_bytes / MiB:.0f} MiB, median {samples.median_bytes / KiB:.0f} KiB)",
            f"hdd tier = {self.block_servers} x {self.bandwidth_mbps:g} MB/s = {self.hdd_bandwidth_Bps / 1e6:.0f} MB/s, "
            f"{self.latency_ms:g} ms a request",
            f"demand = {self.demand_Bps / 1e6:.0f} MB/s: {step * 1000:.1f} ms of compute per step of {self.batch_size}, "
            f"{self.epoch_compute_s(samples):.2f} s per epoch",
            f"set-up phase = {self.setup_s(samples):.2f} s",
        ]
        return lines


FULL = Workload(dataset_bytes=1024 * MiB)
QUICK = Workload(dataset_bytes=256 * MiB)


class Samples:
    """The dataset: ``len(samples)`` samples of random bytes, held in one buffer."""

    def __init__(self, workload: Workload) -> None:
        self.sizes = sample_sizes(workload)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).tolist()
        self.total_bytes = self.offsets[-1]
        words = np.random.default_rng(workload.seed).integers(0, 2**63, size=self.total_bytes // 8 + 1, dtype=np.uint64)
        self._data = memoryview(words.view(np.uint8)[: self.total_bytes])
        self.paths = [f"{PREFIX}{i:06d}" for i in range(len(self.sizes))]
        self.index = {path: i for i, path in enumerate(self.paths)}
        self.digests = [xxhash.xxh3_64_intdigest(self.data(i)) for i in range(len(self))]  # ~0.1 s a GiB

    def __len__(self) -> int:
        return len(self.sizes)

    def data(self, i: int) -> memoryview:
        return self._data[self.offsets[i] : self.offsets[i + 1]]

    def block_id(self, i: int) -> str:
        """Sample ``i``'s own L4 block (for the per-sample URLs of the plain HTTP variants)."""
        return xxhash.xxh3_128_hexdigest(f"ingest-sample-{i}".encode())

    @property
    def median_bytes(self) -> float:
        return float(np.median(self.sizes))


def sample_sizes(workload: Workload) -> list[int]:
    """Log-uniform sizes in [sample_min, sample_max] until they add up to dataset_bytes."""
    if not 0 < workload.sample_min <= workload.sample_max:
        raise ValueError(f"need 0 < sample_min <= sample_max, got {workload.sample_min} and {workload.sample_max}")
    rng = random.Random(workload.seed)
    low, high = math.log(workload.sample_min), math.log(workload.sample_max)
    sizes: list[int] = []
    total = 0
    while total < workload.dataset_bytes:
        size = min(workload.sample_max, int(math.exp(rng.uniform(low, high))))
        sizes.append(size)
        total += size
    return sizes
