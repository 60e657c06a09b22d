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
RUNS = {"l3": 2, "no_l3": 2, "l3_whole": 1, "no_l3_whole": 1}  # run -> its epochs
PER_EPOCH = ("s", "host_mb_s", "l3_chunk_share", "floor_link_s", "floor_origin_s", "floor_cpu_s", "cpu_s_per_GB")


def test_each_job_and_epoch_is_reported_and_every_byte_was_read(testbed_unavailable: str | None) -> None:
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    report = asyncio.run(l3.run(quick=True, hosts=HOSTS))
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
            assert got == [report.details["whole_dataset_bytes"]] * HOSTS
        else:  # the hosts' shards make up the dataset once
            assert len(got) == HOSTS and sum(got) == report.details["dataset_bytes"]
    assert ("l3_e1_floor_l3_uplink_s" in report.metrics, "no_l3_e1_floor_l3_uplink_s" in report.metrics) == (True, False)
    # Epoch 2 reads shards other hosts read in epoch 1: L3 serves them all, the origin nothing
    # (no timing decides that: the L3 nodes hold the whole dataset after epoch 1).
    assert report.metrics["l3_e2_l3_chunk_share"] == 1.0
    assert report.ratios["l3_origin_per_dataset_byte_e2"] < 0.1
    assert report.metrics["no_l3_e2_l3_chunk_share"] == 0.0
    assert report.ratios["no_l3_origin_per_dataset_byte_e2"] >= 1.0
    assert report.ratios["no_l3_whole_origin_per_dataset_byte_e1"] >= HOSTS


def test_a_wrong_byte_stops_the_run() -> None:
    good = Read(seconds=1.0, bytes=8, wrong=[], hits={}, peer={}, cpu_s=0.1, l4_hedges=0)
    assert check_reads([good]) == [good]
    bad = Read(seconds=1.0, bytes=8, wrong=["/swarm/00003.bin"], hits={}, peer={}, cpu_s=0.1, l4_hedges=0)
    with pytest.raises(RuntimeError, match=r"^readers got wrong bytes for 1 blobs, e\.g\. /swarm/00003\.bin$"):
        check_reads([good, bad])
