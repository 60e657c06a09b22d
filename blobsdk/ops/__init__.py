"""Operations on a whole store, each over the capabilities it needs: garbage collection of
unreferenced blocks (``collect_garbage``), repair of bad or missing L4 copies (``Repairer``, and the scrub),
and indexing S3 objects in place (``index_s3``).  The client runs them; the composition root
starts the repairer."""

from __future__ import annotations

from .gc import GcReport, collect_garbage
from .index import PARALLEL_OBJECTS, IndexProgress, IndexReport, index_s3, s3_source
from .repair import Repairer, ScrubProgress, ScrubReport, scrub

__all__ = [
    "PARALLEL_OBJECTS",
    "GcReport",
    "IndexProgress",
    "IndexReport",
    "Repairer",
    "ScrubProgress",
    "ScrubReport",
    "collect_garbage",
    "index_s3",
    "s3_source",
    "scrub",
]
