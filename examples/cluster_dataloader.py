"""A local cluster, then a PyTorch DataLoader with worker processes reading from it.

Starts a cluster in-process (the metadata API server, 3 block servers and an L3 flash node,
each a real server process on a free loopback port; ``blobsdk-cluster --dir DIR``
starts the same from a shell), writes a small dataset, then reads it for two shuffled epochs
with ``BlobIterableDataset`` and once with the map-style ``BlobDataset`` and ``BlobSampler``,
each through a DataLoader with 2 workers, and prints every tier's hit ratio.  Needs the
``torch`` extra (from a clone: ``pip install -e '.[torch]'``).

    python examples/cluster_dataloader.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

import blobsdk
from blobsdk.torch import BlobDataset, BlobIterableDataset, BlobSampler
from blobsdk_servers.cluster import start_cluster

SAMPLES = 64
SIZE = 256 * 1024


def sample(i: int) -> bytes:
    return i.to_bytes(4, "big") * (SIZE // 4)


def decode(item: tuple[str, bytearray]) -> tuple[str, int]:
    """What a real job would decode (an image, a token array); here: the sample's number."""
    path, data = item
    return path, int.from_bytes(data[:4], "big")


def hit_ratios(stats: dict[str, Any]) -> str:
    """'l1 32/128, l3 96/96': each tier's hits / lookups, over every worker, since the dataset was made."""
    used = [(tier, t["hits"], t["hits"] + t["misses"]) for tier, t in stats["total"].items() if t["enabled"]]
    return ", ".join(f"{tier} {hits}/{lookups}" for tier, hits, lookups in used if lookups)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="blobsdk-cluster-") as tmp, start_cluster(Path(tmp) / "c", l3_nodes=1) as cluster:
        print(f"cluster up: {', '.join(p.name for p in cluster.processes)}; its client.toml: {cluster.config_path}")
        with blobsdk.SyncClient(cluster.config) as c:
            c.put_many((f"/train/{i:04d}.bin", sample(i)) for i in range(SAMPLES))
        print(f"wrote {SAMPLES} samples of {SIZE // 1024} KiB under /train/")

        ds = BlobIterableDataset(cluster.config_path, "/train/", shuffle=True, seed=0, transform=decode, prefetch_window=16)
        loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list, persistent_workers=True)
        for epoch in range(2):
            ds.set_epoch(epoch)  # in the main process, before each epoch
            seen = [number for batch in loader for path, number in batch]
            assert sorted(seen) == list(range(SAMPLES))  # every sample once, in a seeded order
            print(f"epoch {epoch}: {len(seen)} samples, each once, first {seen[:4]}; hits: {hit_ratios(ds.worker_stats())}")
        del loader  # stops its persistent workers
        ds.close()

        maps = BlobDataset(cluster.config_path, "/train/", transform=decode)
        sampler = BlobSampler(maps, shuffle=True, seed=0)
        maps_loader = DataLoader(maps, sampler=sampler, batch_size=8, num_workers=2, collate_fn=list)
        seen = [number for batch in maps_loader for path, number in batch]
        assert sorted(seen) == list(range(SAMPLES))
        print(f"map-style: {len(seen)} samples through BlobDataset and BlobSampler; hits: {hit_ratios(maps.worker_stats())}")
        maps.close()
    print("cluster_dataloader: done")


if __name__ == "__main__":
    main()
