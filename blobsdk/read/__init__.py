"""The read path over the tiers: range reads (``ReadPath``: peek, then one fetch per chunk key,
filled upwards), reads straight into the caller's memory and the buffers they may fill, the
dataloader readahead (``read_ahead``), and deep prefetch into L1/L2 or L3 (``Prefetcher`` and its handle)."""

from __future__ import annotations

from .into import writable_bytes
from .prefetch import Prefetch, Prefetcher, PrefetchProgress
from .readahead import READAHEAD_BYTES, READAHEAD_DEPTH, check_window, read_ahead
from .readpath import ReadPath, check_offset, check_range

__all__ = [
    "READAHEAD_BYTES",
    "READAHEAD_DEPTH",
    "Prefetch",
    "PrefetchProgress",
    "Prefetcher",
    "ReadPath",
    "check_offset",
    "check_range",
    "check_window",
    "read_ahead",
    "writable_bytes",
]
