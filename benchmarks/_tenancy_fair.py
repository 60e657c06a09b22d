"""The fairness half of ``python -m benchmarks tenancy``: one tenant floods, another's p99.

The tenancy cluster (API server, block servers, one L3 node: separate processes) holds two
tenants' data, each in its own bucket; a twin of the API server (the same database) and of
the L3 node (the same block servers, the flooder's chunks cached) run beside them.  The victim
sends requests at a fixed rate (an open loop: a slow answer does not slow the asking) from
this process; the flooder is another process (benchmarks/_tenancy_flood.py) that keeps
``connections`` requests in flight.  Each round measures the victim for ``seconds`` in four
phases, in an order turned every round:

- *alone*;
- *flood*: the flooder's ``connections`` at the victim's server;
- *single*: the flooder with one connection at the victim's server.  It keeps the server as
  busy, but only one of its requests is ever in the way: the best any sharing of requests can
  do for the victim on this machine;
- *floor*: the flooder's ``connections`` at the twin: its client and server take the same
  cores, but nothing the victim's server does for the flood is in the way.

Scenarios:

- ``l3_hits``: the victim reads its cached 4 MiB chunks from the L3 node (40 a second); the
  flooder reads its own, 32 connections;
- ``l3_reports``: the victim as above; the flooder reports its own cached chunks as bad
  copies (``POST /v1/chunks/{key}/bad``), 16 connections;
- ``api_plans``: the victim asks the API server for one path's plan (the SDK's ``stat``, 100
  a second); the flooder asks for 1000 paths' plans per request, 16 connections.

Figures per scenario ``S``, each the median over the rounds of a per-round ratio of p99s:
``S_p99_vs_alone`` (flood / alone; goal <= 2) with its quartiles ``_p25`` / ``_p75``;
``S_single_vs_alone`` and ``S_floor_vs_alone`` (the two floors, with theirs);
``S_p99_vs_single`` (what the flood's many connections add to one: ~1 when the flooder's
requests queue behind its own) and ``S_p99_vs_floor``.  Metrics: the victim's
``S_{alone,flood,single,floor}_p50_ms`` / ``_p99_ms`` (medians over the rounds), the
flooder's answers per second at the victim's server ``S_flood_per_s`` and the share of them
refused (429, ``S_flood_refused``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

import blobsdk
from blobsdk.auth import GRANT_HEADER, Keyring, new_claims
from blobsdk.config import WriteConfig
from blobsdk.metadata import HttpMetadataStore
from blobsdk.wire import MSGPACK, ChunkRef, GetPlansRequest, chunk_query
from servers.cluster import Cluster

from ._report import Report, percentile
from ._servers import server
from ._tenancy_flood import Flood, FloodRequest

CHUNK = 4 << 20
GOAL = "<= 2"
PHASES = ("alone", "flood", "single", "floor")


@dataclass
class Scenario:
    name: str
    floods: dict[str, Flood]  # phase ("flood", "single", "floor") -> the flood
    victim: Callable[[], Awaitable[None]]  # one request of the victim's
    per_s: float  # the victim's rate


@dataclass
class Rounds:
    """One scenario's rounds: the victim's latencies per phase, the flood's rates."""

    latencies: dict[str, list[list[float]]] = field(default_factory=lambda: {p: [] for p in PHASES})
    flood_rates: list[float] = field(default_factory=list)
    flood_refused: list[float] = field(default_factory=list)


@dataclass
class Tenants:
    """What each tenant may read, with its grants, and its token."""

    victim_token: str
    flood_token: str
    victim_refs: list[ChunkRef]
    flood_refs: list[ChunkRef]
    victim_paths: list[str]
    flood_paths: list[str]


@dataclass
class Servers:
    """The victim's servers and their twins."""

    api: str
    l3: str
    api_twin: str
    l3_twin: str


async def run_fairness(report: Report, cluster: Cluster, keyring: Keyring, keys: Path, tmp: Path, quick: bool) -> None:
    rounds, seconds = (3, 3.0) if quick else (7, 5.0)
    tenants = await _prepare(cluster, keyring)
    with ExitStack() as stack:
        servers = _twins(stack, cluster, keys, tmp)
        async with aiohttp.ClientSession() as session:
            for url in (servers.l3, servers.l3_twin):
                await _warm(session, url, tenants)
            for scenario in _scenarios(session, servers, tenants):
                _record(report, scenario.name, await _rounds(scenario, rounds, seconds, tmp))
    report.details["fairness"] = {"rounds": rounds, "seconds": seconds}


