"""Every server's /metrics (servers/_common/metrics.py), the client's collector
(blobsdk/metrics.py) and the Grafana dashboard over them (deploy/grafana/blobsdk.json)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import blobsdk
from blobsdk.metrics import ClientCollector
from blobsdk.sources.base import new_block_id
from servers import blockstore
from servers._common.metrics import LATENCY_BUCKETS, ServerMetrics, by_label, sample_sum, sample_values
from servers.cluster import Cluster, start_cluster
from tests.helpers import ROOT, running_app

DASHBOARD = ROOT / "deploy" / "grafana" / "blobsdk.json"
BLOCK_ROUTE = "/v1/blocks/{block_id}"

# Families every server of a kind exports (names as the parser gives them: counters without _total).
REQUEST_FAMILIES = {
    "requests": "counter",
    "request_seconds": "histogram",
    "response_bytes": "counter",
    "requests_in_flight": "gauge",
}
FAMILIES = {
    "api": {},
    "blockstore": {
        "queued_requests": "gauge",
        "in_service_requests": "gauge",
        "bandwidth_bytes": "counter",  # (with --fault, faults_injected and faults_stalled_now too: test_faults.py)
    },
    "flash": {
        "cache_bytes": "gauge",
        "cache_entries": "gauge",
        "cache_capacity_bytes": "gauge",
        "cache_evictions": "counter",
        "cache_corrupt": "counter",
        "chunk_hits": "counter",
        "chunk_misses": "counter",
        "chunk_fills": "counter",
        "chunk_fills_refused": "counter",
        "chunk_quota_rejections": "counter",
        "chunk_puts": "counter",
        "reports_rechecked": "counter",
        "reports_absorbed": "counter",
        "reports_refused": "counter",
        "l4_corrupt_copies": "counter",
        "l4_errors": "counter",
        "l4_primaries": "counter",
        "l4_hedges_sent": "counter",
        "l4_hedges_won": "counter",
        "l4_budget_exhausted": "counter",
        "l4_failovers": "counter",
        "l4_hedges_deferred": "counter",
        "l4_hung_failovers": "counter",
        "l4_probes": "counter",
        "l4_targets_hung": "gauge",
        "l4_replicas_demoted": "gauge",
        "hydrate_jobs_running": "gauge",
    },
    "tracker": {"peers": "gauge", "swarms": "gauge", "events": "counter"},
}
KIND_PREFIX = {"api": "api", "block": "blockstore", "l3": "flash", "tracker": "tracker"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One of each server, and a blob written and read back by two clients (so the L3 node
    has a miss, the tracker a peer, every server some requests)."""
    with start_cluster(tmp_path_factory.mktemp("metrics"), block_servers=1, l3_nodes=1, trackers=1) as c:
        yield c


@pytest.fixture(scope="module")
def observed(cluster: Cluster) -> tuple[str, dict[str, str]]:
    """After a write and two reads of a blob: the client collector's text, and each server
    kind's /metrics text."""
    return asyncio.run(_observe(cluster))


async def _observe(cluster: Cluster) -> tuple[str, dict[str, str]]:
    assert cluster.config is not None
    data = os.urandom(1 << 20)  # incompressible: 1 MiB reaches the block server
    async with blobsdk.Client(cluster.config) as writer:
        await writer.put("/bkt/metrics", data)
    async with blobsdk.Client(cluster.config) as client:
        assert bytes(await client.get("/bkt/metrics")) == data
        assert bytes(await client.get("/bkt/metrics")) == data  # from L1
        registry = CollectorRegistry()
        registry.register(ClientCollector(client))
        text = generate_latest(registry).decode()
        scraped = {}
        async with aiohttp.ClientSession() as session:
            for p in cluster.processes:
                async with session.get(f"{p.url}/metrics") as resp:
                    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                    scraped[KIND_PREFIX[p.kind]] = await resp.text()
    return text, scraped


@pytest.fixture
def client_text(observed: tuple[str, dict[str, str]]) -> str:
    return observed[0]


@pytest.fixture
def scraped(observed: tuple[str, dict[str, str]]) -> dict[str, str]:
    return observed[1]


