"""p2p on a testbed of hosts (``python -m benchmarks p2p --hosts N``): the cluster on hosts
(servers/clusterhosts.py: the API server, 2 block servers with 4 spindles and a 5 ms seek,
the tracker, each in a network namespace of its own) and N client hosts, each running one
reader (servers/swarm.py) with its own address, link, L2 directory and peer server.  Each
phase sets every reader host's link to ``R`` Mbit/s each way and the origin's uplink to ``R``
in total (each block server ``R / 2``), then runs ``single``, ``peers`` and ``no_peers`` as the
loopback form does, over a prefix of one dataset written once.  Full: R = 1000 over 512 MiB,
then R = 200 over 128 MiB (where the links, not this machine's cores, are the bound);
``--quick``: the same rates over 128 and 32 MiB.

Bounds, per phase, in payload bytes per second (a tbf counts the whole frame: a TCP segment
of a 1500-byte MTU carries ``GOODPUT`` = 1448 / 1514 of it), with D the dataset, c the SDK's
4 MiB chunk, U the origin's uplink, L a host's link, k the tracker's fan-out
(``TrackerConfig().fanout``, children per source per chunk):

- ``tree_ideal_s``: a pipelined k-ary tree rooted at the origin, every sender's uplink shared
  by its k children (the origin's by min(k, N)): rate r = min(U / min(k, N), L, L / k if N > k),
  depth d the least with k + k² + ... + k^d >= N, each level one chunk behind the one above
  (store and forward per chunk):  T = (D + (d - 1) c) / r;
- ``no_peers_floor_s``: every host from the origin alone: N D / min(U, N L);
- ``link_floor_s``: no schedule beats it: every byte leaves the origin once, every host takes
  D through its link, and the N D received is sent by the origin and the hosts together:
  max(D / U, D / L, N D / (U + N L));
- ``*_link_drops``: packets the shaped links' tbf queues dropped during the run (a queue
  holds 50 ms of its rate; a drop costs its flow a retransmission, a tail drop a timeout);
- ``*_readers_cpu_floor_s``: the readers' CPU seconds over the machine's cores (the servers'
  CPU, and the kernel's moving of packets across veths and the bridge outside the readers'
  own time, come on top).  ``*_cpu_floor_vs_tree_ideal`` > 1 says the machine, not the
  links, bounds the run (details ``bound``).

``swarm_sim`` runs in the same command, at the same N and link rates
(``benchmarks/swarm_sim.py``'s ``link_params``), twice: links only (``*_sim_vs_measured_*``),
and with the machine's cores as a pool every flow into a host shares (``*_sim_cpu_*``, goal
0.8-1.2): the bytes/s the readers' CPU allows, measured in the same run (the N readers' CPU
seconds over min(cores, N), for the N x D bytes they received: ``*_sim_cpu_*_pool_mb_s``;
the servers' CPU and the kernel's packet work outside the readers' time are not in it).  Each
ratio is the simulated completion time (the slowest host) over the measured one.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from servers._common import netns
from servers.cluster import Cluster, start_cluster
from servers.clusterhosts import ClientHost
from servers.swarm import BLOB_MB, Read, read_together, write_dataset
from servers.testbed import Host, Link
from servers.tracker_rules import TrackerConfig

from ._p2p_metrics import run_metrics
from ._report import Report, median
from ._swarm_model import Swarm
from .swarm_sim import REAL_CHUNK, link_params

BLOCK_SERVERS = 2
SERVICE_MBIT = 1000.0  # the API server's and the tracker's links (not on the data path)
# (Mbit/s of each host's link and of the origin's uplink in total, MiB read): full, --quick
PHASES: tuple[tuple[float, int], ...] = ((1000.0, 512), (200.0, 128))
QUICK_PHASES: tuple[tuple[float, int], ...] = ((1000.0, 128), (200.0, 32))
GOODPUT = 1448 / 1514  # TCP payload per byte of frame (MTU 1500, timestamps on)
RUNS = ("single", "peers", "no_peers")
_DROPPED = re.compile(r"dropped (\d+)")
# Without peers, N readers x 16 chunks ahead queue at the origin: at 200 Mbit/s that is over
# the default 30 s before a reply's first byte, and an L4 read fails (every replica timed out).
SOCK_READ_S = 120.0


def tree_ideal_s(hosts: int, dataset: int, chunk: int, host_Bps: float, origin_Bps: float, fanout: int) -> float:
    """A pipelined ``fanout``-ary tree from the origin over ``hosts`` (see the module docstring)."""
    rate = min(origin_Bps / min(fanout, hosts), host_Bps, host_Bps / fanout if hosts > fanout else host_Bps)
    depth, reach = 1, fanout
    while reach < hosts:
        depth += 1
        reach += fanout**depth
    return (dataset + (depth - 1) * chunk) / rate


def no_peers_floor_s(hosts: int, dataset: int, host_Bps: float, origin_Bps: float) -> float:
    return hosts * dataset / min(origin_Bps, hosts * host_Bps)


def link_floor_s(hosts: int, dataset: int, host_Bps: float, origin_Bps: float) -> float:
    return max(dataset / origin_Bps, dataset / host_Bps, hosts * dataset / (origin_Bps + hosts * host_Bps))


async def run_on_hosts(hosts: int, quick: bool, phases: Sequence[tuple[float, int]] | None = None) -> Report:
    """Every phase of ``phases`` (default: PHASES, or QUICK_PHASES) on ``hosts`` client hosts."""
    phases = phases or (QUICK_PHASES if quick else PHASES)
    report = Report("p2p")
    links = {"api": Link(SERVICE_MBIT, SERVICE_MBIT), "tracker": Link(SERVICE_MBIT, SERVICE_MBIT)}
    options = {"block_servers": BLOCK_SERVERS, "l3_nodes": 0, "trackers": 1, "latency_ms": 5.0, "spindles": 4}
    with tempfile.TemporaryDirectory(prefix="bench-p2p-hosts-") as tmp:
        root = Path(tmp)
        async with start_cluster(root / "cluster", hosts=True, links=links, **options) as cluster:
            assert cluster.config is not None
            readers = [cluster.add_client_host(f"reader-{i}", Link()) for i in range(hosts)]
            digests = await write_dataset(cluster.config, max(mb for _, mb in phases))
            for mbit, mb in phases:
                subset = dict(list(digests.items())[: max(1, mb // BLOB_MB)])
                await _phase(report, cluster, readers, subset, mbit, root / f"mbit{mbit:g}")
    report.metrics.pop("dataset_mb", None)  # each phase's is its own: {phase}_dataset_mb
    report.metrics["hosts"] = hosts
    report.metrics["fanout"] = TrackerConfig().fanout
    return report


async def _phase(
    report: Report, cluster: Cluster, readers: list[ClientHost], digests: dict[str, str], mbit: float, dir: Path
) -> None:
    assert cluster.config is not None and cluster.placement is not None
    bed = cluster.placement.testbed
    for reader in readers:
        bed.set_link(reader.host, up=mbit, down=mbit)
    for name in (p.name for p in cluster.processes if p.name.startswith("block-")):
        bed.set_link(name, up=mbit / BLOCK_SERVERS, down=SERVICE_MBIT)
    timeouts = msgspec.structs.replace(cluster.config.timeouts, sock_read=SOCK_READ_S)
    peers = msgspec.structs.replace(cluster.config, timeouts=timeouts)
    configs = {"single": peers, "peers": peers, "no_peers": msgspec.structs.replace(peers, tracker_urls=())}
    n = len(readers)
    origin = [bed.host(p.name).outer for p in cluster.processes if p.name.startswith("block-")]
    runs: dict[str, tuple[list[Read], int]] = {}
    wire: dict[str, int] = {}
    drops: dict[str, int] = {}
    shaped = [bed.host(p.name) for p in cluster.processes if p.name.startswith("block-")] + [r.host for r in readers]
    for name in RUNS:
        count = 1 if name == "single" else n
        before, dropped = _received(origin), _dropped(shaped)
        runs[name] = await read_together(configs[name], digests, count, dir / name, readers[:count])
        wire[name], drops[name] = _received(origin) - before, _dropped(shaped) - dropped
    dataset = len(digests) * (BLOB_MB << 20)
    ph = f"mbit{mbit:g}"
    report.metrics[f"{ph}_dataset_mb"] = dataset / 1e6
    for name, (reads, served) in runs.items():
        run_metrics(report, f"{ph}_{name}", reads, served, dataset)
        report.ratios[f"{ph}_{name}_origin_wire_egress"] = wire[name] * GOODPUT / dataset
        report.metrics[f"{ph}_{name}_link_drops"] = drops[name]
        report.details.setdefault("peer_stats", {})[f"{ph}_{name}"] = _peer_stats(reads)
        report.details.setdefault("l4_stats", {})[f"{ph}_{name}"] = _summed([r.l4 for r in reads])
        # read_together raised had any byte been wrong; this says what each host read
        report.details.setdefault("reads", {})[f"{ph}_{name}"] = {
            "hosts": [r.host.name for r in readers[: len(reads)]],
            "bytes": [r.bytes for r in reads],
            "wrong": [path for r in reads for path in r.wrong],
        }
    slowest = {name: report.metrics[f"{ph}_{name}_slowest_s"] for name in RUNS}
    _bounds(report, ph, n, dataset, mbit, slowest)
    _simulated(report, ph, n, dataset, mbit, slowest)
    report.ratios[f"{ph}_origin_egress"] = runs["peers"][1] / dataset
    report.ratios[f"{ph}_origin_egress_no_peers"] = runs["no_peers"][1] / dataset
    report.goals[f"{ph}_origin_egress"] = "goal <= 1.25"
    report.goals[f"{ph}_origin_egress_no_peers"] = f"about {n}"


def _summed(counters: list[dict[str, float]]) -> dict[str, float]:
    """Counters of several readers, summed."""
    return {key: sum(c.get(key, 0) for c in counters) for key in sorted({k for c in counters for k in c})}


def _peer_stats(reads: list[Read]) -> dict[str, float]:
    """The readers' peer-tier counters summed; their latency quantiles (``*_ms``) the median reader's."""
    keys = {key for r in reads for key, value in r.peer.items() if isinstance(value, int | float)}
    stats = {}
    for key in sorted(keys):
        values = [float(r.peer.get(key, 0)) for r in reads]
        stats[key] = median(values) if key.endswith("_ms") else sum(values)
    return stats


def _received(devices: list[str]) -> int:
    """Bytes the bridge side of these veths received: what their hosts sent, frames whole."""
    return sum(int(Path(f"/sys/class/net/{dev}/statistics/rx_bytes").read_text()) for dev in devices)


def _dropped(hosts: list[Host]) -> int:
    """Packets the tbf queues of these hosts' links dropped (both directions), so far."""
    total = 0
    for h in hosts:
        for argv in (
            [netns.TC, "-n", h.namespace, "-s", "qdisc", "show", "dev", h.inner],
            [netns.TC, "-s", "qdisc", "show", "dev", h.outer],
        ):
            total += sum(int(n) for n in _DROPPED.findall(netns.run(argv)))
    return total


