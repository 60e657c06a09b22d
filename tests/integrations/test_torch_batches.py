"""blobsdk.torch.BlobBatchDataset: a DataLoader's batches read straight into one tensor each
(get_many_into), in real worker processes over a real embedded store."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import blobsdk
from blobsdk.config import L1Config
from blobsdk.runtime.buffers import BufferPool
from blobsdk.torch import BlobBatchDataset, BlobSampler, SampleBatch, collate_batch

N = 300
PREFIX = "/train/b/"
NO_L1 = L1Config(capacity_bytes=0)


def content(i: int) -> bytes:
    return random.Random(i).randbytes(500 + 37 * (i % 50))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("batches") / "store"
    paths = [f"{PREFIX}{i:04d}" for i in range(N)]
    with blobsdk.SyncClient.local(root) as c:
        c.put_many((p, content(i)) for i, p in enumerate(paths))
    return root, paths


def check(batch: SampleBatch) -> list[str]:
    """The batch's paths, each sample's bytes checked against the store's, one tensor in all."""
    assert batch.data.dtype == torch.uint8 and batch.data.numel() == sum(batch.sizes)
    for path, view in batch:
        assert view.numpy().tobytes() == content(int(path.rsplit("/", 1)[1]))
        assert view.untyped_storage().data_ptr() == batch.data.untyped_storage().data_ptr()
    return batch.paths


def test_workers_read_each_batch_into_one_shared_memory_tensor(store: tuple[Path, list[str]]) -> None:
    """Two persistent workers, shuffled by the DataLoader, two epochs: every sample once an
    epoch, each batch one tensor that reached this process through shared memory."""
    root, paths = store
    ds = BlobBatchDataset.local(root, PREFIX, l1=NO_L1)
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        ds, batch_size=32, shuffle=True, generator=generator, num_workers=2, persistent_workers=True, collate_fn=collate_batch
    )
    orders = []
    for _ in range(2):
        seen: list[str] = []
        for batch in loader:
            assert isinstance(batch, SampleBatch) and batch.data.is_shared()
            seen += check(batch)
        assert Counter(seen) == Counter(paths)
        orders.append(seen)
    assert orders[0] != orders[1]
    workers = ds.worker_stats()["workers"]
    assert len(workers) == 2 and sum(w["l4"]["bytes"] for w in workers.values()) == 2 * sum(len(content(i)) for i in range(N))
    ds.close()


def test_in_the_main_process_a_batch_needs_no_chunk_buffer(store: tuple[Path, list[str]]) -> None:
    """num_workers=0, no L1: every chunk goes straight from the local store into the batch
    tensor (the pool refuses to hand out a buffer); not in shared memory, not pinned (no CUDA
    here: pin_memory=True then allocates plain memory)."""
    root, _ = store
    ds = BlobBatchDataset.local(root, PREFIX, l1=NO_L1, pin_memory=True)
    client = ds._client.get()
    client._here()._open.readpath.tiers[-1].buffers = NoBuffers()
    loader = DataLoader(ds, batch_size=50, num_workers=0, collate_fn=collate_batch)
    batches = list(loader)
    assert len(batches) == 6 and not any(b.data.is_shared() for b in batches)
    assert [p for b in batches for p in check(b)] == [f"{PREFIX}{i:04d}" for i in range(N)]
    assert batches[0].data.is_pinned() is torch.cuda.is_available()
    ds.close()


class NoBuffers(BufferPool):
    def take(self, size: int) -> memoryview:
        raise AssertionError("a chunk buffer was taken")


def lengths(batch: SampleBatch) -> list[int]:
    return [view.numel() for _, view in batch]


def test_the_transform_gets_the_batch_in_the_worker_and_a_sampler_shards_it(store: tuple[Path, list[str]]) -> None:
    root, _ = store
    ds = BlobBatchDataset.local(root, PREFIX, transform=lengths)
    sampler = BlobSampler(ds, shuffle=True, seed=1, rank=1, world_size=3)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2, collate_fn=collate_batch)
    got = [n for batch in loader for n in batch]
    assert sorted(got) == sorted(len(content(i)) for i in list(sampler))
    assert len(got) == N // 3
    ds.close()


def test_a_sample_batch_indexes_its_samples() -> None:
    batch = SampleBatch(["/a/x", "/a/y", "/a/z"], [2, 0, 3], torch.tensor(list(b"abcde"), dtype=torch.uint8))
    assert batch.offsets == [0, 2, 2, 5] and len(batch) == 3
    assert [bytes(batch[i].tolist()) for i in (0, 1, 2, -1, -3)] == [b"ab", b"", b"cde", b"cde", b"ab"]
    with pytest.raises(IndexError):
        batch[3]
    assert [(p, bytes(v.tolist())) for p, v in batch] == [("/a/x", b"ab"), ("/a/y", b""), ("/a/z", b"cde")]
    assert collate_batch(batch) is batch


def test_dataset_item_is_a_batch_of_one(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    with BlobBatchDataset.local(root, paths[:10]) as ds:
        one = ds[4]
        assert one.paths == [paths[4]] and check(one) == [paths[4]]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"transform": 3}, "transform must be callable or None, not int"),
    ({"pin_memory": "yes"}, "pin_memory must be a bool, not str"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD)
def test_bad_arguments_are_refused(store: tuple[Path, list[str]], kwargs: dict[str, Any], message: str) -> None:
    root, _ = store
    with pytest.raises(TypeError, match=f"^{message}$"):
        BlobBatchDataset.local(root, PREFIX, **kwargs)