# --- the servers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("server", list(FAMILIES))
async def test_each_server_exports_typed_documented_families(client_text: str, scraped: dict[str, str], server: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(scraped[server])}
    prefix = f"blobsdk_{server}_"
    expected = {**REQUEST_FAMILIES, **FAMILIES[server]}
    created = {f"{prefix}{name}_created" for name, kind in expected.items() if kind != "gauge"}
    assert {name.removeprefix(prefix): f.type for name, f in families.items() if name not in created} == expected
    for family in families.values():
        assert family.documentation and family.documentation != family.name, family.name
    assert "499 means the client went away" in families[f"{prefix}requests"].documentation
    for s in families[f"{prefix}requests"].samples:
        if s.name.endswith("_total"):
            route = s.labels["route"]
            assert set(s.labels) == {"route", "status"} and (route.startswith("/") or route == "unmatched")
            assert not re.search(r"[0-9a-f]{32}", route), s  # a canonical route, never a block id
    histogram = families[f"{prefix}request_seconds"]
    les = {s.labels["le"] for s in histogram.samples if s.name.endswith("_bucket")}
    assert les == {*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf"}
    assert {frozenset(s.labels) for s in histogram.samples if not s.name.endswith("_bucket")} == {frozenset({"route", "status"})}
    assert sample_sum(scraped[server], f"{prefix}requests_total", route="/healthz", status="200") >= 1


async def test_the_servers_count_what_the_clients_did(client_text: str, scraped: dict[str, str]) -> None:
    flash, tracker = scraped["flash"], scraped["tracker"]
    assert sample_sum(flash, "blobsdk_flash_chunk_hits_total") + sample_sum(flash, "blobsdk_flash_chunk_misses_total") >= 1
    assert sample_sum(flash, "blobsdk_flash_cache_capacity_bytes") == 1024 << 20  # the cluster's default 1024 MiB
    assert sample_sum(tracker, "blobsdk_tracker_events_total", event="peers_registered") >= 2  # the two clients
    assert sample_sum(scraped["blockstore"], "blobsdk_blockstore_bandwidth_bytes_total") >= 1 << 20  # the blob went in


async def test_exact_figures_after_known_requests(tmp_path: Path) -> None:
    async with running_app(blockstore.make_app(tmp_path / "blocks")) as url, aiohttp.ClientSession() as session:
        block, missing = new_block_id(), new_block_id()
        received = 0
        async with session.put(f"{url}/v1/blocks/{block}", data=b"x" * 1000) as resp:
            assert resp.status == 201
            received += len(await resp.read())
        async with session.get(f"{url}/v1/blocks/{block}", headers={"Range": "bytes=100-399"}) as resp:
            assert (resp.status, len(await resp.read())) == (206, 300)
        async with session.get(f"{url}/v1/blocks/{missing}") as resp:
            assert resp.status == 404
            received += len(await resp.read())
        async with session.get(f"{url}/nowhere") as resp:
            assert resp.status == 404
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
    name = "blobsdk_blockstore_requests_total"
    assert by_label(text, name, "status", route=BLOCK_ROUTE) == {"201": 1, "206": 1, "404": 1}
    assert by_label(text, name, "route", status="404") == {BLOCK_ROUTE: 1, "unmatched": 1}
    assert sample_sum(text, "blobsdk_blockstore_response_bytes_total", route=BLOCK_ROUTE) == 300 + received
    assert sample_sum(text, "blobsdk_blockstore_bandwidth_bytes_total") == 1300  # 1000 in, 300 out
    assert sample_values(text, "blobsdk_blockstore_requests_in_flight") == [({}, 1.0)]  # the scrape itself
    for status in ("201", "206", "404"):
        labels = {"route": BLOCK_ROUTE, "status": status}
        buckets = [v for found, v in sample_values(text, "blobsdk_blockstore_request_seconds_bucket", **labels)]
        assert buckets == sorted(buckets) and buckets[-1] == 1  # cumulative, the last is +Inf
        assert sample_sum(text, "blobsdk_blockstore_request_seconds_count", **labels) == 1
        assert sample_sum(text, "blobsdk_blockstore_request_seconds_sum", **labels) > 0


def test_two_servers_in_one_process_count_apart() -> None:
    a, b = ServerMetrics("blobsdk_a"), ServerMetrics("blobsdk_a")  # the same names: registries of their own
    a.requests.labels("/x", "200").inc()
    a.gauge("depth", "Queue depth.", lambda: 3)
    assert sample_sum(a.render().decode(), "blobsdk_a_requests_total") == 1
    assert sample_values(a.render().decode(), "blobsdk_a_depth") == [({}, 3.0)]
    assert sample_sum(b.render().decode(), "blobsdk_a_requests_total") == 0
    assert sample_values(b.render().decode(), "blobsdk_a_depth") == []


# --- the client -----------------------------------------------------------------------------------


async def test_client_collector_exports_stats(client_text: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(client_text)}
    for family in families.values():
        assert family.documentation, family.name
    assert families["blobsdk_client_tier_hits"].type == "counter"
    assert families["blobsdk_client_tier_latency_seconds"].type == "gauge"
    assert families["blobsdk_client_tier_read_seconds"].type == "histogram"
    hits = by_label(client_text, "blobsdk_client_tier_hits_total", "tier")
    assert set(hits) == {"l1", "l2", "peer", "l3", "l4"}
    assert hits["l1"] >= 1 and 2 * hits["l1"] == sum(hits.values())  # the second read's chunks, all from L1
    counts = by_label(client_text, "blobsdk_client_tier_read_seconds_count", "tier")
    assert counts == {tier: n for tier, n in hits.items() if tier != "l2"}  # a histogram per tier the client has
    infinite = by_label(client_text, "blobsdk_client_tier_read_seconds_bucket", "tier", le="+Inf")
    assert infinite == counts
    assert sample_sum(client_text, "blobsdk_client_tier_bytes_total") == 2 << 20
    assert sample_sum(client_text, "blobsdk_client_tier_enabled", tier="l2") == 0


async def test_client_collector_names_its_client(tmp_path: Path) -> None:
    async with blobsdk.Client.local(tmp_path / "store") as client:
        await client.put("/b/x", b"abc")
        assert bytes(await client.get("/b/x")) == b"abc"
        registry = CollectorRegistry()
        registry.register(ClientCollector(client, name="worker0"))
        text = generate_latest(registry).decode()
    assert sample_values(text, "blobsdk_client_tier_bytes_total", tier="l4") == [({"client": "worker0", "tier": "l4"}, 3.0)]
    assert sample_values(text, "blobsdk_client_plan_cache_entries") == [({"client": "worker0"}, 1.0)]


# --- the dashboard --------------------------------------------------------------------------------


def queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard's panels and template variables."""
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def exported_names(text: str) -> set[str]:
    """Every sample name ``text`` has, or would have once a labelled family gets a sample."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}[family.type]
        names |= {family.name + suffix for suffix in suffixes}
    return names


async def test_every_dashboard_query_names_metrics_that_exist(client_text: str, scraped: dict[str, str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names(client_text).union(*(exported_names(text) for text in scraped.values()))
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Client throughput by tier", "Client hit ratio by tier", "Client p99 latency by tier", "Hedges", "L3 fill"):
        assert wanted in titles
    assert {"Peer share", "Server p99 latency by route"} <= titles
    exprs = queries(dashboard)
    assert len(exprs) >= 20
    for expr in exprs:
        names = set(re.findall(r"\bblobsdk_[a-z0-9_]+", expr))
        assert names, expr
        assert names <= exported, (expr, names - exported)


def test_the_ingest_benchmark_reads_the_block_servers_answers(observed: tuple[str, dict[str, str]], cluster: Cluster) -> None:
    from benchmarks.ingest import l4_answers

    assert cluster.config is not None
    answers = asyncio.run(l4_answers(cluster.config))
    expected = by_label(observed[1]["blockstore"], "blobsdk_blockstore_requests_total", "status", route=BLOCK_ROUTE)
    assert answers == {int(status): int(n) for status, n in expected.items()} and answers[201] >= 1  # the blob's PUT