def _bounds(report: Report, ph: str, n: int, dataset: int, mbit: float, slowest: dict[str, float]) -> None:
    link = mbit * 1e6 / 8 * GOODPUT  # the origin's uplink in total is the same
    m = report.metrics
    m[f"{ph}_tree_ideal_s"] = tree = tree_ideal_s(n, dataset, REAL_CHUNK, link, link, TrackerConfig().fanout)
    m[f"{ph}_no_peers_floor_s"] = no_peers = no_peers_floor_s(n, dataset, link, link)
    m[f"{ph}_link_floor_s"] = link_floor_s(n, dataset, link, link)
    cpu = m[f"{ph}_peers_readers_cpu_floor_s"]
    report.ratios[f"{ph}_peers_vs_no_peers"] = slowest["peers"] / slowest["no_peers"]
    report.ratios[f"{ph}_peers_vs_tree_ideal"] = slowest["peers"] / tree
    report.ratios[f"{ph}_no_peers_vs_floor"] = slowest["no_peers"] / no_peers
    report.ratios[f"{ph}_slowest_vs_single"] = slowest["peers"] / slowest["single"]
    report.ratios[f"{ph}_cpu_floor_vs_tree_ideal"] = cpu / tree
    report.goals[f"{ph}_cpu_floor_vs_tree_ideal"] = "> 1: the cores, not the links, bound it"
    report.details.setdefault("bound", {})[ph] = "cpu" if cpu > tree else "links"


