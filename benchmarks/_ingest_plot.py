"""The ingest benchmark's picture (matplotlib, of the ``bench`` extra): stall per epoch by
loader (bars, one per epoch) beside the CDF of each loader's step wait (the time the job
waited for each batch, every epoch pooled; log scale)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._ingest_job import JobResult

WAIT_FLOOR_S = 1e-4  # waits below this are drawn at it (a log axis has no 0)


def figure(plt: Any, results: Mapping[str, JobResult], title: str) -> Any:
    """The picture (benchmarks/_picture.py draws it)."""
    names = list(results)
    epochs = max(len(r.epochs) for r in results.values())
    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.3, 1]})
    width = 0.8 / epochs
    x = np.arange(len(names))
    for e in range(epochs):
        stalls = [r.epochs[e].stall_s if e < len(r.epochs) else 0.0 for r in results.values()]
        bars.bar(x + (e - (epochs - 1) / 2) * width, stalls, width, label=f"epoch {e}")
    bars.set_xticks(x, names, rotation=30, ha="right")
    bars.set_yscale("log")
    bars.set_ylabel("stall per epoch, s (log)")
    bars.set_title("Stall per epoch (lower is better)")
    bars.legend()
    bars.grid(axis="y", which="both", alpha=0.3)
    for name, result in results.items():
        waits = np.sort(np.maximum([w for e in result.epochs for w in e.waits], WAIT_FLOOR_S))
        if waits.size:
            cdf.step(waits, np.arange(1, waits.size + 1) / waits.size, where="post", label=name)
    cdf.set_xscale("log")
    cdf.set_xlabel("wait for a batch, s (log)")
    cdf.set_ylabel("share of steps")
    cdf.set_title("CDF of step wait (left and high is better)")
    cdf.grid(which="both", alpha=0.3)
    cdf.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
