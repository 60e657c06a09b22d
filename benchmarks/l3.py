"""l3: the L3 tier under a job on a testbed of hosts (``python -m benchmarks l3 --hosts N``,
default 8; needs root).

A cluster on hosts (servers/testbed.py): the API server; 2 block servers emulating HDD (4
spindles, a 5 ms seek each) behind links of 200 Mbit/s each way, the origin's 400 Mbit/s
together; 2 L3 nodes behind 1 Gbit/s links; no tracker (no peer tier: the L3 effect alone).
N client hosts at 100 Mbit/s each way, each with its own L2 directory.  These are a tenth of
a 1 Gbit/s host's rates, so that 8 hosts at their links' rate stay within what this machine's
CPU moves between namespaces (docs/testbed.md).

The job is data-parallel: each epoch reads the whole dataset once across the hosts, each
host its shard (the dataset dealt round-robin), as a job whose sampler splits the dataset
by rank does.  Epoch ``e`` gives host ``i`` shard ``i + e``: the reshuffle between epochs
means a host reads in epoch 2 what other hosts read in epoch 1, so its own L1 and L2 have
none of it and every chunk comes from L3 or the origin.  Two epochs, three ways, in one run
(each run with L3 on a dataset of its own, so its epoch 1 finds L3 cold):

- ``l3``: the clients name the L3 nodes;
- ``l3_patient``: the same, the clients' hedging off and a node hung only after 30 s of
  silence.  A host's 4 MiB chunks on its full 100 Mbit/s link take longer than any hedge
  delay (at most ``max_delay_ms``), so the default clients hedge nearly every L3 read to the
  other node, which does not hold the chunk and reads it through from the origin, even once
  the client has cancelled that loser (``*_l3_hedges_sent``, ``*_l3_hedges_won``,
  ``*_l3_hung_failovers``, ``*_l3_node_fills``: chunks a node read through from the origin,
  as the clients saw them);
- ``no_l3``: the same job without them (``l3_urls`` removed; fresh L2 directories).

Some jobs read everything on every host (evaluation, a small dataset each rank shuffles
alone): ``l3_whole``, ``l3_whole_patient`` and ``no_l3_whole`` are one epoch of every host
reading a 4x smaller dataset, all in the same order at once, so the L3 nodes see the hosts'
misses of a chunk together (a node reads a chunk from the origin once for all of them: about
1 origin byte per dataset byte, against about N without L3).

Every host checks every blob's digest (a wrong byte fails the run).  Per run and epoch:

- ``*_origin_per_dataset_byte_e1`` / ``_e2``: the block servers' ``bandwidth_bytes_total``
  moved ÷ the dataset's bytes (l3: about 1 then about 0; no_l3: about 1 each epoch);
- ``*_host_rate_vs_link_e*`` (median host) and ``*_min``: each host's MB/s ÷ its link's;
- ``*_time_vs_bound_e*``: the epoch's time (its slowest host's) ÷ the largest of its floors
  (``*_floor_{link,l3_uplink,origin,cpu}_s``: its bytes over the host links, the L3
  uplinks, the origin link; the CPU every reader and server spent ÷ the cores), with the
  bound named in the goal column; ``*_busy`` is the machine's busy share meanwhile.
- ``l3_e2_speedup``, ``l3_patient_e2_speedup``: no_l3's epoch 2 time ÷ that run's.

Every run's clients wait up to 120 s for a server (``TIMEOUTS``): with the defaults (30 s)
8 hosts' reads queued at the saturated origin fail without L3.

``*_l3_chunk_share`` is the share of chunks L3 served, ``*_l4_hedges`` the hedged reads the
clients sent to the origin.  ``--quick`` reads 24 MiB (and 8 MiB) instead of 128 MiB (and 32).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from blobsdk.config import HedgeConfig, Timeouts
from servers.cluster import start_cluster
from servers.clusterhosts import ClientHost
from servers.swarm import BLOB_MB, write_dataset
from servers.testbed import Link

from ._cpu import floor_cpu_s_per_gb
from ._l3_job import Epoch, Rates, run_job
from ._report import Report, median

HOSTS = 8
EPOCHS = 2
# A tenth of 1 Gbit/s hosts, a 4 Gbit/s origin and 10 Gbit/s L3 nodes: at full scale 8 hosts
# would need 1 GB/s, 5x what this 2-core machine moves between namespaces, and every figure
# would measure its CPU (and the CPU-starved L3 nodes' hedges and fail-overs) instead.
RATES = Rates(host=100.0, origin=400.0, l3=1000.0, l3_nodes=2)
# Every run's clients wait longer than the defaults for a server: 8 hosts' reads queue at an
# origin that serves them at half their links' rate, and a body shares its host's 100 Mbit/s
# with ~16 others (a tbf drops what overflows; TCP backs off for seconds).
TIMEOUTS = Timeouts(sock_read=120.0, stall=60.0, total=900.0)
BLOCK_SERVERS = 2
HDD = {"latency_ms": 5.0, "spindles": 4}
WHOLE_PART = 4  # the whole-dataset job reads a dataset this many times smaller
# (run, L3 on, epochs): the sharded job with L3, with L3 and patient clients, without L3;
# then the whole-dataset job the same three ways.
JOBS = (
    ("l3", True, EPOCHS),
    ("l3_patient", True, EPOCHS),
    ("no_l3", False, EPOCHS),
    ("l3_whole", True, 1),
    ("l3_whole_patient", True, 1),
    ("no_l3_whole", False, 1),
)
# The patient clients' hedging: none, and a node is hung only after 30 s in service.
PATIENT = HedgeConfig(enabled=False, hang_min_ms=30_000.0, hang_max_ms=30_000.0)


def options(args: argparse.Namespace) -> dict[str, Any]:
    hosts = HOSTS if args.hosts is None else args.hosts
    if hosts < 2:
        raise SystemExit("l3: --hosts must be at least 2 (epoch 2 gives each host a shard another host read)")
    return {"hosts": hosts}


async def run(quick: bool = False, hosts: int = HOSTS, jobs: Sequence[tuple[str, bool, int]] = JOBS) -> Report:
    """The runs of ``jobs`` (all of them by default; the speedups need their runs)."""
    report = Report("l3")
    size_mb = 24 if quick else 128
    with tempfile.TemporaryDirectory(prefix="bench-l3-") as tmp:
        root = Path(tmp)
        async with start_cluster(root / "cluster", **_cluster_options()) as cluster:
            assert cluster.config is not None
            clients = [cluster.add_client_host(f"client-{i}", _link(RATES.host)) for i in range(hosts)]
            data = {}  # each run with L3 reads a dataset of its own: its epoch 1 finds L3 cold
            for name in dict.fromkeys(_dataset_of(job[0]) for job in jobs):
                mb = size_mb // WHOLE_PART if name.startswith("whole") else size_mb
                data[name] = await write_dataset(cluster.config, mb, prefix=f"/{name}/")
            runs = {}
            for name, l3, epochs in jobs:
                config_of = _config_of(root / name, l3, patient=name.endswith("patient"))
                digests = data[_dataset_of(name)]
                runs[name] = await run_job(cluster, clients, digests, config_of, epochs, root / name, whole="whole" in name)
    for name, l3, _ in jobs:
        dataset = len(data[_dataset_of(name)]) * (BLOB_MB << 20)
        for e, epoch in enumerate(runs[name], 1):
            _epoch_figures(report, f"{name}_e{e}", epoch, dataset, RATES if l3 else _without_l3(RATES))
    for run in ("l3", "l3_patient"):
        if run in runs and "no_l3" in runs:
            report.ratios[f"{run}_e2_speedup"] = runs["no_l3"][-1].seconds / runs[run][-1].seconds
    sizes = {name: len(digests) * (BLOB_MB << 20) for name, digests in data.items()}
    for name, size in sizes.items():
        report.metrics[f"{name}_dataset_mb"] = size / 1e6
    report.metrics["floor_cpu_s_per_GB"] = floor_cpu_s_per_gb(os.urandom(4 << 20))
    report.goals.update(
        {
            "l3_origin_per_dataset_byte_e1": "about 1",
            "l3_origin_per_dataset_byte_e2": "about 0",
            "l3_patient_origin_per_dataset_byte_e2": "about 0",
            "no_l3_origin_per_dataset_byte_e2": "about 1",
            "l3_whole_origin_per_dataset_byte_e1": "about 1 (L3 dedups concurrent misses)",
            "l3_whole_patient_origin_per_dataset_byte_e1": "about 1",
            "no_l3_whole_origin_per_dataset_byte_e1": f"about {hosts}",
        }
    )
    report.details.update(hosts=hosts, epochs=EPOCHS, rates_mbit=dataclasses.asdict(RATES))
    report.details.update(dataset_bytes=sizes)
    return report


def _dataset_of(run: str) -> str:
    """The dataset ``run`` reads: sharded or whole, and a patient run's own (no_l3 runs
    share them: their reads leave no copy behind)."""
    base = "whole" if "whole" in run else "sharded"
    return f"{base}_patient" if run.endswith("patient") else base


def _cluster_options() -> dict[str, Any]:
    per_block = RATES.origin / BLOCK_SERVERS
    links = {"block": _link(per_block), "l3": _link(RATES.l3), "api": Link()}
    return {"block_servers": BLOCK_SERVERS, "l3_nodes": RATES.l3_nodes, "trackers": 0, "hosts": True, "links": links, **HDD}


def _link(mbit: float | None) -> Link:
    return Link(up=mbit, down=mbit)


def _without_l3(rates: Rates) -> Rates:
    return Rates(host=rates.host, origin=rates.origin, l3=None, l3_nodes=0)


def _config_of(dir: Path, l3: bool, patient: bool) -> Any:
    """Each host's config in one run: its own fresh L2 directory, the L3 nodes or none."""

    def config_of(host: ClientHost) -> Any:
        l2 = msgspec.structs.replace(host.config.l2, dir=str(dir / host.host.name / "l2"))
        config = msgspec.structs.replace(host.config, l2=l2, timeouts=TIMEOUTS)
        if patient:
            config = msgspec.structs.replace(config, hedge=PATIENT)
        return config if l3 else msgspec.structs.replace(config, l3_urls=())

    return config_of


