"""Writes: a blob's chunking, compression, packing into blocks, durable block writes and
commit (``Writer``), the content-addressed chunk index (``KnownChunks``), and delta
checkpoints (``Checkpoints``: staged, committed atomically, retired, loaded, restored in
place; a distributed save's ``Part`` of each rank)."""

from __future__ import annotations

from .checkpoint import Checkpoints, Pending
from .dedup import KnownChunks
from .manifest import Entry, Part
from .restore import problem
from .stage import REWRITE_AT
from .writer import MAX_BATCH, Progress, Writer

__all__ = ["MAX_BATCH", "REWRITE_AT", "Checkpoints", "Entry", "KnownChunks", "Part", "Pending", "Progress", "Writer", "problem"]
