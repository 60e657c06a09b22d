"""tenancy: what signed read plans cost, and whether one tenant can slow another down.

One local cluster with a keyring (API server, 3 block servers, 1 L3 node, separate
processes), read by two clients in alternating rounds: the baseline bears the static admin
token (no grants are made or checked), the other a signed tenant token (the API signs every
chunk ref for it, and each block server and L3 node checks its token and the chunk's grant
on every GET).

- ``tenant_small_get_vs_admin``: rate of 64 KiB single-chunk gets, L1 off, plans cached (so
  the data path alone), 16 at a time: tenant / admin.  Goal >= 0.9.
- ``tenant_plan_batch_vs_admin``: getReadPlan of 100 one-chunk paths in one request: admin
  time / tenant time (the API signs 100 grants; the client decodes them).  Reported, no goal:
  a batch of tiny plans is the worst case, where the ~1 ms the API spends on 100 plans gets
  100 HMACs (~1 us each with the key schedule precomputed) plus their formatting and ~45
  more bytes per ref on the wire.  What a reader pays is ``grant_us_per_chunk``: the
  difference per chunk, goal <= 5 us (a 4 MiB chunk takes >= 2 ms to read here).
- ``sign_grant_us``, ``verify_token_us``, ``verify_grant_us``: the HMAC work per chunk, in
  this process.

Then, in the same cluster, fairness between tenants (benchmarks/_tenancy_fair.py): a victim
tenant's p99 latency alone and while another tenant floods the L3 node with hits
(``l3_hits_*``) or bad-copy reports (``l3_reports_*``), or the API server with lookups of 1000
paths (``api_plans_*``); ``*_p99_vs_alone`` is the goal's ratio (<= 2), beside two floors this
machine sets, each measured in the same rounds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import timeit
from pathlib import Path

import msgspec

import blobsdk
from blobsdk.auth import Keyring, new_claims
from blobsdk.config import L1Config, ReadConfig
from blobsdk.metadata import HttpMetadataStore
from blobsdk.net import new_session
from servers.cluster import start_cluster

from ._report import Report, median
from ._tenancy_fair import run_fairness

SMALL = 64 << 10
PARALLEL = 16


async def run(quick: bool = False) -> Report:
    report = Report("tenancy")
    blobs, rounds = (300, 5) if quick else (600, 7)
    keyring = Keyring.generate()
    _hmac_costs(report, keyring)
    with tempfile.TemporaryDirectory(prefix="bench-tenancy-") as tmp:
        keys = Path(tmp) / "keys.toml"
        keys.write_text(keyring.to_toml())
        async with start_cluster(Path(tmp) / "cluster", block_servers=3, l3_nodes=1, keys=keys, trackers=0) as cluster:
            tenant_token = keyring.sign_token(new_claims("bench", ("bench",), 3600))
            admin = _config(cluster.config, cluster.config.token)
            tenant = _config(cluster.config, tenant_token)
            paths = [f"/bench/small/{i:05d}" for i in range(blobs)]
            async with blobsdk.Client(admin) as c:
                await c.put_many((p, os.urandom(SMALL)) for p in paths)
            await _small_gets(report, admin, tenant, paths, rounds)
            await _plan_batches(report, admin, tenant, paths[:100], 30 if quick else 100)
            await run_fairness(report, cluster, keyring, keys, Path(tmp), quick)
    report.goals.update(tenant_small_get_vs_admin=">= 0.9", grant_us_per_chunk="<= 5")
    return report


def _config(base: blobsdk.ClientConfig, token: str | None) -> blobsdk.ClientConfig:
    read = ReadConfig(plan_cache_ttl_seconds=3600)
    return msgspec.structs.replace(base, token=token, l1=L1Config(capacity_bytes=0), read=read)


def _hmac_costs(report: Report, keyring: Keyring) -> None:
    now, n = time.time(), 20_000
    token = keyring.sign_token(new_claims("bench", ("bench",), 3600))
    grant = keyring.sign_grant("bench", "0" * 32, 0, SMALL, int(now) + 900)
    costs = {
        "sign_grant_us": lambda: keyring.sign_grant("bench", "0" * 32, 0, SMALL, int(now) + 900),
        "verify_token_us": lambda: keyring.verify_token(token, now),
        "verify_grant_us": lambda: keyring.verify_grant(grant, "bench", "0" * 32, 0, SMALL, now),
    }
    for name, call in costs.items():
        report.metrics[name] = timeit.timeit(call, number=n) / n * 1e6


async def _small_gets(
    report: Report, admin: blobsdk.ClientConfig, tenant: blobsdk.ClientConfig, paths: list[str], rounds: int
) -> None:
    """Alternate whole passes of both clients (plans cached and connections warm after
    the first pass of each) and compare their median rates."""
    rates: dict[str, list[float]] = {"admin": [], "tenant": []}
    async with blobsdk.Client(admin) as a, blobsdk.Client(tenant) as t:
        for client in (a, t):
            await _read_all(client, paths)  # warm-up: plans, connections, the L3 node's cache
        for _ in range(rounds):
            for name, client in (("admin", a), ("tenant", t)):
                start = time.perf_counter()
                await _read_all(client, paths)
                rates[name].append(len(paths) / (time.perf_counter() - start))
        report.metrics["tenant_l4_hits"] = t.stats()["l4"]["hits"]
    for name, values in rates.items():
        report.metrics[f"{name}_small_gets_per_s"] = median(values)
    report.ratios["tenant_small_get_vs_admin"] = median(rates["tenant"]) / median(rates["admin"])


async def _read_all(client: blobsdk.Client, paths: list[str]) -> None:
    slots = asyncio.Semaphore(PARALLEL)

    async def one(path: str) -> None:
        async with slots:
            data = await client.get(path)
            assert len(data) == SMALL

    await asyncio.gather(*(one(p) for p in paths))


async def _plan_batches(
    report: Report, admin: blobsdk.ClientConfig, tenant: blobsdk.ClientConfig, paths: list[str], samples: int
) -> None:
    times: dict[str, list[float]] = {"admin": [], "tenant": []}
    async with new_session(admin.timeouts) as session:
        stores = {
            name: HttpMetadataStore(session, admin.api_url or "", cfg.token)
            for name, cfg in (("admin", admin), ("tenant", tenant))
        }
        for _ in range(5):
            for store in stores.values():
                await store.get_plans(paths)
        for _ in range(samples):
            for name, store in stores.items():
                start = time.perf_counter()
                plans = await store.get_plans(paths)
                times[name].append(time.perf_counter() - start)
                assert all(p is not None and bool(p.grants_expire) == (name == "tenant") for p in plans)
    for name, values in times.items():
        report.metrics[f"{name}_plan_batch100_ms"] = median(values) * 1000
    report.ratios["tenant_plan_batch_vs_admin"] = median(times["admin"]) / median(times["tenant"])
    report.metrics["grant_us_per_chunk"] = (median(times["tenant"]) - median(times["admin"])) / len(paths) * 1e6
