"""The DLIO benchmark's picture, from its ``--json``: ``python -m benchmarks._dlio_plot JSON PNG``
(matplotlib: the ``bench`` extra).  One panel per workload: the emulated accelerators each
library holds at MLPerf Storage's pass bar, and its AU with one accelerator."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ._picture import draw
from ._report import Report

LIBRARIES = ("blobsdk", "s3torchconnector", "s3dlio", "dlio_default")
LABELS = {"dlio_default": "DLIO's reader\n(local disk)"}
BARS = {"unet3d": 90.0, "retinanet": 85.0}


def figure(metrics: dict[str, float]) -> Any:
    def make(plt: Any) -> Any:
        fig, axes = plt.subplots(1, len(BARS), figsize=(10, 3.8))
        for ax, (workload, bar) in zip(axes, BARS.items(), strict=True):
            names = [lib for lib in LIBRARIES if f"{workload}_{lib}_max_accel" in metrics]
            held = [metrics[f"{workload}_{lib}_max_accel"] for lib in names]
            colours = ["#1f77b4" if lib == "blobsdk" else "#999999" for lib in names]
            ax.bar([LABELS.get(lib, lib) for lib in names], held, color=colours)
            for x, lib in enumerate(names):
                au = metrics[f"{workload}_{lib}_au_1"]
                ax.annotate(f"AU {au:.0f}% at 1", (x, held[x]), ha="center", va="bottom", fontsize=8)
            ax.set_title(f"{workload}-like: accelerators at AU >= {bar:.0f}%")
            ax.set_ylabel("emulated accelerators per client")
            ax.tick_params(axis="x", labelsize=8)
        fig.suptitle("DLIO (MLPerf Storage's harness) on SeaweedFS behind the HDD model, one 2-core client")
        fig.tight_layout()
        return fig

    return make


def main(argv: list[str]) -> int:
    metrics = json.loads(Path(argv[0]).read_text())["metrics"]
    report = Report("dlio")
    drawn = draw(report, Path(argv[1]), figure(metrics))
    print(report.details.get("png") if drawn else report.skipped["png"])
    return 0 if drawn else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
