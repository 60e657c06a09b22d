"""The hedging benchmark on a testbed of hosts (``python -m benchmarks hedging --hosts N``).

Each of the N block servers runs in a host of its own (servers/testbed.py): its own network
namespace, address and link to the testbed's bridge, every link ``FAST_MBIT`` each way.  The
client is this process, in the root namespace (the testbed's driver address, unshaped).  Two
scenarios, on the same servers, alternating round by round:

- ``fault_free``: every link fast;
- ``slow_replica``: ``block-0``'s link at ``SLOW_MBIT`` each way (:meth:`Testbed.set_link`),
  the others fast.  Its reads are slow on the wire: every response leaves through a token
  bucket at that rate and waits in its queue behind the responses sent before it.

No server sleeps to be slow: each has the same ``SEEK_MS`` of emulated seek (the disk, as in the
loopback benchmark's fault-free servers), so a read's time differs only by its link.

Why ``SLOW_MBIT`` = 10: a fast replica's 16 KiB read in a batch of 100, as the hedger measures
it (from entering service: the server's seek, the response, the client's turn to read it),
takes ~5 ms here: the client's CPU, not the 1 Gbit/s wire (0.13 ms).  At 10 Mbit/s the
response alone is 13 ms on the wire, plus a round trip through the bucket's queue for TCP's
second flight (an initial window of 10 segments is 14.5 KB), and the few reads a batch sends
there wait behind each other: its reads take 30-40 ms, ~7x a fast one's (``slow_host_read_x``;
the loopback benchmark's replicas are 10 ms and 1 ms).  At 20 Mbit/s it was ~3x; at 4 Mbit/s
~90x (reads of 450 ms: a replica that slow is one a client should stop reading, not hedge).

Rounds: each round runs every (scenario, policy) for its batches, fresh session and limiters
per scenario (as the loopback benchmark makes them per scenario), with warm-up batches first.
Metrics pool the batches of every round; each ratio is the median of the rounds' own ratios,
with ``_min`` and ``_max`` over the rounds (the machine's load changes between rounds, not
between the policies of one round).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from blobsdk.config import HedgeConfig, Timeouts
from blobsdk.net import new_session
from blobsdk.net.limiter import LimiterRegistry
from blobsdk.sources import HttpBlockStore, ReplicatedBlockStore
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef
from servers.testbed import Link, Testbed

from ._hedging_batches import time_batches, write_chunks
from ._report import Report, percentile
from ._servers import ROOT

FAST_MBIT = 1000.0
SLOW_MBIT = 10.0
QUEUE_MS = 500.0  # a tbf queue deep enough that a batch's responses wait rather than drop
SEEK_MS = 1.0
SLOW_HOST = "block-0"
SCENARIOS = ("fault_free", "slow_replica")
POLICY_NAMES = {"fault_free": ("none", "hedged"), "slow_replica": ("none", "duplicate", "hedged")}


@dataclass(frozen=True)
class Shape:
    """Rounds; batches of each scenario and policy per round; warm-up batches before them."""

    rounds: int
    batches: int
    warmup: int = 20


FULL = Shape(rounds=5, batches=200)
QUICK = Shape(rounds=2, batches=50)


async def run_on_hosts(hosts: int, policies: dict[str, HedgeConfig], shape: Shape) -> Report:
    """The report of ``shape`` on a testbed of ``hosts`` block-server hosts (at least 2)."""
    if hosts < 2:
        raise ValueError(f"hedging on hosts needs at least 2 block servers to hedge between, got {hosts}")
    report = Report("hedging")
    report.details.update(
        hosts=hosts, rounds=shape.rounds, batches=shape.batches, fast_mbit=FAST_MBIT, slow_mbit=SLOW_MBIT, seek_ms=SEEK_MS
    )
    times: dict[str, list[list[float]]] = {}
    reads: dict[str, list[float]] = {}
    counts: dict[str, dict[str, int]] = {}
    limits: dict[str, list[list[int]]] = {}
    cpu: dict[str, list[float]] = {}  # this process's CPU seconds per batch, one value per round
    with tempfile.TemporaryDirectory(prefix="bench-hedging-hosts-") as tmp:
        async with Testbed(dir=Path(tmp) / "testbed") as bed:
            urls = await asyncio.to_thread(_start_servers, bed, Path(tmp), hosts)
            refs = await _write(urls)
            for _ in range(shape.rounds):
                for scenario in SCENARIOS:
                    slow = SLOW_MBIT if scenario == "slow_replica" else FAST_MBIT
                    await asyncio.to_thread(bed.set_link, SLOW_HOST, up=slow, down=slow)
                    await _round(scenario, urls, refs, shape, policies, times, reads, counts, limits, cpu)
    _fill(report, times, reads, counts)
    _cpu(report, cpu)
    report.details.update({f"{name}_limits": values for name, values in limits.items()})
    return report


def _start_servers(bed: Testbed, tmp: Path, count: int) -> list[str]:
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    for i in range(count):
        host = bed.add_host(f"block-{i}", Link(up=FAST_MBIT, down=FAST_MBIT, queue_ms=QUEUE_MS))
        port_file = tmp / f"block-{i}.port"
        argv = [sys.executable, "-m", "servers.blockstore", "--dir", str(tmp / f"blocks-{i}"), "--host", host.address]
        argv += ["--port", "0", "--port-file", str(port_file), "--latency-ms", f"{SEEK_MS:g}", "--log-level", "WARNING"]
        log = open(tmp / f"block-{i}.log", "wb")  # noqa: SIM115 - the server's, closed with it by the testbed
        procs.append((bed.popen(host, argv, cwd=ROOT, stdout=log, stderr=log), port_file))
        log.close()
    urls = []
    deadline = time.monotonic() + 30
    for i, (proc, port_file) in enumerate(procs):
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"block server {i} did not start; see {tmp / f'block-{i}.log'}")
            time.sleep(0.02)
        urls.append(bed.host(f"block-{i}").url(int(port_file.read_text())))
    return urls


async def _write(urls: list[str]) -> list[ChunkRef]:
    async with new_session(Timeouts()) as session:
        limiters = LimiterRegistry()
        blocks = ReplicatedBlockStore([HttpBlockStore(session, u, limiter=limiters.get(u)) for u in urls], write_quorum="all")
        try:
            return await write_chunks(blocks)
        finally:
            await blocks.aclose()


async def _round(
    scenario: str,
    urls: list[str],
    refs: list[ChunkRef],
    shape: Shape,
    policies: dict[str, HedgeConfig],
    times: dict[str, list[list[float]]],
    reads: dict[str, list[float]],
    counts: dict[str, dict[str, int]],
    limits: dict[str, list[list[int]]],
    cpu: dict[str, list[float]],
) -> None:
    """One round of ``scenario``: each of its policies for ``batches`` batches, after warm-up."""
    async with new_session(Timeouts()) as session:
        limiters = LimiterRegistry()
        blocks = ReplicatedBlockStore([HttpBlockStore(session, u, limiter=limiters.get(u)) for u in urls])
        try:
            for policy in POLICY_NAMES[scenario]:
                # "duplicate" is the plain baseline: both copies at once, never waiting for room
                tier = L4Tier(ReplicaReader(blocks, hedge=policies[policy], limiters=None if policy == "duplicate" else limiters))
                await time_batches(tier, refs, shape.warmup)
                before = tier.hedger.stats()
                name = f"{scenario}_{policy}"
                begun = time.process_time()
                times.setdefault(name, []).append(await time_batches(tier, refs, shape.batches))
                cpu.setdefault(name, []).append((time.process_time() - begun) / shape.batches)
                after = tier.hedger.stats()
                total = counts.setdefault(name, {})
                for key, value in after.items():
                    total[key] = total.get(key, 0) + value - before.get(key, 0)
                if policy == "none":
                    _read_times(tier, urls, scenario, reads)
                limits.setdefault(name, []).append([limiters.get(u).limit for u in urls])
        finally:
            await blocks.aclose()


def _read_times(tier: L4Tier, urls: list[str], scenario: str, reads: dict[str, list[float]]) -> None:
    """The median read time the hedger measured (from entering service: the server and the
    wire, not the client's queue) of the slow host's replica and of the others', in ms."""
    typical = [tier.hedger.latency.typical(url, 60.0) for url in urls]
    slow, fast = typical[0], [t for t in typical[1:] if t is not None]
    if slow is not None:
        reads.setdefault(f"{scenario}_slow_host_read_ms", []).append(slow * 1000)
    if fast:
        reads.setdefault(f"{scenario}_fast_host_read_ms", []).append(statistics.median(fast) * 1000)


def _fill(
    report: Report, times: dict[str, list[list[float]]], reads: dict[str, list[float]], counts: dict[str, dict[str, int]]
) -> None:
    m, r = report.metrics, report.ratios
    for name, per_round in times.items():
        pooled = [t for one in per_round for t in one]
        for label, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
            m[f"{name}_{label}_ms"] = percentile(pooled, q) * 1000
        c = counts[name]
        m[f"{name}_extra"] = c["hedges_sent"] / max(c["primaries"], 1)
        m[f"{name}_hedges_won"] = c["hedges_won"]
        m[f"{name}_budget_exhausted"] = c["budget_exhausted"]
        m[f"{name}_hedges_deferred"] = c["hedges_deferred"]
    for name, values in reads.items():
        m[name] = statistics.median(values)
    ratios = {
        "slow_replica_p99_cut": ("slow_replica_none", 0.99, "slow_replica_hedged", 0.99),
        "slow_replica_vs_fault_free": ("slow_replica_hedged", 0.99, "fault_free_none", 0.99),
        "fault_free_p50_cost": ("fault_free_hedged", 0.5, "fault_free_none", 0.5),
        "duplicate_p99_cut": ("slow_replica_none", 0.99, "slow_replica_duplicate", 0.99),
        # the most any policy could cut: hedged reads are no faster than with no fault at all
        "slow_replica_cut_ceiling": ("slow_replica_none", 0.99, "fault_free_none", 0.99),
    }
    rounds = len(next(iter(times.values())))
    for key, (top, qt, bottom, qb) in ratios.items():
        values = [percentile(times[top][i], qt) / percentile(times[bottom][i], qb) for i in range(rounds)]
        r[key] = statistics.median(values)
        r[f"{key}_min"], r[f"{key}_max"] = min(values), max(values)
        report.details[f"{key}_rounds"] = values
    slow, fast = m.get("slow_replica_slow_host_read_ms"), m.get("slow_replica_fast_host_read_ms")
    if slow is not None and fast:
        r["slow_host_read_x"] = slow / fast
    report.goals.update(slow_replica_p99_cut=">= 2", fault_free_p50_cost="<= 1.1")


def _cpu(report: Report, cpu: dict[str, list[float]]) -> None:
    """The client's CPU per batch of each run (ms), and ``fault_free_cpu_cost``, hedged / none
    without faults, per round: where a batch is the client's CPU, as here, it is the floor of
    ``fault_free_p50_cost``."""
    for name, values in cpu.items():
        report.metrics[f"{name}_cpu_ms"] = statistics.median(values) * 1000
    values = [h / n for h, n in zip(cpu["fault_free_hedged"], cpu["fault_free_none"], strict=True)]
    report.ratios["fault_free_cpu_cost"] = statistics.median(values)
    report.ratios["fault_free_cpu_cost_min"], report.ratios["fault_free_cpu_cost_max"] = min(values), max(values)
    report.details["fault_free_cpu_cost_rounds"] = values
