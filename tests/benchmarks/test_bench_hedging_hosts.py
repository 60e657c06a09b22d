"""The hedging benchmark on a testbed of hosts (benchmarks/_hedging_hosts.py) at a tiny size:
two block servers, each in a host of its own, one of them behind a slow link in the
``slow_replica`` scenario; the report has every row and ratio, each ratio within its rounds'
spread.  No figure is asserted (those are the benchmark's).  Skips without root."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import hedging
from benchmarks.__main__ import main
from benchmarks._hedging_hosts import Shape, run_on_hosts

TINY = Shape(rounds=2, batches=3, warmup=2)
RATIOS = (
    "slow_replica_p99_cut",
    "slow_replica_vs_fault_free",
    "fault_free_p50_cost",
    "duplicate_p99_cut",
    "slow_replica_cut_ceiling",
    "fault_free_cpu_cost",
)
RUNS = ("fault_free_none", "fault_free_hedged", "slow_replica_none", "slow_replica_duplicate", "slow_replica_hedged")


def test_the_report_has_every_row_and_ratio_with_its_spread(testbed_unavailable: str | None) -> None:
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    report = asyncio.run(run_on_hosts(2, hedging.POLICIES, TINY))
    assert not report.failed
    rows = {f"{run}_{what}" for run in RUNS for what in ("p50_ms", "p99_ms", "p999_ms", "extra", "hedges_won")}
    rows |= {f"{run}_{what}" for run in RUNS for what in ("budget_exhausted", "hedges_deferred", "cpu_ms")}
    rows |= {f"{scenario}_{host}_host_read_ms" for scenario in ("fault_free", "slow_replica") for host in ("slow", "fast")}
    assert set(report.metrics) == rows
    assert all(report.metrics[f"{run}_p50_ms"] > 0 for run in RUNS)
    assert set(report.ratios) == {f"{r}{end}" for r in RATIOS for end in ("", "_min", "_max")} | {"slow_host_read_x"}
    for ratio in RATIOS:
        assert report.ratios[f"{ratio}_min"] <= report.ratios[ratio] <= report.ratios[f"{ratio}_max"]
        assert len(report.details[f"{ratio}_rounds"]) == 2
    assert report.goals == {"slow_replica_p99_cut": ">= 2", "fault_free_p50_cost": "<= 1.1"}
    assert {report.details[k] for k in ("hosts", "rounds", "batches")} == {2, 3}
    assert all(len(report.details[f"{run}_limits"]) == 2 for run in RUNS)


def test_hosts_needs_two_block_servers() -> None:
    with pytest.raises(SystemExit, match=r"^python -m benchmarks: error: hedging --hosts needs at least 2 block servers, got 1$"):
        main(["hedging", "--hosts", "1"])
    with pytest.raises(ValueError, match=r"^hedging on hosts needs at least 2 block servers to hedge between, got 1$"):
        asyncio.run(run_on_hosts(1, hedging.POLICIES, TINY))
