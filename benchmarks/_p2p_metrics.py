"""The figures of one p2p run (benchmarks/p2p.py on loopback, benchmarks/_p2p_hosts.py on a
testbed): what its readers reported, and the bytes the origin served."""

from __future__ import annotations

import os

from servers.swarm import Read

from ._report import Report, median


def run_metrics(report: Report, name: str, reads: list[Read], served: int, dataset: int) -> None:
    report.metrics[f"{name}_slowest_s"] = max(r.seconds for r in reads)
    report.metrics[f"{name}_median_mb_s"] = median([r.mb_per_s for r in reads])
    report.metrics[f"{name}_slowest_mb_s"] = min(r.mb_per_s for r in reads)
    report.metrics[f"{name}_origin_mb"] = served / 1e6
    report.metrics[f"{name}_l4_hedges"] = sum(r.l4_hedges for r in reads)
    chunks = sum(sum(r.hits.values()) for r in reads)
    report.metrics[f"{name}_peer_chunk_share"] = sum(r.hits["peer"] for r in reads) / max(1, chunks)
    report.metrics["dataset_mb"] = dataset / 1e6
    # The readers' own CPU time spread over every core: a floor no schedule of them beats here.
    report.metrics[f"{name}_readers_cpu_floor_s"] = sum(r.cpu_s for r in reads) / (os.cpu_count() or 1)
    # A reader's own CPU per GB it read (the median reader; its peer server's sends included).
    report.metrics[f"{name}_reader_cpu_s_per_GB"] = median([r.cpu_s / (dataset / 1e9) for r in reads])
    # Its page faults per GB (a GB is 244,141 pages: 1 a page is every byte landing in fresh memory once).
    report.metrics[f"{name}_reader_faults_per_GB"] = median([r.minor_faults / (dataset / 1e9) for r in reads])