def cpu_Bps(hosts: int, dataset: int, readers_cpu_s: float, cores: int) -> float:
    """The bytes/s the machine's ``cores`` let ``hosts`` readers receive together, at the CPU
    per byte they spent in a run (``readers_cpu_s`` in all, ``dataset`` each): a lone reader
    uses one core at most."""
    return hosts * dataset / (readers_cpu_s / min(cores, hosts))


def _simulated(report: Report, ph: str, n: int, dataset: int, mbit: float, slowest: dict[str, float]) -> None:
    """swarm_sim at the same N and link rates: links only (``sim_*``), and with the readers'
    measured CPU as a pool every flow shares (``sim_cpu_*``: the goal's figure)."""
    link = mbit * 1e6 / 8 * GOODPUT
    cores = os.cpu_count() or 1
    shapes = {"single": (1, True), "peers": (n, True), "no_peers": (n, False)}
    for name, (hosts, peers) in shapes.items():
        readers_cpu_s = report.metrics[f"{ph}_{name}_readers_cpu_floor_s"] * cores
        pool = cpu_Bps(hosts, dataset, readers_cpu_s, cores)
        for sim_name, params in (
            ("sim", link_params(hosts, dataset, link, link, peers=peers)),
            ("sim_cpu", link_params(hosts, dataset, link, link, peers=peers, cpu_Bps=pool)),
        ):
            result = Swarm(params).run()
            report.metrics[f"{ph}_{sim_name}_{name}_slowest_s"] = sim = max(result.completion_s)
            report.ratios[f"{ph}_{sim_name}_vs_measured_{name}"] = sim / slowest[name]
            report.goals[f"{ph}_{sim_name}_vs_measured_{name}"] = "goal 0.8-1.2" if sim_name == "sim_cpu" else "links only"
            if name == "peers":
                report.metrics[f"{ph}_{sim_name}_origin_egress"] = result.origin_bytes / dataset
        report.metrics[f"{ph}_sim_cpu_{name}_pool_mb_s"] = pool / 1e6
