"""The flash node's figures on /metrics (servers/flash.py): its cache, requests, bad-copy
reports, L4 reads and hydrate jobs, read from the node at each scrape."""

from __future__ import annotations

from functools import partial
from typing import Protocol

from blobsdk.cache import DiskCache
from blobsdk.tail import ReplicaReader

from ._common.metrics import ServerMetrics
from .flashreports import BadCopyReports


class Node(Protocol):
    """What /metrics reads of the flash node (servers/flash.py's FlashNode, which exports
    its figures here and so sits above this module)."""

    @property
    def cache(self) -> DiskCache: ...

    @property
    def l4(self) -> ReplicaReader: ...

    @property
    def counters(self) -> object: ...

    @property
    def reports(self) -> BadCopyReports: ...

    def running_jobs(self) -> int: ...


_CACHE_GAUGES = {
    "bytes": "Bytes of chunks the flash cache holds (L3 fill; see cache_capacity_bytes).",
    "entries": "Chunks the flash cache holds.",
    "capacity_bytes": "Bytes the flash cache may hold.",
}
_CACHE_COUNTERS = {
    "evictions": "Chunks evicted from the flash cache.",
    "corrupt": "Stored chunks found damaged on read and dropped.",
}
_CHUNK_COUNTERS = {
    "hits": "Chunk GETs served from flash (cache hits).",
    "misses": "Chunk GETs read through from L4 (cache misses).",
    "fills": "Read-through copies stored in flash.",
    "fills_refused": "Read-through copies the cache did not admit.",
    "quota_rejections": "Read-through copies over the requester's quota: served, not stored.",
    "puts": "Chunks stored by PUT.",
}
_REPORT_COUNTERS = {
    "rechecked": "Bad-copy reports that had the node verify its file again.",
    "absorbed": "Bad-copy reports answered without a verification (one in flight or recent, or no file).",
    "refused": "Bad-copy reports over their tenant's rate: 429, nothing done.",
}
_HEDGE_COUNTERS = {
    "primaries": "L4 reads run (first attempts).",
    "hedges_sent": "Hedged L4 attempts started (a second replica asked while the first was slow).",
    "hedges_won": "Hedged L4 attempts that returned first.",
    "budget_exhausted": "L4 reads that wanted a hedge and had no hedge budget left.",
    "failovers": "L4 attempts started because another one failed.",
    "hedges_deferred": "L4 hedges that waited for their target to have room.",
    "hung_failovers": "L4 attempts failed over because they outlived their hang deadline or their target was hung.",
    "probes": "Probes sent to hung L4 replicas.",
}


def export(metrics: ServerMetrics, node: Node) -> None:
    """The node's cache, request, L4 and job figures on /metrics (read at each scrape)."""
    for name, text in _CACHE_GAUGES.items():
        metrics.gauge(f"cache_{name}", text, partial(_cache_stat, node, name))
    for name, text in _CACHE_COUNTERS.items():
        metrics.counter(f"cache_{name}", text, partial(_cache_stat, node, name))
    for name, text in _CHUNK_COUNTERS.items():
        metrics.counter(f"chunk_{name}", text, partial(_counter_stat, node, name))
    for name, text in _REPORT_COUNTERS.items():
        metrics.counter(f"reports_{name}", text, partial(_report_stat, node, name))
    metrics.counter("l4_corrupt_copies", "L4 copies that failed their checksum.", lambda: node.l4.stats.corrupt)
    metrics.counter("l4_errors", "L4 reads that failed.", lambda: node.l4.stats.errors)
    for name, text in _HEDGE_COUNTERS.items():
        metrics.counter(f"l4_{name}", text, partial(_l4_stat, node, f"hedge_{name}"))
    metrics.gauge("l4_targets_hung", "L4 replicas judged hung now.", partial(_l4_stat, node, "hedge_targets_hung"))
    metrics.gauge(
        "l4_replicas_demoted", "L4 replicas demoted now (they served bad bytes).", partial(_l4_stat, node, "replicas_demoted")
    )
    metrics.gauge("hydrate_jobs_running", "Hydrate jobs running (the job queue depth).", node.running_jobs)


def _cache_stat(node: Node, name: str) -> float:
    return node.cache.stats().get(name, 0)


def _counter_stat(node: Node, name: str) -> float:
    value: int = getattr(node.counters, name)
    return value


def _report_stat(node: Node, name: str) -> float:
    value: int = getattr(node.reports.counters, name)
    return value


def _l4_stat(node: Node, name: str) -> float:
    return node.l4.figures().get(name, 0)
