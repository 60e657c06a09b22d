"""benchmarks/_p2p_hosts.py: ``python -m benchmarks p2p --hosts N``'s link-rate bounds, and its
quick form on a testbed of 4 hosts (skipped without root): the report's shape and every
byte each host read (no speed is asserted)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import p2p
from benchmarks._p2p_hosts import RUNS, _peer_stats, cpu_Bps, link_floor_s, no_peers_floor_s, run_on_hosts, tree_ideal_s
from benchmarks._swarm_model import Swarm
from benchmarks.swarm_sim import link_params
from servers.swarm import Read

MiB = 1 << 20
D, C, L = 512 * MiB, 4 * MiB, 125e6


def test_a_tree_shares_each_senders_uplink_among_its_children_and_fills_one_chunk_per_level() -> None:
    assert tree_ideal_s(1, D, C, L, L, 4) == D / L  # the origin to one host
    assert tree_ideal_s(4, D, C, L, L, 4) == D / (L / 4)  # one level: no fill
    assert tree_ideal_s(8, D, C, L, L, 4) == (D + C) / (L / 4)  # 4 + 16 >= 8: two levels
    assert tree_ideal_s(21, D, C, L, L, 4) == (D + 2 * C) / (L / 4)  # 4 + 16 < 21: three
    assert tree_ideal_s(2, D, C, L, 4 * L, 4) == D / L  # a fast origin: the host's downlink
    assert tree_ideal_s(8, D, C, L, L, 2) == (D + 2 * C) / (L / 2)  # 2 + 4 < 8 <= 2 + 4 + 8


def test_the_floors_without_peers_and_for_any_schedule() -> None:
    assert no_peers_floor_s(8, D, L, L) == 8 * D / L
    assert no_peers_floor_s(2, D, L, 10 * L) == D / L  # each host at its own link
    assert link_floor_s(8, D, L, L) == D / L
    assert link_floor_s(8, D, L, L / 4) == 4 * D / L  # the dataset must leave the origin once


def test_the_simulation_takes_the_testbeds_link_rates_as_given() -> None:
    alone = Swarm(link_params(1, 16 * MiB, L, L)).run()
    assert 16 * MiB / L < max(alone.completion_s) < 16 * MiB / L + 0.1  # the host's link, plus the seeks and RTTs
    crowd = Swarm(link_params(4, 16 * MiB, L, L, peers=False)).run()
    assert 4 * 16 * MiB / L < max(crowd.completion_s) < 4 * 16 * MiB / L + 0.1  # the origin's uplink, shared by 4
    assert crowd.origin_bytes == 4 * 16 * MiB


def test_the_simulated_testbed_holds_a_sends_upload_slot_to_its_last_byte() -> None:
    # A shaped link's send buffer is a flow's window, not a 4 MiB chunk: max_uploads binds,
    # the next child is refused (429) and waits for its busy sources, not the origin.
    params = link_params(8, 128 * MiB, L / 5, L / 5)  # p2p --hosts 8 at 200 Mbit/s
    result = Swarm(params).run()
    assert params.sndbuf_bytes < params.chunk_bytes and result.problems["refused"] >= 1
    assert result.problems["busy_waits"] >= 1 and result.origin_chunks == 32  # each chunk once


def test_the_simulation_shares_the_readers_cpu_among_every_host() -> None:
    assert cpu_Bps(8, D, 16.0, 2) == 8 * D / 8.0  # 16 CPU s over 2 cores for 8 x D received
    assert cpu_Bps(1, D, 4.0, 2) == D / 4.0  # a lone reader has one core
    fast = Swarm(link_params(4, 16 * MiB, L, L)).run()
    pooled = Swarm(link_params(4, 16 * MiB, L, L, cpu_Bps=L / 2)).run()  # the cores: half a link for all
    assert max(fast.completion_s) < 4 * 16 * MiB / (L / 2) <= max(pooled.completion_s)


def test_peer_stats_sum_the_readers_counters_and_take_the_median_readers_latencies() -> None:
    def read(peer: dict[str, float]) -> Read:
        return Read(seconds=1.0, bytes=1, wrong=[], hits={}, peer=peer, cpu_s=0.1, l4_hedges=0)

    reads = [read({"hits": 3, "p50_ms": 10.0}), read({"hits": 4, "p50_ms": 30.0, "errors": 1}), read({"p50_ms": 20.0})]
    assert _peer_stats(reads) == {"errors": 1.0, "hits": 7.0, "p50_ms": 20.0}


def test_hosts_is_the_option_p2p_takes() -> None:
    assert p2p.options(argparse.Namespace(hosts=4)) == {"hosts": 4}
    assert p2p.options(argparse.Namespace(hosts=None)) == {"hosts": None}


async def test_p2p_on_4_hosts_reports_each_run_against_its_bounds_and_every_byte_read(testbed_unavailable) -> None:
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    report = await run_on_hosts(4, quick=True, phases=((500.0, 16),))
    dataset = 16 * MiB
    assert report.metrics["mbit500_dataset_mb"] == dataset / 1e6 and report.metrics["hosts"] == 4
    reads = report.details["reads"]
    assert reads["mbit500_single"] == {"hosts": ["reader-0"], "bytes": [dataset], "wrong": []}
    for run in ("peers", "no_peers"):
        assert reads[f"mbit500_{run}"] == {"hosts": [f"reader-{i}" for i in range(4)], "bytes": [dataset] * 4, "wrong": []}
    for run in RUNS:
        assert report.metrics[f"mbit500_{run}_link_drops"] >= 0
        for figure in ("slowest_s", "readers_cpu_floor_s", "origin_mb"):
            assert report.metrics[f"mbit500_{run}_{figure}"] > 0
        assert report.ratios[f"mbit500_sim_vs_measured_{run}"] > 0
        assert report.ratios[f"mbit500_sim_cpu_vs_measured_{run}"] > 0
        assert report.metrics[f"mbit500_sim_cpu_{run}_pool_mb_s"] > 0
    for figure in ("tree_ideal_s", "no_peers_floor_s", "link_floor_s", "sim_origin_egress"):
        assert report.metrics[f"mbit500_{figure}"] > 0
    assert report.metrics["mbit500_no_peers_peer_chunk_share"] == 0
    assert report.ratios["mbit500_origin_egress_no_peers"] >= 4 * 0.99  # every host read the origin
    # on the wire too (frames' payload, estimated): every host's copy, and the peers' one at least
    assert report.ratios["mbit500_no_peers_origin_wire_egress"] >= 4 * 0.95
    assert report.ratios["mbit500_peers_origin_wire_egress"] >= 0.95
    assert report.details["bound"]["mbit500"] in ("cpu", "links")
    assert set(report.details["peer_stats"]) == {f"mbit500_{run}" for run in RUNS}
    assert set(report.details["l4_stats"]) == set(report.details["peer_stats"])
    assert report.details["l4_stats"]["mbit500_no_peers"]["hedge_primaries"] >= 4 * dataset // (4 * MiB)
    assert not report.failed