def _epoch_figures(report: Report, key: str, epoch: Epoch, dataset: int, rates: Rates) -> None:
    link_mb_s = rates.host / 8
    run, e = key.rsplit("_", 1)
    ratios = [r.mb_per_s / link_mb_s for r in epoch.reads]
    report.ratios[f"{run}_origin_per_dataset_byte_{e}"] = epoch.origin_bytes / dataset
    report.ratios[f"{run}_host_rate_vs_link_{e}"] = median(ratios)
    report.ratios[f"{run}_host_rate_vs_link_{e}_min"] = min(ratios)
    floors = epoch.floors(rates)
    bound = max(floors, key=floors.__getitem__)
    report.ratios[f"{run}_time_vs_bound_{e}"] = epoch.seconds / floors[bound]
    report.goals[f"{run}_time_vs_bound_{e}"] = f"bound: {bound}"
    report.metrics[f"{key}_s"] = epoch.seconds
    report.metrics[f"{key}_host_mb_s"] = median([r.mb_per_s for r in epoch.reads])
    report.metrics[f"{key}_l3_chunk_share"] = epoch.share("l3")
    for name, floor in floors.items():
        report.metrics[f"{key}_floor_{name}_s"] = floor
    report.metrics[f"{key}_cpu_s_per_GB"] = epoch.cpu_s / (epoch.bytes / 1e9)
    report.metrics[f"{key}_busy"] = epoch.busy
    report.metrics[f"{key}_l4_hedges"] = sum(r.l4_hedges for r in epoch.reads)
    # What took L3 reads to the origin:
    for stat in ("node_fills", "hedge_hedges_sent", "hedge_hedges_won", "hedge_hung_failovers"):
        report.metrics[f"{key}_l3_{stat.removeprefix('hedge_')}"] = sum(r.l3.get(stat, 0) for r in epoch.reads)
    reads = epoch.reads
    report.details[key] = {"bound": bound, "bytes": [r.bytes for r in reads], "hits": [r.hits for r in reads]}
    report.details[key]["seconds"] = [r.seconds for r in reads]
    report.details[key]["l3"] = [r.l3 for r in reads]
