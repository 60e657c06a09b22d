"""``blobsdk demo``: ingest a synthetic training dataset into the embedded store, then read
it back as three shuffled training epochs and verify every byte of each:

- cold: nothing cached, every chunk comes from L4 (the block directory);
- warm: the same client again, every chunk from L1 (host memory);
- restart: a new client (as after a process restart: L1 empty), every chunk from L2 (the
  local flash directory the first client filled write-behind).

The report's table has a column per tier the store has (the embedded store: L1, L2, L4);
the closing ``stats`` lines are the restart client's ``stats()``, as the report says.

Samples are 64 KiB–1 MiB, half text-like (compressible) and half random, each generated
from its own seed so it can be regenerated to check what the store returns.  Uses only
the runtime dependencies.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import xxhash

from .client import Client
from .config import L2Config
from .runtime import ProgressLine

KiB, MiB = 1 << 10, 1 << 20
MIN_SAMPLE, MAX_SAMPLE = 64 * KiB, 1 * MiB
DATASET_SEED = 20240601
EPOCH_BATCH = 32  # concurrent gets, as a dataloader fetching one batch at a time
RANGED_READS = 8
PREFIX = "/demo/train/"
TIERS = ("l1", "l2", "peer", "l3", "l4")  # in read order; the table shows those a client has

_WORDS = (  # noqa: SIM905 - a word list reads best as words
    "the of and to in is that for it as with was on be by at this from are or an which "
    "model data train loss batch epoch tensor gradient layer weight token sample shard "
    "storage block chunk cache tier read write flash disk memory peer tracker latency "
    "throughput checkpoint version path bucket stream prefetch hedge quorum replica"
).split()


@dataclass(frozen=True)
class Sample:
    """One synthetic sample: everything needed to regenerate its bytes."""

    index: int
    seed: int
    size: int
    text: bool  # text-like (compressible) or random bytes

    @property
    def path(self) -> str:
        return f"{PREFIX}sample-{self.index:06d}.bin"

    def generate(self) -> bytes:
        rng = random.Random(self.seed)
        return _text_bytes(rng, self.size) if self.text else rng.randbytes(self.size)


def _text_bytes(rng: random.Random, size: int) -> bytes:
    """Log-like lines drawn from a small per-sample pool: compresses about 3x with lz4."""
    pool = [(" ".join(rng.choices(_WORDS, k=12)) + "\n").encode() for _ in range(64)]
    per_line = sum(map(len, pool)) / len(pool)
    return b"".join(rng.choices(pool, k=int(size / per_line) + 2))[:size]


def make_dataset(size_mb: int, seed: int = DATASET_SEED) -> list[Sample]:
    """Samples totalling ``size_mb`` MiB, the same list for the same arguments."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    remaining = size_mb * MiB
    while remaining > 0:
        size = min(rng.randint(MIN_SAMPLE, MAX_SAMPLE), remaining)
        samples.append(Sample(len(samples), rng.getrandbits(63), size, text=rng.random() < 0.5))
        remaining -= size
    return samples


@dataclass(frozen=True)
class Epoch:
    name: str
    seconds: float
    served: dict[str, int]  # chunks served per tier during this epoch


