"""The l3 benchmark (benchmarks/l3.py) at a small size on a testbed of 3 client hosts: every
job and epoch is reported, every host read its whole part (each blob's digest checked by its
reader), the origin bytes are what caching must give where no timing is involved; no speed is
asserted (those figures are the benchmark's).  Skips where namespaces cannot be made."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import l3
from servers.swarm import Read, check_reads

HOSTS = 3
# Two of the benchmark's five runs (benchmarks.l3.JOBS; each epoch starts a reader process
# per host, seconds on a loaded machine): run -> its epochs.
RUNS = {"l3": 2, "no_l3_whole": 1}
PER_EPOCH = ("s", "host_mb_s", "l3_chunk_share", "floor_link_s", "floor_origin_s", "floor_cpu_s", "cpu_s_per_GB")


def test_each_job_and_epoch_is_reported_and_every_byte_was_read(testbed_unavailable: str | None) -> None:
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    jobs = [job for job in l3.JOBS if job[0] in RUNS]
    report = asyncio.run(l3.run(quick=True, hosts=HOSTS, jobs=jobs))
    assert not report.failed
    keys = [f"{run}_e{e}" for run, epochs in RUNS.items() for e in range(1, epochs + 1)]
    for key in keys:
        run, e = key.rsplit("_", 1)
        assert {f"{key}_{name}" for name in PER_EPOCH} <= set(report.metrics)
        assert report.ratios[f"{run}_origin_per_dataset_byte_{e}"] >= 0
        assert report.ratios[f"{run}_host_rate_vs_link_{e}_min"] <= report.ratios[f"{run}_host_rate_vs_link_{e}"]
        assert report.ratios[f"{run}_time_vs_bound_{e}"] > 0
        assert report.goals[f"{run}_time_vs_bound_{e}"] == f"bound: {report.details[key]['bound']}"
        got = report.details[key]["bytes"]  # each host's bytes, every blob's digest checked
        if "whole" in run:  # every host read the whole (second) dataset
            assert got == [report.details["dataset_bytes"]["whole"]] * HOSTS
        else:  # the hosts' shards make up the dataset once
            assert len(got) == HOSTS and sum(got) == report.details["dataset_bytes"]["sharded"]
    assert "l3_e1_floor_l3_uplink_s" in report.metrics and "no_l3_whole_e1_floor_l3_uplink_s" not in report.metrics
    # Without L3 every chunk a host reads comes from the origin (hedges only add to it).
    assert report.metrics["no_l3_whole_e1_l3_chunk_share"] == 0.0
    assert report.ratios["no_l3_whole_origin_per_dataset_byte_e1"] >= HOSTS
    assert set(report.details["rates_mbit"]) == {"host", "origin", "l3", "l3_nodes"}
    assert set(report.details["dataset_bytes"]) == {"sharded", "whole"}  # only the datasets the runs read
    assert not any(ratio.endswith("speedup") for ratio in report.ratios)  # no no_l3 run to compare with


def test_a_wrong_byte_stops_the_run() -> None:
    good = Read(seconds=1.0, bytes=8, wrong=[], hits={}, peer={}, cpu_s=0.1, l4_hedges=0)
    assert check_reads([good]) == [good]
    bad = Read(seconds=1.0, bytes=8, wrong=["/swarm/00003.bin"], hits={}, peer={}, cpu_s=0.1, l4_hedges=0)
    with pytest.raises(RuntimeError, match=r"^readers got wrong bytes for 1 blobs, e\.g\. /swarm/00003\.bin$"):
        check_reads([good, bad])
