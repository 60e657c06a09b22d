"""The simulated training job of the ingest benchmark, and what it measures.

:func:`run_job` plays one job against one :class:`Variant` (a way of feeding it):

1. **Set-up** (model load): ``variant.prepare()`` is called and the job waits until
   ``setup_s`` after its start; a variant may start anything there (a copy, a prefetch, its
   loader's workers).  A ``prepare`` that returns later than that eats into epoch 0.
2. **Epochs**: for each, ``variant.epoch(e)`` is iterated; each :class:`Batch` (its
   samples' keys, a sample index or blob path each, and their bytes back to back in one
   tensor, as a collate function makes one tensor of a batch) is checked and then
   "computed": ``time.sleep(compute_per_sample_s x len(batch))`` (the accelerator is busy;
   the host CPU is free for loaders).

An epoch's *stall* is its wall time minus its compute (waiting for batches, the checks,
and for epoch 0 any part of the preparation that outlasted the set-up phase, e.g. the
rest of a copy).  The job's *ingestion time* is the sum of its stalls: wall time minus the
set-up phase minus compute.  *Utilisation* is compute / (compute + ingestion): the share of
the training phase the accelerator computed (the set-up phase is the same fixed cost for
every variant and is neither).

Every batch is checked: each sample's length, the xxh3-64 of its first item's bytes (one per
batch: a few ms per epoch), and at the end of each epoch that every sample came once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import xxhash

from ._ingest_workload import Samples, Workload


class JobClock(Protocol):
    """The job's time: the wall clock in a run, a virtual one in the harness's own tests."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """``time.perf_counter`` and ``time.sleep``."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class WrongData(AssertionError):
    """A variant delivered bytes or samples other than the dataset's: its timing is void."""


@dataclass(frozen=True)
class Batch:
    """One step's samples: ``keys[i]`` (a sample index or blob path) has ``sizes[i]`` bytes,
    and ``data`` (a uint8 tensor or array) holds them back to back."""

    keys: Sequence[Any]
    sizes: Sequence[int]
    data: Any

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> Iterator[tuple[Any, np.ndarray]]:
        flat = np.asarray(self.data)
        if flat.size != sum(self.sizes):
            raise WrongData(f"a batch of {flat.size} bytes for samples of {sum(self.sizes)}")
        offset = 0
        for key, size in zip(self.keys, self.sizes, strict=True):
            yield key, flat[offset : offset + size]
            offset += size


class Variant(Protocol):
    name: str

    def prepare(self) -> None:
        """Called at the start of the set-up phase; should return quickly."""

    def epoch(self, epoch: int) -> Iterable[Batch]:
        """The batches of one epoch, each sample once, in this variant's order."""

    def figures(self) -> dict[str, float]:
        """The variant's own figures, once the job ran (copy-then-train: ``download_s``)."""

    def close(self) -> None:
        """Stop everything it started."""


@dataclass(frozen=True)
class EpochTiming:
    wall_s: float
    compute_s: float
    first_batch_s: float  # wait for the epoch's first batch
    waits: tuple[float, ...] = ()  # each step's wait for its batch (the first: from the epoch's start)

    @property
    def stall_s(self) -> float:
        return self.wall_s - self.compute_s


@dataclass
class JobResult:
    setup_s: float
    epochs: list[EpochTiming] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)  # the variant's own figures, and the run's

    @property
    def compute_s(self) -> float:
        return sum(e.compute_s for e in self.epochs)

    @property
    def ingest_s(self) -> float:
        return sum(e.stall_s for e in self.epochs)

    @property
    def utilisation(self) -> float:
        return self.compute_s / (self.compute_s + self.ingest_s)


class Checker:
    """Checks what a variant delivers against the dataset."""

    def __init__(self, samples: Samples) -> None:
        self._samples = samples
        self._seen: Counter[int] = Counter()

    def batch(self, batch: Batch) -> None:
        for n, (key, data) in enumerate(batch.items()):
            i = self._index(key)
            if data.size != self._samples.sizes[i]:
                raise WrongData(f"sample {i}: {data.size} bytes, want {self._samples.sizes[i]}")
            if n == 0 and xxhash.xxh3_64_intdigest(data) != self._samples.digests[i]:
                raise WrongData(f"sample {i}: wrong bytes")
            self._seen[i] += 1

    def end_epoch(self, epoch: int) -> None:
        seen, self._seen = self._seen, Counter()
        if len(seen) != len(self._samples) or any(n != 1 for n in seen.values()):
            twice = sum(n > 1 for n in seen.values())
            raise WrongData(f"epoch {epoch}: {len(seen)} of {len(self._samples)} samples, {twice} more than once")

    def _index(self, key: Any) -> int:
        i = key if isinstance(key, int) and 0 <= key < len(self._samples) else self._samples.index.get(key)
        if i is None:
            raise WrongData(f"no sample {key!r} in the dataset")
        return i


def run_job(variant: Variant, workload: Workload, samples: Samples, clock: JobClock | None = None) -> JobResult:
    """One training job fed by ``variant`` (see the module docstring), timed by ``clock``
    (the wall clock unless given)."""
    clock = clock or WallClock()
    per_sample = workload.compute_per_sample_s(samples)
    result = JobResult(setup_s=workload.setup_s(samples))
    checker = Checker(samples)
    start = clock.now()
    variant.prepare()
    clock.sleep(max(0.0, start + result.setup_s - clock.now()))
    epoch_start = start + result.setup_s
    for epoch in range(workload.epochs):
        timing = _epoch(variant.epoch(epoch), per_sample, checker, epoch_start, clock)
        checker.end_epoch(epoch)
        result.epochs.append(timing)
        epoch_start += timing.wall_s
    result.extra.update(variant.figures())
    return result


def _epoch(batches: Iterable[Batch], per_sample: float, checker: Checker, start: float, clock: JobClock) -> EpochTiming:
    compute = 0.0
    first = None
    waits: list[float] = []
    it = iter(batches)
    asked = start
    while (batch := next(it, None)) is not None:
        came = clock.now()
        waits.append(came - asked)
        first = came - start if first is None else first
        checker.batch(batch)
        began = clock.now()
        clock.sleep(per_sample * len(batch))  # the step: the accelerator is busy
        asked = clock.now()
        compute += asked - began
    return EpochTiming(wall_s=clock.now() - start, compute_s=compute, first_batch_s=first or 0.0, waits=tuple(waits))
