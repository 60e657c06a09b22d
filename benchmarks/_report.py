"""Timing helpers and the report every benchmark returns."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec


@dataclass
class Report:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    goals: dict[str, str] = field(default_factory=dict)  # ratio/metric name -> goal text
    failed: bool = False  # a correctness check failed: `python -m benchmarks` exits 1
    details: dict[str, Any] = field(default_factory=dict)  # more, for the JSON only
    skipped: dict[str, str] = field(default_factory=dict)  # rows that could not run here -> why (not a failure)

    def print_table(self, out: IO[str]) -> None:
        out.write(f"\n== {self.name} ==\n")
        for kind, values in (("metric", self.metrics), ("ratio", self.ratios)):
            for key, value in values.items():
                goal = self.goals.get(key, "")
                out.write(f"  {kind:6} {key:28} {value:12.3f}   {goal}\n")
        for key, why in self.skipped.items():
            out.write(f"  {'skip':6} {key:28} {'-':>12}   {why}\n")

    def write_json(self, path: Path) -> None:
        body: dict[str, Any] = {"name": self.name, "metrics": self.metrics, "ratios": self.ratios}
        if self.details:
            body.update(failed=self.failed, details=self.details)
        if self.skipped:
            body["skipped"] = self.skipped
        path.write_bytes(msgspec.json.format(msgspec.json.encode(body)))


async def best_of(repeats: int, fn: Callable[[], Awaitable[object]]) -> float:
    """Best wall time of ``repeats`` runs (the least disturbed by a noisy neighbour)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return min(times)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def timed(fn: Callable[[], object]) -> float:
    """Wall time of one call."""
    begun = time.perf_counter()
    fn()
    return time.perf_counter() - begun


def du(path: Path) -> int:
    """Bytes in the files under ``path`` (0 if it does not exist yet)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0
