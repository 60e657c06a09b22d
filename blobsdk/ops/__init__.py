"""Operations on a whole store, each over the capabilities it needs: garbage collection of
unreferenced blocks (``gc``), repair of bad or missing L4 copies (``Repairer``, and the scrub),
and indexing S3 objects in place (``index_s3``).  The client runs them; the composition root
starts the repairer."""

from __future__ import annotations

from .gc import GcReport
from .index import PARALLEL_OBJECTS, IndexProgress, IndexReport, index_s3, s3_source
from .repair import Repairer, ScrubReport

__all__ = ["PARALLEL_OBJECTS", "GcReport", "IndexProgress", "IndexReport", "Repairer", "ScrubReport", "index_s3", "s3_source"]