@dataclass
class DemoReport:
    dir: Path
    samples: int = 0
    logical_bytes: int = 0
    stored_bytes: int = 0  # bytes of block files on disk
    ingest_seconds: float = 0.0
    epochs: list[Epoch] = field(default_factory=list)
    verified: int = 0  # sample reads that matched, over every epoch
    mismatched: list[str] = field(default_factory=list)
    ranged_ok: int = 0
    ranged_total: int = 0
    stats: dict[str, dict[str, int | float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        reads = self.samples * len(self.epochs)
        return not self.mismatched and self.verified == reads and self.ranged_ok == self.ranged_total

    @property
    def problems(self) -> str:
        reads = self.samples * len(self.epochs)
        return (
            f"{reads - self.verified} of {reads} sample reads wrong ({', '.join(self.mismatched[:5])}), "
            f"{self.ranged_total - self.ranged_ok} of {self.ranged_total} ranged reads wrong"
        )


async def run_demo(dir: Path | None, size_mb: int = 300, out: TextIO | None = None, *, keep: bool = False) -> DemoReport:
    """Run the demo on ``Client.local(dir)`` (a temporary directory, removed afterwards
    unless ``keep``, when ``dir`` is None); print the report to ``out`` (``sys.stdout`` as it
    is at the call) and return it."""
    out = sys.stdout if out is None else out
    root = Path(dir) if dir is not None else Path(tempfile.mkdtemp(prefix="blobsdk-demo-"))
    try:
        report = await _run(root, size_mb, out)
    finally:
        if dir is None and not keep:
            await asyncio.to_thread(shutil.rmtree, root, ignore_errors=True)
    if dir is None and keep:
        print(f"store kept in {root}", file=out)
    return report


async def _run(root: Path, size_mb: int, out: TextIO) -> DemoReport:
    samples = make_dataset(size_mb)
    report = DemoReport(dir=root, samples=len(samples), logical_bytes=sum(s.size for s in samples))
    print(
        f"blobsdk demo: {len(samples)} samples, {report.logical_bytes / MiB:.1f} MiB, embedded store in {root}",
        file=out,
        flush=True,
    )
    l2 = L2Config(dir=str(root / "l2"), capacity_bytes=2 * report.logical_bytes + 64 * MiB)
    expected = {s.index: _digest(s.generate()) for s in samples}
    async with Client.local(root, l2=l2) as client:
        report.ingest_seconds = await _ingest(client, samples, out)
        await _epoch(client, "cold", samples, expected, report)
        await _epoch(client, "warm", samples, expected, report)
        await _ranged_reads(client, samples, report)
        await client.flush()
    async with Client.local(root, l2=l2) as client:
        await _epoch(client, "restart", samples, expected, report)
        report.stats = client.stats()
    report.stored_bytes = await asyncio.to_thread(_disk_bytes, root / "blocks")
    _print_report(report, out)
    return report


async def _ingest(client: Client, samples: Sequence[Sample], out: TextIO) -> float:
    progress = ProgressLine(out)
    start = time.perf_counter()
    await client.put_many(((s.path, s.generate()) for s in samples), progress=progress.update)
    progress.clear()  # the report's ingest line says it once
    return time.perf_counter() - start


async def _epoch(client: Client, name: str, samples: Sequence[Sample], expected: dict[int, bytes], report: DemoReport) -> None:
    """Read every sample once, shuffled, ``EPOCH_BATCH`` gets at a time; check each digest."""
    order = list(samples)
    random.Random(DATASET_SEED + len(report.epochs)).shuffle(order)
    before = _served(client)
    start = time.perf_counter()
    for batch in _batches(order, EPOCH_BATCH):
        async with asyncio.TaskGroup() as tg:
            reads = [tg.create_task(client.get(s.path)) for s in batch]
        for sample, read in zip(batch, reads, strict=True):
            if _digest(read.result()) == expected[sample.index]:
                report.verified += 1
            else:
                report.mismatched.append(sample.path)
    seconds = time.perf_counter() - start
    after = _served(client)
    report.epochs.append(Epoch(name, seconds, {tier: after[tier] - before[tier] for tier in after}))


def _served(client: Client) -> dict[str, int]:
    """Chunks served so far by each tier the client has (an absent tier reports enabled=False)."""
    stats = client.stats()
    return {tier: int(stats[tier]["hits"]) for tier in TIERS if tier in stats and stats[tier].get("enabled", True)}


async def _ranged_reads(client: Client, samples: Sequence[Sample], report: DemoReport) -> None:
    """Random ranges inside samples, plus the two clamping rules at the end of a blob."""
    rng = random.Random(DATASET_SEED + 2)
    for sample in rng.sample(list(samples), min(RANGED_READS, len(samples))):
        data = sample.generate()
        offset = rng.randrange(sample.size)
        length = rng.randrange(sample.size - offset + 1)
        checks = [(offset, length), (sample.size + 10, 5), (sample.size - 5, 100)]
        for off, n in checks:
            report.ranged_total += 1
            report.ranged_ok += bytes(await client.get(sample.path, off, n)) == data[off : off + n]


def _batches(items: Sequence[Sample], size: int) -> Iterator[Sequence[Sample]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _digest(data: bytes | bytearray) -> bytes:
    return xxhash.xxh3_128_digest(data)


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _print_report(r: DemoReport, out: TextIO) -> None:
    mib = r.logical_bytes / MiB
    lines = [
        f"ingest:   {mib:.1f} MiB in {r.ingest_seconds:.2f} s = {mib / max(r.ingest_seconds, 1e-9):.1f} MiB/s (put_many)",
        f"epochs:   shuffled, {EPOCH_BATCH} concurrent gets; chunks served by each tier:",
        *_epoch_table(r),
        f"verified: {r.verified}/{r.samples * len(r.epochs)} sample reads (xxh3-128), "
        f"{r.ranged_ok}/{r.ranged_total} ranged reads",
        f"stored:   {r.stored_bytes / MiB:.1f} MiB of blocks for {mib:.1f} MiB logical "
        f"(ratio {r.stored_bytes / max(r.logical_bytes, 1):.2f})",
    ]
    lines.append("stats of the restart client (its one epoch; the first client's reads are in the table above):")
    lines += [
        f"  {tier}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in counters.items())
        for tier, counters in r.stats.items()
        if counters.get("enabled", True)
    ]
    lines.append("OK: every byte verified" if r.ok else f"FAILED: {r.problems}")
    print("\n".join(lines), file=out, flush=True)


def _fmt(value: int | float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _epoch_table(r: DemoReport) -> list[str]:
    mib = r.logical_bytes / MiB
    tiers = [t for t in TIERS if any(t in e.served for e in r.epochs)]
    rows = [f"  {'epoch':8} {'seconds':>8} {'MiB/s':>8} {'samples/s':>10} " + " ".join(f"{t:>6}" for t in tiers)]
    for e in r.epochs:
        seconds = max(e.seconds, 1e-9)
        rows.append(
            f"  {e.name:8} {e.seconds:8.2f} {mib / seconds:8.1f} {r.samples / seconds:10.0f} "
            + " ".join(f"{e.served.get(t, 0):>6}" for t in tiers)
        )
    return rows
