"""p2p: the peer tier.  N = 8 reader processes, each a blobsdk client with its own
peer server, read the same dataset at the same moment from a local cluster (API server, 2
block servers emulating HDD, 1 tracker; separate processes), in one run:

- ``single``: one reader alone (peers configured, nobody to share with): the origin's pace;
- ``peers``: all 8 together with the peer tier;
- ``no_peers``: all 8 together without it (no ``tracker_urls``).

The origin is the scarce resource, as in production: the block servers move at most
``ORIGIN_MBPS`` MB/s between them (each half of it, shared by every transfer), and each
has 4 spindles with a 5 ms seek.  Origin egress is what the block servers' bandwidth
budgets moved during a run (their ``bandwidth_bytes_total`` counters), so hedged or abandoned L4
reads count too.  Every reader checks every blob's digest.

Ratios: ``origin_egress`` (peers run: origin bytes ÷ dataset size; goal <= 1.25),
``origin_egress_no_peers`` (about N), ``slowest_vs_single`` (peers run: the slowest
reader's time ÷ the single reader's; goal <= 1.5).  Metrics: each run's seconds and MB/s
per reader, and ``*_readers_cpu_floor_s``: the readers' CPU seconds ÷ the machine's cores, a
floor on the run's time that no schedule beats here (the servers' CPU comes on top).
``*_reader_cpu_s_per_GB``: the median reader's CPU seconds per GB it read (its peer
server's sends included), and ``peers_cpu_vs_floor`` the peers run's against the memcpy +
xxh3 floor measured in the same run (benchmarks/_cpu.py; goal <= 1.5);
``*_reader_faults_per_GB`` the median reader's minor page faults per GB it read.
``--quick`` reads 128 MiB instead of 512 MiB.

``--hosts N``: N readers, each in a host of its own on a testbed of emulated links, with the
link-rate bounds and ``swarm_sim`` at the same N and rates (benchmarks/_p2p_hosts.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from servers.cluster import start_cluster
from servers.swarm import BLOB_MB, read_together, write_dataset

from ._cpu import CPU_GOAL, floor_cpu_s_per_gb
from ._p2p_metrics import run_metrics
from ._report import Report

READERS = 8
ORIGIN_MBPS = 120.0  # aggregate over the 2 block servers


def options(args: Any) -> dict[str, Any]:
    """``--hosts N``: on a testbed of N client hosts (absent: loopback)."""
    return {"hosts": args.hosts}


async def run(quick: bool = False, hosts: int | None = None) -> Report:
    if hosts is not None:
        from ._p2p_hosts import run_on_hosts  # only with --hosts

        return await run_on_hosts(hosts, quick)
    report = Report("p2p")
    size_mb = 128 if quick else 512
    with tempfile.TemporaryDirectory(prefix="bench-p2p-") as tmp:
        root = Path(tmp)
        options = {"bandwidth_mbps": ORIGIN_MBPS / 2, "latency_ms": 5.0, "spindles": 4}
        async with start_cluster(root / "cluster", block_servers=2, l3_nodes=0, trackers=1, **options) as cluster:
            assert cluster.config is not None
            peers = cluster.config
            no_peers = msgspec.structs.replace(peers, tracker_urls=())
            digests = await write_dataset(peers, size_mb)
            dataset = len(digests) * (BLOB_MB << 20)
            runs = {
                "single": await read_together(peers, digests, 1, root / "single"),
                "peers": await read_together(peers, digests, READERS, root / "peers"),
                "no_peers": await read_together(no_peers, digests, READERS, root / "no_peers"),
            }
    for name, (reads, served) in runs.items():
        run_metrics(report, name, reads, served, dataset)
    single = runs["single"][0][0].seconds
    report.ratios["origin_egress"] = runs["peers"][1] / dataset
    report.ratios["origin_egress_no_peers"] = runs["no_peers"][1] / dataset
    report.ratios["slowest_vs_single"] = max(r.seconds for r in runs["peers"][0]) / single
    floor = report.metrics["floor_cpu_s_per_GB"] = floor_cpu_s_per_gb(os.urandom(4 << 20))
    report.ratios["peers_cpu_vs_floor"] = report.metrics["peers_reader_cpu_s_per_GB"] / floor
    report.goals.update(
        {
            "origin_egress": "goal <= 1.25",
            "origin_egress_no_peers": f"about {READERS}",
            "slowest_vs_single": "goal <= 1.5",
            "peers_cpu_vs_floor": CPU_GOAL,
        }
    )
    return report