def _twins(stack: ExitStack, cluster: Cluster, keys: Path, tmp: Path) -> Servers:
    """The twin API server (the cluster's database) and L3 node (its block servers)."""
    config = cluster.config
    assert config.api_url is not None and config.token is not None
    auth = ["--keys", str(keys), "--token", config.token]
    blocks = [a for url in config.block_urls for a in ("--block-url", url)]
    api_twin = stack.enter_context(server("servers.api", ["--db", str(cluster.dir / "meta.sqlite"), *auth], tmp / "twins"))
    l3_twin = stack.enter_context(server("servers.flash", ["--dir", str(tmp / "l3-twin"), *blocks, *auth], tmp / "twins"))
    return Servers(config.api_url, config.l3_urls[0], api_twin, l3_twin)


def _scenarios(session: aiohttp.ClientSession, s: Servers, t: Tenants) -> list[Scenario]:
    hits = _victim_hits(session, s.l3, t)
    store = HttpMetadataStore(session, s.api, t.victim_token)
    paths = itertools.cycle(t.victim_paths)

    async def stat() -> None:
        await store.get_plan(next(paths))

    gets = [_chunk_request("GET", ref, t.flood_token) for ref in t.flood_refs]
    reports = [_chunk_request("POST", ref, t.flood_token, "/bad") for ref in t.flood_refs]
    body = msgspec.msgpack.encode(GetPlansRequest(paths=t.flood_paths))
    plans = [FloodRequest("POST", "/v1/plans", {"Authorization": f"Bearer {t.flood_token}", "Content-Type": MSGPACK}, body)]
    return [
        Scenario("l3_hits", _floods(s.l3, s.l3_twin, gets, 32), hits, 40),
        Scenario("l3_reports", _floods(s.l3, s.l3_twin, reports, 16), hits, 40),
        Scenario("api_plans", _floods(s.api, s.api_twin, plans, 16), stat, 100),
    ]


def _floods(url: str, twin: str, requests: list[FloodRequest], connections: int) -> dict[str, Flood]:
    return {
        "flood": Flood(url, requests, connections),
        "single": Flood(url, requests, 1),
        "floor": Flood(twin, requests, connections),
    }


def _chunk_request(method: str, ref: ChunkRef, token: str, suffix: str = "") -> FloodRequest:
    headers = {"Authorization": f"Bearer {token}", GRANT_HEADER: ref.grant or ""}
    return FloodRequest(method, f"/v1/chunks/{ref.key}{suffix}?{chunk_query(ref)}", headers)


def _victim_hits(session: aiohttp.ClientSession, l3_url: str, t: Tenants) -> Callable[[], Awaitable[None]]:
    refs = itertools.cycle(t.victim_refs)

    async def hit() -> None:
        ref = next(refs)
        headers = {"Authorization": f"Bearer {t.victim_token}", GRANT_HEADER: ref.grant or ""}
        async with session.get(f"{l3_url}/v1/chunks/{ref.key}?{chunk_query(ref)}", headers=headers) as resp:
            body = await resp.read()
            assert resp.status == 200 and len(body) == ref.length, resp.status

    return hit


async def _prepare(cluster: Cluster, keyring: Keyring) -> Tenants:
    """Each tenant's data (the victim: 8 chunks and 100 small blobs; the flooder: 16 chunks
    and 1000 small blobs) and plans with its grants."""
    admin = msgspec.structs.replace(cluster.config, write=WriteConfig(chunk_size=CHUNK))
    tokens = {name: keyring.sign_token(new_claims(name, (name,), 3600)) for name in ("victim", "flood")}
    sizes = {"victim": (8, 100), "flood": (16, 1000)}
    async with blobsdk.Client(admin) as client:
        for name, (big, small) in sizes.items():
            await client.put_many((f"/{name}/big/{i:03d}", os.urandom(CHUNK)) for i in range(big))
            await client.put_many((f"/{name}/small/{i:04d}", os.urandom(64)) for i in range(small))
    refs = {}
    async with aiohttp.ClientSession() as session:
        for name, (big, _) in sizes.items():
            store = HttpMetadataStore(session, cluster.config.api_url or "", tokens[name])
            plans = await store.get_plans([f"/{name}/big/{i:03d}" for i in range(big)])
            refs[name] = [chunk for plan in plans if plan is not None for chunk in plan.chunks]
    victim_paths, flood_paths = ([f"/{name}/small/{i:04d}" for i in range(sizes[name][1])] for name in ("victim", "flood"))
    return Tenants(tokens["victim"], tokens["flood"], refs["victim"], refs["flood"], victim_paths, flood_paths)


