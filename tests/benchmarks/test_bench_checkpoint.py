"""The checkpoint benchmark's rows of deduplication (benchmarks/_checkpoint_dedup.py) at a tiny
size: every row runs, restores exactly and is reported beside its goal with its range; no
figure is asserted but what holds whatever the store dedups (random changes are written at
least once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from benchmarks import _checkpoint_dedup
from benchmarks._checkpoint_dedup import MiB, Shape
from benchmarks._report import Report

TINY = Shape(
    table_bytes=4 * MiB,
    saves=3,
    scattered_bytes=4 * MiB,
    region=8 << 10,
    scattered_saves=3,
    dcp_width=32,
    dcp_saves=3,
    long_table_bytes=4 * MiB,
    long_saves=5,
)
CNR = {"bytes_vs_changed": "<= 1.2", "stall_cut": ">= 50", "restore_vs_memcpy": ">= 0.9"}
GOALS = {
    **{f"{name}_{key}": bound for name, _ in _checkpoint_dedup.CNR_VARIANTS for key, bound in CNR.items()},
    "unchanged_stall_cut": ">= 50",
    "scattered_bytes_vs_changed": "<= 1.2",
    "dcp_steps_later_vs_first": "<= 0.05",
}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_every_row_runs_and_is_reported_beside_its_goal(tmp_path: Path) -> None:
    report = Report("checkpoint")
    asyncio.run(_checkpoint_dedup.run(report, tmp_path, TINY))
    assert not report.failed
    floors = {"cnr_stall_cut_floor", "cnr_restore_floor_vs_memcpy"}
    assert set(report.ratios) == {f"{key}{end}" for key in GOALS for end in ("", "_min", "_max")} | floors
    for key, bound in GOALS.items():
        assert report.ratios[f"{key}_min"] <= report.ratios[key] <= report.ratios[f"{key}_max"]
        assert report.goals[key].startswith(f"goal {bound}: ")
    assert len(report.details["cnr_bytes_vs_changed"]) == 2 and len(report.details["dcp_steps_later_vs_first"]) == 2
    assert report.ratios["cnr_bytes_vs_changed_min"] >= 1.0 and report.ratios["scattered_bytes_vs_changed_min"] >= 1.0
    assert report.ratios["cnr_whole_bytes_vs_changed_min"] >= report.ratios["cnr_bytes_vs_changed_max"]  # the mirror writes less
    assert report.metrics["cnr_changed_mib_per_save"] == (4 * MiB // 512 // 100) * 512 / MiB
    assert report.metrics["cnr_restore_in_place"] in (0.0, 1.0)
    assert report.metrics["cnr_long_saves"] == 5 and report.metrics["cnr_long_bytes_vs_changed"] >= 1.0
    assert len(report.details["cnr_long_written"]) == 4


def test_a_goal_says_whether_the_median_meets_it() -> None:
    report = Report("checkpoint")
    _checkpoint_dedup.goal(report, "low", [3.0, 1.0, 2.0], "<=", 2)
    _checkpoint_dedup.goal(report, "high", [1.0, 3.0], ">=", 2.5, "; at 256 MiB")
    assert report.ratios == {"low": 2.0, "low_min": 1.0, "low_max": 3.0, "high": 2.0, "high_min": 1.0, "high_max": 3.0}
    assert report.goals == {"low": "goal <= 2: met (median of 3)", "high": "goal >= 2.5: MISS (median of 2); at 256 MiB"}


def test_zipf_rows_are_distinct_and_the_hot_ones_recur() -> None:
    zipf = _checkpoint_dedup._Zipf(10_000, np.random.default_rng(1))
    picks = [zipf.pick(100) for _ in range(20)]
    assert all(len(np.unique(p)) == 100 and p.min() >= 0 and p.max() < 10_000 for p in picks)
    hottest = zipf.order[0]
    assert all(hottest in p for p in picks)
    assert len(np.unique(np.concatenate(picks))) < 20 * 100 * 0.7  # uniform picks would share almost none
