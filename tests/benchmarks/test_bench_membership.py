"""benchmarks/membership.py at a toy size: a real cluster, a node added and one removed while
the job reads; every byte checked, every figure reported (the figures' values are the full
run's to judge, not a unit test's)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import membership
from benchmarks.__main__ import BENCHMARKS
from benchmarks._picture import missing as missing_plot

TINY = membership.Size(nodes=2, chunks=128, many_keys=1024)


async def test_a_tiny_run_checks_every_byte_and_reports_each_change(tmp_path: Path) -> None:
    assert BENCHMARKS["membership"] == "benchmarks.membership"
    report = await membership.run(size=TINY, png=tmp_path / "m.png")
    assert not report.failed and report.metrics["wrong_bytes"] == 0
    assert report.metrics["bytes_checked"] == membership.EPOCHS * TINY.chunks * membership.CHUNK
    assert (report.metrics["add_expected"], report.metrics["remove_expected"]) == (1 / 3, 1 / 3)
    assert 0 < report.metrics["add_moved"] < 1 and 0 < report.metrics["remove_moved"] < 1
    for change in ("add", "remove"):
        ratios = [report.ratios[f"{change}_moved_vs_expected{end}"] for end in ("_lo", "", "_hi")]
        assert ratios[0] < 1 < ratios[2] and ratios[1] == report.metrics[f"{change}_moved"] * 3
        assert 0 < report.ratios[f"{change}_many_keys_vs_expected"] < 3
        assert f"hit_ratio_after_{change}_vs_warm" in report.ratios and f"{change}_misses_vs_moved" in report.ratios
    per_batch = report.details["hit_ratio_per_batch"]
    assert len(per_batch) == membership.EPOCHS * membership.BATCHES
    assert per_batch[: membership.BATCHES] == [0.0] * membership.BATCHES  # the cold epoch: every chunk new
    if missing_plot() is None:
        assert (tmp_path / "m.png").stat().st_size > 1000
    else:
        assert report.skipped == {"png": missing_plot()} and not (tmp_path / "m.png").exists()
