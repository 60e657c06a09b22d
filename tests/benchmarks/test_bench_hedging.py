"""benchmarks/hedging.py on loopback: one scenario's batches, every policy, at a toy size (the
figures are the benchmark's; this checks the path runs and records what the report needs)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import hedging
from benchmarks._report import Report
from benchmarks._servers import block_servers


async def test_the_slow_replica_scenario_records_every_policys_batches(tmp_path: Path) -> None:
    report = Report("hedging")
    with block_servers(tmp_path, hedging.SCENARIOS["slow_replica"]) as urls:
        await hedging._scenario(report, "slow_replica", urls, batches=3)
    for policy in hedging.POLICIES:
        assert report.metrics[f"slow_replica_{policy}_p99_ms"] > 0
        assert f"slow_replica_{policy}_extra" in report.metrics
