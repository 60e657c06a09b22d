"""l3: the L3 tier under a job on a testbed of hosts (``python -m benchmarks l3 --hosts N``,
default 8; needs root).

A cluster on hosts (servers/testbed.py): the API server; 2 block servers emulating HDD (4
spindles, a 5 ms seek each) behind links of 500 Mbit/s each way, the origin's 1 Gbit/s
together; 2 L3 nodes behind 10 Gbit/s links; no tracker (no peer tier: the L3 effect alone).
N client hosts at 1 Gbit/s each way, each with its own L2 directory.

The job is data-parallel: each epoch reads the whole dataset once across the hosts, each
host its shard (the dataset dealt round-robin), as a job whose sampler splits the dataset
by rank does.  Epoch ``e`` gives host ``i`` shard ``i + e``: the reshuffle between epochs
means a host reads in epoch 2 what other hosts read in epoch 1, so its own L1 and L2 have
none of it and every chunk comes from L3 or the origin.  Two epochs, twice, in one run:

- ``l3``: the clients name the L3 nodes;
- ``no_l3``: the same job without them (``l3_urls`` removed; fresh L2 directories).

Some jobs read everything on every host (evaluation, a small dataset each rank shuffles
alone): ``l3_whole`` and ``no_l3_whole`` are one epoch of every host reading a second,
4x smaller dataset, all in the same order at once, so the L3 nodes see the hosts' misses
of a chunk together (a node reads a chunk from the origin once for all of them: about 1
origin byte per dataset byte, against about N without L3).

Every host checks every blob's digest (a wrong byte fails the run).  Per run and epoch:

- ``*_origin_per_dataset_byte_e1`` / ``_e2``: the block servers' ``bandwidth_bytes_total``
  moved ÷ the dataset's bytes (l3: about 1 then about 0; no_l3: about 1 each epoch);
- ``*_host_rate_vs_link_e*`` (median host) and ``*_min``: each host's MB/s ÷ its link's;
- ``*_time_vs_bound_e*``: the epoch's time (its slowest host's) ÷ the largest of its floors
  (``*_floor_{link,l3_uplink,origin,cpu}_s``: its bytes over the host links, the L3
  uplinks, the origin link; the CPU every reader and server spent ÷ the cores), with the
  bound named in the goal column; ``*_busy`` is the machine's busy share meanwhile.
- ``l3_e2_speedup``: no_l3's epoch 2 time ÷ l3's.

``*_l3_chunk_share`` is the share of chunks L3 served, ``*_l4_hedges`` the hedged reads the
clients sent to the origin.  ``--quick`` reads 64 MiB (and 16 MiB) instead of 512 MiB (and 128).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from servers.cluster import start_cluster
from servers.clusterhosts import ClientHost
from servers.swarm import BLOB_MB, write_dataset
from servers.testbed import Link

from ._cpu import floor_cpu_s_per_gb
from ._l3_job import Epoch, Rates, run_job
from ._report import Report, median

HOSTS = 8
EPOCHS = 2
RATES = Rates(host=1000.0, origin=1000.0, l3=10_000.0, l3_nodes=2)
BLOCK_SERVERS = 2
HDD = {"latency_ms": 5.0, "spindles": 4}
WHOLE_PART = 4  # the whole-dataset job reads a dataset this many times smaller
# (run, L3 on, epochs): the sharded job with L3 and without, then the whole-dataset job.
JOBS = (("l3", True, EPOCHS), ("no_l3", False, EPOCHS), ("l3_whole", True, 1), ("no_l3_whole", False, 1))


def options(args: argparse.Namespace) -> dict[str, Any]:
    hosts = HOSTS if args.hosts is None else args.hosts
    if hosts < 2:
        raise SystemExit("l3: --hosts must be at least 2 (epoch 2 gives each host a shard another host read)")
    return {"hosts": hosts}


async def run(quick: bool = False, hosts: int = HOSTS) -> Report:
    report = Report("l3")
    size_mb = 64 if quick else 512
    with tempfile.TemporaryDirectory(prefix="bench-l3-") as tmp:
        root = Path(tmp)
        async with start_cluster(root / "cluster", **_cluster_options()) as cluster:
            assert cluster.config is not None
            clients = [cluster.add_client_host(f"client-{i}", _link(RATES.host)) for i in range(hosts)]
            sharded = await write_dataset(cluster.config, size_mb)
            whole = await write_dataset(cluster.config, size_mb // WHOLE_PART, prefix="/whole/")
            runs = {}
            for name, l3, epochs in JOBS:
                config_of = _config_of(root / name, l3)
                data = whole if name.endswith("whole") else sharded
                runs[name] = await run_job(cluster, clients, data, config_of, epochs, root / name, whole=data is whole)
    for name, l3, _ in JOBS:
        dataset = len(whole if name.endswith("whole") else sharded) * (BLOB_MB << 20)
        for e, epoch in enumerate(runs[name], 1):
            _epoch_figures(report, f"{name}_e{e}", epoch, dataset, RATES if l3 else _without_l3(RATES))
    report.ratios["l3_e2_speedup"] = runs["no_l3"][-1].seconds / runs["l3"][-1].seconds
    report.metrics["dataset_mb"] = len(sharded) * BLOB_MB * (1 << 20) / 1e6
    report.metrics["whole_dataset_mb"] = len(whole) * BLOB_MB * (1 << 20) / 1e6
    report.metrics["floor_cpu_s_per_GB"] = floor_cpu_s_per_gb(os.urandom(4 << 20))
    report.goals.update(
        {
            "l3_origin_per_dataset_byte_e1": "about 1",
            "l3_origin_per_dataset_byte_e2": "about 0",
            "no_l3_origin_per_dataset_byte_e2": "about 1",
            "l3_whole_origin_per_dataset_byte_e1": "about 1 (L3 dedups concurrent misses)",
            "no_l3_whole_origin_per_dataset_byte_e1": f"about {hosts}",
        }
    )
    report.details.update(hosts=hosts, epochs=EPOCHS, rates_mbit=dataclasses.asdict(RATES))
    report.details.update(dataset_bytes=len(sharded) * (BLOB_MB << 20), whole_dataset_bytes=len(whole) * (BLOB_MB << 20))
    return report


def _cluster_options() -> dict[str, Any]:
    per_block = RATES.origin / BLOCK_SERVERS
    links = {"block": _link(per_block), "l3": _link(RATES.l3), "api": Link()}
    return {"block_servers": BLOCK_SERVERS, "l3_nodes": RATES.l3_nodes, "trackers": 0, "hosts": True, "links": links, **HDD}


def _link(mbit: float | None) -> Link:
    return Link(up=mbit, down=mbit)


def _without_l3(rates: Rates) -> Rates:
    return Rates(host=rates.host, origin=rates.origin, l3=None, l3_nodes=0)


def _config_of(dir: Path, l3: bool) -> Any:
    """Each host's config in one run: its own fresh L2 directory, the L3 nodes or none."""

    def config_of(host: ClientHost) -> Any:
        l2 = msgspec.structs.replace(host.config.l2, dir=str(dir / host.host.name / "l2"))
        config = msgspec.structs.replace(host.config, l2=l2)
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
    reads = epoch.reads
    report.details[key] = {"bound": bound, "bytes": [r.bytes for r in reads], "hits": [r.hits for r in reads]}
    report.details[key]["seconds"] = [r.seconds for r in reads]
