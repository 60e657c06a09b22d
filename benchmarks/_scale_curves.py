"""The scale benchmark's curves: a figure of one component measured at sizes ten apart, the
timing and memory helpers every curve uses, and the picture.

A curve is *flat* when its value at the largest size is at most ``FLAT`` times its value at the
smallest (goals: lookups, hits and locates flat, memory per entry constant).
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ._report import Report, median, percentile

FLAT = 1.5  # the goal: largest size's value <= 1.5x the smallest's


@dataclass
class Curve:
    """``figure`` of ``component`` at each size (``unit``: what one value is)."""

    component: str
    figure: str
    unit: str
    points: dict[int, float] = field(default_factory=dict)  # size -> value
    higher_is_better: bool = False  # a rate: its growth is the smallest size's over the largest's

    @property
    def name(self) -> str:
        return f"{self.component}_{self.figure}"

    def growth(self) -> float:
        """How much worse the value is at the largest size than at the smallest (the largest
        over the smallest; for a rate, the smallest over the largest)."""
        sizes = sorted(self.points)
        first, last = self.points[sizes[0]], self.points[sizes[-1]]
        worse, better = (first, last) if self.higher_is_better else (last, first)
        return worse / better if better > 0 else float("inf")

    def add_to(self, report: Report) -> None:
        for size, value in sorted(self.points.items()):
            report.metrics[f"{self.name}_at_{size:.0e}".replace("+0", "").replace("+", "")] = value
        if len(self.points) > 1:
            report.ratios[f"{self.name}_growth"] = self.growth()
            report.goals[f"{self.name}_growth"] = f"<= {FLAT} (x{max(self.points) // min(self.points):,} size)"
        report.details.setdefault("curves", []).append(
            {"component": self.component, "figure": self.figure, "unit": self.unit, "points": self.points}
        )


def per_op_quantiles(
    op: Callable[[int], object], count: int, batch: int = 200, clock: Callable[[], float] = time.thread_time
) -> tuple[float, float]:
    """p50 and p99 (seconds) of ``op(i)`` for ``i`` in ``range(count)``, each timed as the mean of
    a batch of ``batch`` calls (one call is too short for the clock); the cyclic collector off.
    The default clock is this thread's CPU time: on a shared machine, wall time would measure
    the other jobs (the in-process curves do no I/O)."""
    means: list[float] = []
    with _no_gc():
        for start in range(0, count, batch):
            stop = min(count, start + batch)
            began = clock()
            for i in range(start, stop):
                op(i)
            means.append((clock() - began) / (stop - start))
    return median(means), percentile(means, 0.99)


@contextmanager
def traced_bytes() -> Iterator[Callable[[], int]]:
    """Bytes allocated (and still held) inside the block, by tracemalloc."""
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    held = [0]
    try:
        yield lambda: held[0]
    finally:
        held[0] = tracemalloc.get_traced_memory()[0] - start
        tracemalloc.stop()


@contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def figure(plt: Any, curves: list[Curve]) -> Any:
    """The picture (benchmarks/_picture.py draws it): one panel per unit (time per op, bytes
    per entry, ...), log-log, a line per curve."""
    units = sorted({c.unit for c in curves})
    cols = min(3, len(units))
    rows = -(-len(units) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.8 * rows), squeeze=False)
    for ax in axes.flat[len(units) :]:
        ax.set_visible(False)
    for ax, unit in zip(axes.flat, units, strict=False):
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # a panel may hold more than 10 curves
        for curve in (c for c in curves if c.unit == unit):
            sizes = sorted(curve.points)
            ax.plot(sizes, [curve.points[s] for s in sizes], marker="o", label=curve.name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("size (entries, peers or chunks)")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"blobsdk scale curves (flat is the goal: growth <= {FLAT}x)")
    fig.tight_layout()
    return fig