async def _warm(session: aiohttp.ClientSession, l3_url: str, t: Tenants) -> None:
    """Every chunk read twice from the node: filled, then verified (later hits are zero-copy)."""
    for token, refs in ((t.victim_token, t.victim_refs), (t.flood_token, t.flood_refs)):
        for ref in refs * 2:
            headers = {"Authorization": f"Bearer {token}", GRANT_HEADER: ref.grant or ""}
            async with session.get(f"{l3_url}/v1/chunks/{ref.key}?{chunk_query(ref)}", headers=headers) as resp:
                assert resp.status == 200, await resp.read()
                await resp.read()


def _orders() -> Iterator[tuple[str, ...]]:
    """The phases' order in each round: every rotation, forwards then backwards."""
    rotations = [PHASES[i:] + PHASES[:i] for i in range(len(PHASES))]
    return itertools.cycle(rotations + [tuple(reversed(r)) for r in rotations])


async def _rounds(scenario: Scenario, rounds: int, seconds: float, tmp: Path) -> Rounds:
    result = Rounds()
    specs = {}
    for phase, flood in scenario.floods.items():
        specs[phase] = tmp / f"flood-{scenario.name}-{phase}.msgpack"
        specs[phase].write_bytes(msgspec.msgpack.encode(flood))
    await _victim(scenario, 1.0)  # warm: connections, plans
    for _, order in zip(range(rounds), _orders(), strict=False):
        for phase in order:
            if phase == "alone":
                result.latencies[phase].append(await _victim(scenario, seconds))
            else:
                await _flooded(scenario, phase, seconds, specs[phase], result)
    return result


async def _flooded(scenario: Scenario, phase: str, seconds: float, spec: Path, result: Rounds) -> None:
    command = [sys.executable, "-m", "benchmarks._tenancy_flood", str(spec)]
    proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        if (await proc.stdout.readline()).strip() != b"flooding":
            raise RuntimeError(f"the flood of {scenario.name} did not start")
        result.latencies[phase].append(await _victim(scenario, seconds))
    finally:
        proc.terminate()
        out, _ = await proc.communicate()
    if phase == "flood":
        done = msgspec.json.decode(out.splitlines()[-1])
        result.flood_rates.append(done["requests"] / done["seconds"])
        result.flood_refused.append(done["statuses"].get("429", 0) / max(1, done["requests"]))


async def _victim(scenario: Scenario, seconds: float) -> list[float]:
    """The latency of each of the victim's requests, sent every 1 / per_s seconds."""
    latencies: list[float] = []

    async def one() -> None:
        begun = time.perf_counter()
        await scenario.victim()
        latencies.append(time.perf_counter() - begun)

    tasks = []
    start = time.perf_counter()
    for n in range(int(seconds * scenario.per_s)):
        await asyncio.sleep(max(0.0, start + n / scenario.per_s - time.perf_counter()))
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return latencies


def _record(report: Report, name: str, rounds: Rounds) -> None:
    p50 = {phase: [percentile(r, 0.5) for r in runs] for phase, runs in rounds.latencies.items()}
    p99 = {phase: [percentile(r, 0.99) for r in runs] for phase, runs in rounds.latencies.items()}
    for phase in ("flood", "single", "floor"):
        ratios = [f / a for f, a in zip(p99[phase], p99["alone"], strict=True)]
        key = f"{name}_p99_vs_alone" if phase == "flood" else f"{name}_{phase}_vs_alone"
        q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        report.ratios[key] = median
        report.ratios[f"{key}_p25"] = q1
        report.ratios[f"{key}_p75"] = q3
        report.details.setdefault("rounds", {}).setdefault(name, {})[key] = [round(r, 3) for r in ratios]
    report.goals[f"{name}_p99_vs_alone"] = GOAL
    for base in ("single", "floor"):
        ratios = [f / b for f, b in zip(p99["flood"], p99[base], strict=True)]
        report.ratios[f"{name}_p99_vs_{base}"] = statistics.median(ratios)
        report.details["rounds"][name][f"{name}_p99_vs_{base}"] = [round(r, 3) for r in ratios]
    for phase in PHASES:
        report.metrics[f"{name}_{phase}_p50_ms"] = statistics.median(p50[phase]) * 1000
        report.metrics[f"{name}_{phase}_p99_ms"] = statistics.median(p99[phase]) * 1000
        report.details["rounds"][name][f"{phase}_p99_ms"] = [round(x * 1000, 2) for x in p99[phase]]
    report.metrics[f"{name}_flood_per_s"] = statistics.median(rounds.flood_rates)
    report.metrics[f"{name}_flood_refused"] = statistics.median(rounds.flood_refused)
    report.details["rounds"][name]["flood_per_s"] = [round(x) for x in rounds.flood_rates]
