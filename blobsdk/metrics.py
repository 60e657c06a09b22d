"""A Prometheus collector over :meth:`blobsdk.Client.stats`, so a training job can be scraped.

    from prometheus_client import CollectorRegistry, start_http_server
    from blobsdk.metrics import ClientCollector

    registry = CollectorRegistry()
    registry.register(ClientCollector(client))
    start_http_server(9400, addr="127.0.0.1", registry=registry)   # or generate_latest(registry)

Every scrape reads ``client.stats()`` and ``client.latency_histograms()`` once; nothing is counted twice and nothing runs between
scrapes.  The families (``tier`` is l1, l2, peer, l3 or l4):

    blobsdk_client_tier_hits_total{tier}              counter  chunks the tier served
    blobsdk_client_tier_misses_total{tier}            counter  chunks looked up and not found there
    blobsdk_client_tier_bytes_total{tier}             counter  bytes the tier served
    blobsdk_client_tier_corrupt_total{tier}           counter  copies dropped for a bad checksum
    blobsdk_client_tier_errors_total{tier}            counter  failed requests
    blobsdk_client_tier_read_seconds{tier,le}         histogram seconds each hit took, since the client opened
    blobsdk_client_tier_latency_seconds{tier,quantile} gauge   p50/p99 of the tier's recent hits
    blobsdk_client_tier_enabled{tier}                 gauge    1 if the client has the tier
    blobsdk_client_hedges_sent_total{tier}            counter  hedged attempts started
    blobsdk_client_hedges_won_total{tier}             counter  hedged attempts that returned first
    blobsdk_client_replicas_demoted{tier}             gauge    replicas demoted now
    blobsdk_client_cache_bytes{tier}                  gauge    bytes the L1/L2 cache holds
    blobsdk_client_cache_capacity_bytes{tier}         gauge    bytes the L1/L2 cache may hold
    blobsdk_client_plan_cache_hits_total              counter  read plans found in the plan cache
    blobsdk_client_plan_cache_misses_total            counter  read plans fetched from metadata
    blobsdk_client_plan_cache_entries                 gauge    read plans cached

The histogram is the one to aggregate and alert on (``histogram_quantile`` over its rate, summed
across clients); the quantile gauges are each tier's last 1024 to 2048 hits, as ``stats()``
gives them (``blobsdk/stats.py``), and do not add up across clients.  A process with
several clients (one per DataLoader worker) registers one collector per client, each with a
distinct ``client`` label (``ClientCollector(c, name="worker3")``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .stats import LatencyHistogram

PREFIX = "blobsdk_client"

_TIER_COUNTERS = {
    "hits": "Chunks the tier served.",
    "misses": "Chunks looked up in the tier and not found there.",
    "bytes": "Bytes the tier served.",
    "corrupt": "Copies the tier dropped for a bad checksum.",
    "errors": "Requests to the tier that failed.",
}
_HEDGES = {
    "hedge_hedges_sent": ("hedges_sent", "Hedged attempts the tier started (another replica asked while the first was slow)."),
    "hedge_hedges_won": ("hedges_won", "Hedged attempts of the tier that returned first."),
}
_CACHE_GAUGES = {
    "cache_bytes": "Bytes the tier's local cache holds (L1 memory, L2 disk).",
    "cache_capacity_bytes": "Bytes the tier's local cache may hold.",
}
_QUANTILES = (("0.5", "p50_ms"), ("0.99", "p99_ms"))

Stats = Mapping[str, Mapping[str, int | float]]


class HasStats(Protocol):
    def stats(self) -> Stats: ...

    def latency_histograms(self) -> Mapping[str, LatencyHistogram]: ...


class ClientCollector(Collector):
    """The figures of ``client.stats()`` as Prometheus families (see the module docstring).
    ``name``, if given, is the value of a ``client`` label on every sample."""

    def __init__(self, client: HasStats, *, name: str | None = None) -> None:
        self._client = client
        self._labels = ("client",) if name is not None else ()
        self._values = (name,) if name is not None else ()

    def collect(self) -> Iterator[Metric]:
        stats = self._client.stats()
        tiers = {name: s for name, s in stats.items() if "enabled" in s}
        yield from self._tier_families(tiers)
        yield self._histogram_family(self._client.latency_histograms())
        yield from self._extra_families(tiers)
        plan = stats.get("plan")
        if plan is not None:
            yield self._family(CounterMetricFamily, "plan_cache_hits", "Read plans found in the plan cache.", plan["hits"])
            yield self._family(CounterMetricFamily, "plan_cache_misses", "Read plans fetched from metadata.", plan["misses"])
            yield self._family(GaugeMetricFamily, "plan_cache_entries", "Read plans cached now.", plan["entries"])

    def _tier_families(self, tiers: Mapping[str, Mapping[str, int | float]]) -> Iterator[Metric]:
        labels = [*self._labels, "tier"]
        for key, text in _TIER_COUNTERS.items():
            family = CounterMetricFamily(f"{PREFIX}_tier_{key}", text, labels=labels)
            for tier, s in tiers.items():
                family.add_metric([*self._values, tier], float(s[key]))
            yield family
        latency = GaugeMetricFamily(
            f"{PREFIX}_tier_latency_seconds",
            "Quantiles of the seconds the tier's recent hits took (its last 1024 to 2048 hits).",
            labels=[*labels, "quantile"],
        )
        enabled = GaugeMetricFamily(f"{PREFIX}_tier_enabled", "1 if the client reads through the tier, else 0.", labels=labels)
        for tier, s in tiers.items():
            for quantile, key in _QUANTILES:
                latency.add_metric([*self._values, tier, quantile], float(s[key]) / 1000)
            enabled.add_metric([*self._values, tier], float(s["enabled"]))
        yield latency
        yield enabled

    def _histogram_family(self, histograms: Mapping[str, LatencyHistogram]) -> Metric:
        family = HistogramMetricFamily(
            f"{PREFIX}_tier_read_seconds",
            "Seconds each chunk the tier served took, since the client opened.",
            labels=[*self._labels, "tier"],
        )
        for tier, h in histograms.items():
            bounds = [*(repr(float(b)) for b in h.bounds), "+Inf"]
            family.add_metric([*self._values, tier], buckets=list(zip(bounds, h.cumulative(), strict=True)), sum_value=h.sum)
        return family

    def _extra_families(self, tiers: Mapping[str, Mapping[str, int | float]]) -> Iterator[Metric]:
        labels = [*self._labels, "tier"]
        for key, (name, text) in _HEDGES.items():
            family = CounterMetricFamily(f"{PREFIX}_{name}", text, labels=labels)
            for tier, s in tiers.items():
                family.add_metric([*self._values, tier], float(s.get(key, 0)))
            yield family
        demoted = GaugeMetricFamily(
            f"{PREFIX}_replicas_demoted", "Replicas the tier has demoted now (they served bad bytes).", labels=labels
        )
        for tier, s in tiers.items():
            demoted.add_metric([*self._values, tier], float(s.get("replicas_demoted", 0)))
        yield demoted
        for key, text in _CACHE_GAUGES.items():
            cache = GaugeMetricFamily(f"{PREFIX}_{key}", text, labels=labels)
            for tier, s in tiers.items():
                if key in s:
                    cache.add_metric([*self._values, tier], float(s[key]))
            yield cache

    def _family(self, kind: type[CounterMetricFamily | GaugeMetricFamily], name: str, text: str, value: float) -> Metric:
        family = kind(f"{PREFIX}_{name}", text, labels=list(self._labels))
        family.add_metric(list(self._values), float(value))
        return family
