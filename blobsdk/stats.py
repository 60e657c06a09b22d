"""Per-tier counters behind ``client.stats()``."""

from __future__ import annotations

from dataclasses import dataclass, field

_LATENCY_WINDOW = 2048  # recent samples kept per tier for percentiles


@dataclass
class TierStats:
    """Counters of one tier: ``hits`` are chunks it served, ``bytes`` what it served,
    ``corrupt`` copies dropped for a bad checksum, ``errors`` failed requests."""

    hits: int = 0
    misses: int = 0
    bytes: int = 0
    corrupt: int = 0
    errors: int = 0
    _latencies: list[float] = field(default_factory=list, repr=False)

    def hit(self, nbytes: int, seconds: float) -> None:
        self.hits += 1
        self.bytes += nbytes
        if len(self._latencies) >= _LATENCY_WINDOW:
            del self._latencies[: _LATENCY_WINDOW // 2]
        self._latencies.append(seconds)

    def as_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {
            "hits": self.hits,
            "misses": self.misses,
            "bytes": self.bytes,
            "corrupt": self.corrupt,
            "errors": self.errors,
        }
        ordered = sorted(self._latencies)
        for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
            out[name] = round(_quantile(ordered, q) * 1000, 3)
        return out


def _quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
