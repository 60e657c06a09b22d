"""hedging: tail latency of batched chunk reads with and without hedged requests.

Three L4 block servers (separate processes) hold the same chunks.  A batch is 100 chunk
reads in parallel, as a training step fetching its samples; its latency is that of its
slowest read.  Three scenarios, each run with the policies in the same process run:

- ``tail``: every server gives 1% of requests +200 ms (the Tail-at-Scale setting);
- ``slow_replica``: one replica is 10x slower than the others;
- ``fault_free``: no fault (``none`` and ``hedged`` only): the floor no policy can beat,
  and what hedging costs when nothing is wrong.

Policies: ``none`` (plain failover, no hedging), ``duplicate`` (every read sent to two
replicas at once), ``hedged`` (blobsdk's default: hedge after the target's ~p95, within a
5% budget).  Reported per scenario and policy: batch p50/p99/p99.9 and extra requests.

Ratios (the ``tail`` scenario): ``p999_cut`` = no-hedge p99.9 / hedged p99.9 (goal >= 10;
the published anchor is 24x for 2% extra requests), ``tail_p99_cut`` the same at p99 (goal
>= 4) and ``extra_requests`` = hedges sent per read when hedged (goal <= 0.05).
``p999_vs_fault_free`` = hedged tail p99.9 / fault-free p99.9 (1.0: hedging removed the whole
injected tail): on a 2-core machine a batch of 100 HTTP reads is CPU-bound at tens of ms,
which bounds ``p999_cut`` far below 10 whatever the policy (see docs/benchmarks.md, "hedging").
``slow_replica_p99_cut`` = no-hedge / hedged p99 with one slow replica (goal >= 2; below 1,
hedging hurts) and ``slow_replica_vs_fault_free`` = hedged slow-replica p99 / fault-free
no-hedge p99, its floor (1.0: nothing of the slow replica is left); ``fault_free_p50_cost`` =
hedged / no-hedge p50 without faults (goal <= 1.1).

Client CPU per 16 KiB L4 read (``client_cpu_*_us``, the fault-free servers): this process's
``time.process_time()`` per read, the servers' CPU excluded (other processes), for the tier
with each policy and, interleaved in the same rounds, two floors: ``http_get`` (a bare
aiohttp GET of the same bytes from one of the same servers) and ``raw_get`` (the SDK's own
data-path GET, ``blobsdk/net/rawget.py``, with no tier, limiter or hedger around it).
``client_cpu_per_read_us`` = the hedged tier's (goal <= 100); ``client_cpu_vs_http_get`` =
that / the bare aiohttp GET's.  ``client_cpu_inproc_*_us``: the same tier with in-process
replicas and no network (``bare``: a replica's limiter and one loop turn alone; see
benchmarks/_hedging_inproc.py): the SDK's own CPU per read, steadier than the rows above.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import aiohttp

from blobsdk.config import HedgeConfig, Timeouts
from blobsdk.net import new_session
from blobsdk.net.limiter import LimiterRegistry
from blobsdk.net.rawget import RawGetEndpoint
from blobsdk.sources import HttpBlockStore, ReplicatedBlockStore
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef

from ._hedging_batches import decode, time_batches, write_chunks
from ._hedging_inproc import client_cpu_in_process
from ._report import Report, percentile
from ._servers import block_servers

SCENARIOS = {
    "tail": [["--latency-ms", "1", "--fault", "methods=GET;route=/v1/blocks;slow_fraction=1%;slow_ms=200"]] * 3,
    "slow_replica": [["--latency-ms", "10"], ["--latency-ms", "1"], ["--latency-ms", "1"]],
    "fault_free": [["--latency-ms", "1"]] * 3,
}
SKIP = {("fault_free", "duplicate")}
CPU_ROUNDS = 3  # rounds of the client-CPU rows, each path once per round
POLICIES = {
    "none": HedgeConfig(enabled=False),
    "duplicate": HedgeConfig(min_delay_ms=0, max_delay_ms=0, budget_ratio=1.0, budget_burst=1e9),
    "hedged": HedgeConfig(max_parallel=3),
}


def options(args: argparse.Namespace) -> dict[str, object]:
    """``--hosts N``: run on a testbed of N block-server hosts (benchmarks/_hedging_hosts.py)."""
    if args.hosts is not None and args.hosts < 2:
        raise SystemExit(f"python -m benchmarks: error: hedging --hosts needs at least 2 block servers, got {args.hosts}")
    return {} if args.hosts is None else {"hosts": args.hosts}


async def run(quick: bool = False, hosts: int | None = None) -> Report:
    if hosts is not None:
        from ._hedging_hosts import FULL, QUICK, run_on_hosts  # only with --hosts

        return await run_on_hosts(hosts, POLICIES, QUICK if quick else FULL)
    batches = 200 if quick else 1000
    report = Report("hedging")
    with tempfile.TemporaryDirectory(prefix="bench-hedging-") as tmp:
        for scenario, flags in SCENARIOS.items():
            with block_servers(Path(tmp) / scenario, flags) as urls:
                await _scenario(report, scenario, urls, batches)
    for name, values in (await client_cpu_in_process(POLICIES, 20 if quick else 100)).items():
        report.metrics[f"client_cpu_inproc_{name}_us"] = statistics.median(values)
        report.details[f"client_cpu_inproc_{name}_us_rounds"] = values
    m = report.metrics
    report.ratios["p999_cut"] = m["tail_none_p999_ms"] / m["tail_hedged_p999_ms"]
    report.ratios["tail_p99_cut"] = m["tail_none_p99_ms"] / m["tail_hedged_p99_ms"]
    report.ratios["extra_requests"] = m["tail_hedged_extra"]
    report.ratios["slow_replica_p99_cut"] = m["slow_replica_none_p99_ms"] / m["slow_replica_hedged_p99_ms"]
    report.ratios["slow_replica_vs_fault_free"] = m["slow_replica_hedged_p99_ms"] / m["fault_free_none_p99_ms"]
    report.ratios["p999_vs_fault_free"] = m["tail_hedged_p999_ms"] / m["fault_free_none_p999_ms"]
    report.ratios["fault_free_p50_cost"] = m["fault_free_hedged_p50_ms"] / m["fault_free_none_p50_ms"]
    report.ratios["client_cpu_per_read_us"] = m["client_cpu_hedged_us"]
    report.ratios["client_cpu_vs_http_get"] = m["client_cpu_hedged_us"] / m["client_cpu_http_get_us"]
    report.goals.update(
        p999_cut=">= 10",
        tail_p99_cut=">= 4",
        extra_requests="<= 0.05",
        slow_replica_p99_cut=">= 2",
        fault_free_p50_cost="<= 1.1",
        client_cpu_per_read_us="<= 100",
    )
    return report


async def _scenario(report: Report, scenario: str, urls: list[str], batches: int) -> None:
    async with new_session(Timeouts()) as session:
        limiters = LimiterRegistry()
        replicas = [HttpBlockStore(session, url, limiter=limiters.get(url)) for url in urls]
        blocks = ReplicatedBlockStore(replicas, write_quorum="all")  # every replica holds every chunk before the reads
        try:
            refs = await write_chunks(blocks)
            for policy, config in POLICIES.items():
                if (scenario, policy) in SKIP:
                    continue
                # "duplicate" is the plain baseline: both copies at once, never waiting for room
                gate = None if policy == "duplicate" else limiters
                tier = L4Tier(ReplicaReader(blocks, hedge=config, limiters=gate))
                await time_batches(tier, refs, 20)  # warm connections and latency estimates
                before = tier.hedger.stats()
                times = await time_batches(tier, refs, batches)
                after = tier.hedger.stats()
                _record(report, f"{scenario}_{policy}", times, before, after)
            if scenario == "fault_free":
                await _client_cpu(report, blocks, limiters, session, urls[0], refs, max(5, batches // 10))
        finally:
            await blocks.aclose()


async def _client_cpu(
    report: Report,
    blocks: ReplicatedBlockStore,
    limiters: LimiterRegistry,
    session: aiohttp.ClientSession,
    url: str,
    refs: list[ChunkRef],
    batches: int,
) -> None:
    """Client CPU per read of each path, the paths interleaved round by round (the machine's
    load changes between rounds, not between paths); the median round of each."""
    tiers = {policy: L4Tier(ReplicaReader(blocks, hedge=POLICIES[policy], limiters=limiters)) for policy in ("none", "hedged")}
    raw = RawGetEndpoint(url, timeout=session.timeout)
    async with aiohttp.ClientSession(timeout=session.timeout) as plain:

        async def http_get(ref: ChunkRef) -> None:
            async with plain.get(f"{url}/v1/blocks/{ref.block_id}", headers=_range(ref)) as response:
                assert response.status == 206 and len(await response.read()) == ref.length

        async def raw_get(ref: ChunkRef) -> None:
            await raw.get_into(f"/v1/blocks/{ref.block_id}", memoryview(bytearray(ref.length)), expect=206, headers=_range(ref))

        paths: dict[str, Callable[[ChunkRef], Awaitable[object]]] = {"http_get": http_get, "raw_get": raw_get}
        paths.update({policy: partial(tier.fetch, decode=decode) for policy, tier in tiers.items()})
        rounds: dict[str, list[float]] = {name: [] for name in paths}
        try:
            for read in paths.values():  # warm connections and estimates
                await _each(read, refs, 5)
            for _ in range(CPU_ROUNDS):
                for name, read in paths.items():
                    begun = time.process_time()
                    await _each(read, refs, batches)
                    rounds[name].append((time.process_time() - begun) / (batches * len(refs)) * 1e6)
        finally:
            await raw.aclose()
    for name, values in rounds.items():
        report.metrics[f"client_cpu_{name}_us"] = statistics.median(values)
        report.details[f"client_cpu_{name}_us_rounds"] = values


async def _each(read: Callable[[ChunkRef], Awaitable[object]], refs: list[ChunkRef], batches: int) -> None:
    for _ in range(batches):
        await asyncio.gather(*(read(ref) for ref in refs))


def _range(ref: ChunkRef) -> dict[str, str]:
    return {"Range": f"bytes={ref.offset}-{ref.offset + ref.length - 1}"}


def _record(report: Report, name: str, times: list[float], before: dict[str, int], after: dict[str, int]) -> None:
    reads = after["primaries"] - before["primaries"]
    hedges = after["hedges_sent"] - before["hedges_sent"]
    for label, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
        report.metrics[f"{name}_{label}_ms"] = percentile(times, q) * 1000
    report.metrics[f"{name}_extra"] = hedges / max(reads, 1)
    report.metrics[f"{name}_budget_exhausted"] = after["budget_exhausted"] - before["budget_exhausted"]
    report.metrics[f"{name}_hedges_won"] = after["hedges_won"] - before["hedges_won"]
    report.metrics[f"{name}_hedges_deferred"] = after["hedges_deferred"] - before["hedges_deferred"]
