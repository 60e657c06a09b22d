"""The l3 benchmark's job (benchmarks/l3.py): client hosts of a cluster on hosts read a
dataset's shards for a few epochs, each epoch's shards rotated one host on, and what each
epoch cost: the readers' reports, the origin bytes, the CPU every process spent, and the
floors on its time that the links, the L3 nodes' uplinks, the origin and the CPU set."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from blobsdk.config import ClientConfig
from servers.cluster import Cluster
from servers.clusterhosts import ClientHost
from servers.swarm import Read, ReaderJob, Readers, check_reads, origin_bytes

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Rates:
    """The links, in Mbit/s (None: unshaped)."""

    host: float  # each client host's, both ways
    origin: float  # the block servers' uplinks together
    l3: float | None  # each L3 node's uplink
    l3_nodes: int


@dataclass(frozen=True)
class Epoch:
    reads: list[Read]
    origin_bytes: int
    servers_cpu_s: float  # every server process of the cluster, meanwhile
    busy: float  # the machine's busy share of its cores meanwhile (other users' work included)

    @property
    def seconds(self) -> float:
        """The epoch's time: its slowest host's."""
        return max(r.seconds for r in self.reads)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.reads)

    @property
    def cpu_s(self) -> float:
        return sum(r.cpu_s for r in self.reads) + self.servers_cpu_s

    def share(self, tier: str) -> float:
        """The share of the chunks read that ``tier`` served."""
        chunks = sum(sum(r.hits.values()) for r in self.reads)
        return sum(r.hits[tier] for r in self.reads) / max(1, chunks)

    def floors(self, rates: Rates) -> dict[str, float]:
        """Seconds below which each resource could not have moved this epoch's bytes."""
        floors = {
            "link": max(r.bytes for r in self.reads) / _bytes_per_s(rates.host),
            "origin": self.origin_bytes / _bytes_per_s(rates.origin),
            "cpu": self.cpu_s / (os.cpu_count() or 1),
        }
        if rates.l3 is not None:
            floors["l3_uplink"] = self.bytes * self.share("l3") / (rates.l3_nodes * _bytes_per_s(rates.l3))
        return floors


def shards(paths: Sequence[str], count: int) -> list[list[str]]:
    """``paths`` dealt round-robin into ``count`` shards."""
    return [list(paths[i::count]) for i in range(count)]


async def run_job(
    cluster: Cluster,
    hosts: Sequence[ClientHost],
    digests: dict[str, str],
    config_of: Callable[[ClientHost], ClientConfig],
    epochs: int,
    dir: Path,
    whole: bool = False,
) -> list[Epoch]:
    """Each host reads one shard per epoch, all hosts together (host ``i``: shard ``i + e``
    in epoch ``e``, so no host reads in epoch 2 what its own caches kept from epoch 1); with
    ``whole``, every host reads every path.  RuntimeError if any reader got a wrong byte."""
    parts = [sorted(digests)] * len(hosts) if whole else shards(sorted(digests), len(hosts))
    done = []
    for e in range(epochs):
        jobs = [
            ReaderJob({p: digests[p] for p in parts[(i + e) % len(hosts)]}, config_of(host), host) for i, host in enumerate(hosts)
        ]
        done.append(await _epoch(cluster, jobs, dir / f"epoch-{e + 1}"))
    return done


async def _epoch(cluster: Cluster, jobs: list[ReaderJob], dir: Path) -> Epoch:
    assert cluster.config is not None
    async with Readers(jobs, dir) as readers:
        origin, cpu, stat = origin_bytes(cluster.config.block_urls), _servers_cpu_s(cluster), _machine_stat()
        reads = await readers.read()
        origin, cpu = origin_bytes(cluster.config.block_urls) - origin, _servers_cpu_s(cluster) - cpu
        busy = _busy_since(stat)
    return Epoch(reads=check_reads(reads), origin_bytes=origin, servers_cpu_s=cpu, busy=busy)


def _bytes_per_s(mbit: float) -> float:
    return mbit * 1e6 / 8


def _servers_cpu_s(cluster: Cluster) -> float:
    """CPU seconds (user and system) the cluster's server processes have spent so far."""
    total = 0
    for proc in cluster.processes:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a server that died; its restart's pid is read next time
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def _machine_stat() -> tuple[float, float]:
    """(busy, total) jiffies of every core so far (/proc/stat)."""
    values = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]  # guest time is in user already
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def _busy_since(before: tuple[float, float]) -> float:
    busy, total = _machine_stat()
    return (busy - before[0]) / max(1.0, total - before[1])
