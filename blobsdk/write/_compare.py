"""The checkpoint a save compares with (blobsdk/write/checkpoint.py), and which of its entries
a leaf of the new state may take its chunks, or its digests, from."""

from __future__ import annotations

from ..wire import ReadPlan
from .leaves import Leaf, Stamp
from .manifest import Entry, Holding, Manifest


class Base:
    """The checkpoint a save compares with: its manifest, its data blob's plan, the version of
    ``latest`` that names it, and (one the comparing object committed) its tensors' stamps."""

    def __init__(
        self, manifest: Manifest, plan: ReadPlan, latest_version: int, stamps: dict[tuple[str, ...], Stamp] | None = None
    ) -> None:
        self.manifest, self.plan, self.latest_version = manifest, plan, latest_version
        self.stamps = stamps or {}
        self._by_name = {entry.name: entry for entry in manifest.entries}

    def match(self, leaf: Leaf, chunk_size: int) -> Entry | None:
        """The entry whose chunks ``leaf`` may reuse: same name, kind, dtype, shape, chunk size."""
        entry = self._by_name.get(leaf.name)
        if entry is None or self.manifest.chunk_size != chunk_size:
            return None
        return entry if (entry.kind, entry.dtype, entry.shape) == (leaf.kind, leaf.dtype, leaf.shape) else None

    def chunk_refs(self, entry: Entry) -> list[Holding]:
        """The refs that hold each chunk of ``entry`` (an entry of this manifest)."""
        return [
            Holding(tuple(self.plan.chunks[i] for i in span), patches)
            for span, patches in zip(entry.chunk_refs(), entry.patch_counts(), strict=True)
        ]

    def known(self, leaves: list[Leaf], chunk_size: int) -> dict[tuple[str, ...], list[bytes]]:
        """The chunk digests of the tensors of ``leaves`` whose stamp is the one recorded here
        (so are their entry's, byte for byte), by name."""
        known = {}
        for leaf in leaves:
            entry = self.match(leaf, chunk_size)
            if entry is not None and leaf.stamp is not None and leaf.stamp.same(self.stamps.get(leaf.name)):
                known[leaf.name] = list(entry.digests)
        return known
