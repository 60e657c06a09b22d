"""Every server's ``/metrics``: Prometheus text made by ``prometheus_client``.

Each server (each :func:`servers._common.http.base_app`) has a :class:`ServerMetrics` with a
``CollectorRegistry`` of its own, never the process-global one: several servers run in one
test process, and each exports only what it did.  Its middleware times every request and
records it under the route's *canonical* name (``/v1/blocks/{block_id}``, never the raw path,
which would make one series per block) and the answer's status:

    <server>_requests_total{route,status}            counter
    <server>_request_seconds{route,status}           histogram (_bucket, _sum, _count)
    <server>_response_bytes_total{route}             counter: body bytes answered
    <server>_requests_in_flight                      gauge: requests being handled now

A request whose client left before its answer is counted with status 499 (nginx's "client
closed request"); one that matched no route has route ``unmatched``.  What a server keeps in
its own objects (queue depths, cache counters, hedges) is read when /metrics is scraped, by
callbacks the server registers with :meth:`ServerMetrics.counter` and
:meth:`ServerMetrics.gauge`.  The text is Prometheus's format 0.0.4; counters and histograms
also carry prometheus_client's ``_created`` samples (when each series began).  The readers
below (:func:`sample_values`, :func:`sample_sum`, :func:`by_label`) parse it with
``prometheus_client.parser`` for the tests, the benchmarks and ``servers/swarm.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from .auth import Handler

CLIENT_CLOSED = 499  # the status counted for a request whose client left before the answer (nginx's)

# Seconds: from a cache hit on loopback (well under 1 ms) to a queued HDD read of a large block.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

STATUS_HELP = "status is the HTTP status answered; 499 means the client went away before the answer (nginx's convention)"

Reading = Callable[[], float]
LabelledReading = Callable[[], Mapping[tuple[str, ...], float]]


@dataclass(frozen=True)
class _Callback:
    kind: str  # "counter" or "gauge"
    name: str
    help: str
    read: Reading | LabelledReading
    labels: tuple[str, ...]


class _Callbacks(Collector):
    """The values a server keeps in its own objects, read at each scrape."""

    def __init__(self) -> None:
        self.items: list[_Callback] = []

    def collect(self) -> Iterator[Metric]:
        for item in self.items:
            family_of = CounterMetricFamily if item.kind == "counter" else GaugeMetricFamily
            family = family_of(item.name, item.help, labels=item.labels)
            value = item.read()
            if item.labels:
                for key, v in sorted(value.items()):  # type: ignore[union-attr]
                    family.add_metric(list(key), float(v))
            else:
                family.add_metric([], float(value))  # type: ignore[arg-type]
            yield family


class ServerMetrics:
    """One server's registry, request middleware and ``/metrics`` handler.  ``server`` is its
    metric prefix (``blobsdk_blockstore``)."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"{server}_requests",
            f"Requests answered, by route (aiohttp's canonical route name) and status; {STATUS_HELP}.",
            ("route", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{server}_request_seconds",
            f"Seconds from a request's arrival to its handler's answer, by route and status; {STATUS_HELP}.",
            ("route", "status"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.response_bytes = Counter(
            f"{server}_response_bytes",
            "Response body bytes served, by route (a request whose client went away counts none).",
            ("route",),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            f"{server}_requests_in_flight",
            "Requests being handled now: arrived, not yet answered (a scrape counts itself).",
            registry=self.registry,
        )
        self._callbacks = _Callbacks()
        self.registry.register(self._callbacks)

    def counter(self, name: str, help: str, read: Reading) -> None:
        """Export ``read()`` as counter ``<server>_<name>_total`` (``name`` without ``_total``)."""
        self._callbacks.items.append(_Callback("counter", f"{self.server}_{name}", help, read, ()))

    def gauge(self, name: str, help: str, read: Reading) -> None:
        """Export ``read()`` as gauge ``<server>_<name>``."""
        self._callbacks.items.append(_Callback("gauge", f"{self.server}_{name}", help, read, ()))

    def labelled(self, kind: str, name: str, help: str, labels: Sequence[str], read: LabelledReading) -> None:
        """Export ``read()``, a mapping of label values to numbers, as one ``kind`` family."""
        self._callbacks.items.append(_Callback(kind, f"{self.server}_{name}", help, read, tuple(labels)))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        resource = request.match_info.route.resource
        route = "unmatched" if resource is None else resource.canonical
        status, sent = 500, 0
        self.in_flight.inc()
        try:
            response = await handler(request)
            status, sent = response.status, _body_bytes(response)
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:  # the client went away first (listening() cancels)
            status = CLIENT_CLOSED
            raise
        finally:
            self.in_flight.dec()
            labels = (route, str(status))
            self.requests.labels(*labels).inc()
            self.latency.labels(*labels).observe(time.perf_counter() - start)
            self.response_bytes.labels(route).inc(sent)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})


def _body_bytes(response: web.StreamResponse) -> int:
    """The body bytes of ``response``: written so far if the handler streamed it, else its
    length (a plain Response is written after the middlewares return)."""
    if response.prepared:
        return response.body_length
    return response.content_length or 0


# --- reading /metrics (tests, benchmarks, servers/swarm.py) --------------------------------------


def sample_values(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples named ``name`` (``foo_total``, ``foo_bucket``...) in Prometheus ``text``
    whose labels include ``labels``: (their labels, their value)."""
    samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
    return [(dict(s.labels), s.value) for s in samples if s.name == name and labels.items() <= s.labels.items()]


def sample_sum(text: str, name: str, **labels: str) -> float:
    """The sum of :func:`sample_values` (0.0 if there is none)."""
    return sum(value for _, value in sample_values(text, name, **labels))


def by_label(text: str, name: str, label: str, **labels: str) -> dict[str, float]:
    """The samples of :func:`sample_values`, summed by the value of ``label``."""
    out: dict[str, float] = {}
    for found, value in sample_values(text, name, **labels):
        out[found[label]] = out.get(found[label], 0.0) + value
    return out
