"""The ways the ingest benchmark feeds its training job (see benchmarks/ingest.py).

Each is a :class:`~benchmarks._ingest_job.Variant`: ``prepare()`` at the start of the set-up
phase, ``epoch(e)`` the batches, ``close()``.  Every DataLoader variant gets the same
loader settings (:func:`loader_options`): ``workers`` processes, ``persistent_workers=True``
(no re-fork per epoch, for every one of them), torch's default ``prefetch_factor`` (2
batches per worker) and :func:`collate` (a batch's samples in one shared-memory tensor);
their workers start, and begin fetching, in the set-up phase.

- :class:`Naive` (a): a blobsdk client with no L1, L2 or L3 and no readahead: the loop
  ``get``s each sample from L4 when it needs it.
- :func:`plain_http` (b): a map-style dataset whose ``__getitem__`` GETs the sample's URL
  with a per-process ``requests.Session``.
- :class:`CopyThenTrain` (c): ``copy_parallel`` threads download every sample's URL to a
  local directory (as ``aws s3 cp --recursive`` would, at its default concurrency), then
  the job trains from the local files (``readinto`` a buffer of the file's size).
- :func:`fsspec_cached` (d): fsspec's ``simplecache`` over its HTTP filesystem: the first
  open of a URL downloads the whole file to a local cache directory shared by the workers,
  later opens read it there.  (``blockcache`` keeps per-file block metadata in one JSON
  that concurrent workers overwrite; ``simplecache`` is the one fsspec documents as safe
  for concurrent use, and a training job reads whole samples.)  Its HTTP filesystem checks
  that a URL exists with a GET of its own before the GET that downloads it.
- :func:`blobsdk_dataset` (e): ``blobsdk.torch.BlobIterableDataset`` over every tier.
- :func:`blobsdk_map` and :func:`blobsdk_into`: the map-style ``BlobDataset`` (a bytearray per
  sample, then the collate's copy) against ``BlobBatchDataset`` (each batch read straight into
  its one tensor by ``get_many_into``), the same DataLoader over the same client config.
- :func:`in_memory` (reference): the same DataLoader over samples already in host memory:
  what the loader itself costs, which no storage can beat; and :class:`WithL3Traffic`
  around it, the same while the L3 nodes serve another process at the job's demand: what
  sharing this machine's cores with that traffic costs the loader.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import msgspec
import requests
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import blobsdk
from blobsdk.config import L1Config, L3Config

from ._ingest_job import Batch, Variant
from ._ingest_workload import Samples, Workload

HTTP_TIMEOUT_S = 120.0
Item = tuple[Any, torch.Tensor]


def as_tensor(buf: bytearray) -> torch.Tensor:
    return torch.frombuffer(buf, dtype=torch.uint8)


def collate(items: Sequence[Item]) -> Batch:
    """A batch's samples back to back in one tensor, allocated in shared memory inside a
    worker as torch's ``default_collate`` does, so a batch crosses to the job's process as
    one tensor.  (A tensor per sample, ``collate_fn=list``, passes a file descriptor per
    sample: measured 8.5 ms per batch of 8, 11% of this job's compute, with the samples
    already in memory; one tensor per batch: ~3.5 ms.)"""
    tensors = [tensor for _, tensor in items]
    total = sum(t.numel() for t in tensors)
    out = None
    if get_worker_info() is not None:
        first = tensors[0]
        out = first.new(first._typed_storage()._new_shared(total, device=first.device))
    return Batch(keys=[key for key, _ in items], sizes=[t.numel() for t in tensors], data=torch.cat(tensors, out=out))


def loader_options(workload: Workload) -> dict[str, Any]:
    """What every DataLoader variant is given."""
    return {"batch_size": workload.batch_size, "num_workers": workload.workers, "persistent_workers": True, "collate_fn": collate}


def map_loader(dataset: Dataset[Item], workload: Workload) -> DataLoader[Item]:
    """A shuffled DataLoader over a map-style dataset (a new permutation each epoch)."""
    generator = torch.Generator().manual_seed(workload.seed)
    return DataLoader(dataset, shuffle=True, generator=generator, **loader_options(workload))


def shuffled(n: int, seed: int, epoch: int) -> list[int]:
    """The order of epoch ``epoch`` for a variant that shuffles by itself (naive)."""
    return random.Random(seed * 1_000_003 + epoch).sample(range(n), n)


class LoaderVariant:
    """Epochs as the passes of one persistent DataLoader, which ``prepare`` starts (workers
    forked, their first batches requested); ``before_epoch(e)`` runs before each later pass
    (``set_epoch``); ``cleanup`` after the workers stopped."""

    def __init__(
        self,
        name: str,
        make_loader: Callable[[], DataLoader[Any]],
        *,
        before_epoch: Callable[[int], None] | None = None,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._make_loader = make_loader
        self._before_epoch = before_epoch
        self._cleanup = cleanup
        self._loader: DataLoader[Any] | None = None
        self._first: Iterator[Batch] | None = None
        self._peek: threading.Thread | None = None
        self._peeked: list[Batch] = []
        self._peek_failure: BaseException | None = None
        self._ttfb_s = 0.0

    def prepare(self) -> None:
        """Starts the loader, and a thread that asks for its first batch at once (the loader
        fetches as it would anyway): ``ttfb_s`` is when that batch came, from this call."""
        begun = time.perf_counter()
        with warnings.catch_warnings():
            # torch suggests no more workers than cores (2 here); the benchmark runs 4.
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            self._loader = self._make_loader()
            self._first = iter(self._loader)
        self._peek = threading.Thread(target=self._take_first, args=(self._first, begun), name="ingest-first-batch")
        self._peek.start()

    def _take_first(self, batches: Iterator[Batch], begun: float) -> None:
        try:
            self._peeked = [next(batches)]
        except StopIteration:
            self._peeked = []
        except BaseException as exc:  # noqa: BLE001 - raised again by epoch(0), on the job's thread
            self._peek_failure = exc
        self._ttfb_s = time.perf_counter() - begun

    def epoch(self, epoch: int) -> Iterable[Batch]:
        if self._loader is None:
            raise RuntimeError(f"{self.name}: prepare() first")
        first, self._first = self._first, None
        if first is not None:
            return self._after_peek(first)
        if self._before_epoch is not None:
            self._before_epoch(epoch)
        return iter(self._loader)

    def _after_peek(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        assert self._peek is not None
        self._peek.join()
        if self._peek_failure is not None:
            raise self._peek_failure
        yield from self._peeked
        yield from batches

    def figures(self) -> dict[str, float]:
        return {"ttfb_s": self._ttfb_s}

    def close(self) -> None:
        # The persistent workers are shut down when the loader's iterator is collected:
        # these are the only references.
        if self._peek is not None:
            self._peek.join()
        self._first = self._loader = None
        self._peeked = []
        if self._cleanup is not None:
            self._cleanup()


# --- (a) naive ----------------------------------------------------------------------------


class Naive:
    name = "naive"

    def __init__(self, config: blobsdk.ClientConfig, samples: Samples, workload: Workload) -> None:
        bare = msgspec.structs.replace(config, l1=L1Config(capacity_bytes=0), l2=None, l3_urls=())
        self._client = blobsdk.SyncClient(bare)
        self._samples, self._workload = samples, workload

    def prepare(self) -> None:
        self._client.__enter__()

    def epoch(self, epoch: int) -> Iterable[Batch]:
        order = shuffled(len(self._samples), self._workload.seed, epoch)
        size = self._workload.batch_size
        for start in range(0, len(order), size):
            paths = [self._samples.paths[i] for i in order[start : start + size]]
            yield collate([(path, as_tensor(self._client.get(path))) for path in paths])

    def figures(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self._client.close()


# --- (b) plain HTTP GETs in a DataLoader ----------------------------------------------------


class _Http:
    """GETs through one requests.Session per process (a forked worker makes its own)."""

    def __init__(self) -> None:
        self._session: requests.Session | None = None
        self._pid = 0

    def get(self, url: str) -> bytes:
        if self._session is None or self._pid != os.getpid():
            self._session, self._pid = requests.Session(), os.getpid()
        response = self._session.get(url, timeout=HTTP_TIMEOUT_S)
        response.raise_for_status()
        return response.content


class HttpDataset(Dataset[Item]):
    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self._http = _Http()

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> Item:
        return i, as_tensor(bytearray(self._http.get(self.urls[i])))


def plain_http(urls: Sequence[str], workload: Workload) -> LoaderVariant:
    return LoaderVariant("dataloader", lambda: map_loader(HttpDataset(urls), workload))


# --- (c) copy, then train from local disk ------------------------------------------------------


def read_file(path: str) -> bytearray:
    """A whole file, read into a buffer of its size."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(os.fstat(f.fileno()).st_size)
        view = memoryview(buf)
        while view:
            n = f.readinto(view)
            if not n:
                raise EOFError(f"{path} ended early")
            view = view[n:]
    return buf


class FileDataset(Dataset[Item]):
    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Item:
        return i, as_tensor(read_file(self.files[i]))


class CopyThenTrain:
    """The copy starts in the set-up phase, on a thread; epoch 0 waits for it, then starts
    the loader over the local files.  ``copy_s``: how long the copy took (``download_s``)."""

    name = "copy"

    def __init__(self, urls: Sequence[str], workload: Workload, dir: Path) -> None:
        self._urls, self._workload, self._dir = list(urls), workload, dir
        self._files = [str(dir / f"{i:06d}") for i in range(len(urls))]
        self._loader = LoaderVariant(self.name, lambda: map_loader(FileDataset(self._files), workload))
        self._copy: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.copy_s = 0.0

    def prepare(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._copy = threading.Thread(target=self._copy_all, name="ingest-copy")
        self._copy.start()

    def epoch(self, epoch: int) -> Iterable[Batch]:
        if epoch == 0:
            self._wait_for_copy()
            self._loader.prepare()
        return self._loader.epoch(epoch)

    def figures(self) -> dict[str, float]:
        return {"download_s": self.copy_s}

    def close(self) -> None:
        if self._copy is not None:
            self._copy.join()
        self._loader.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _wait_for_copy(self) -> None:
        if self._copy is None:
            raise RuntimeError(f"{self.name}: prepare() first")
        self._copy.join()
        if self._failure is not None:
            raise RuntimeError("the copy failed") from self._failure

    def _copy_all(self) -> None:
        start = time.perf_counter()
        local = threading.local()  # a Session per copying thread: a Session is not thread-safe

        def download(i: int) -> None:
            http = local.__dict__.setdefault("http", _Http())
            Path(self._files[i]).write_bytes(http.get(self._urls[i]))

        try:
            with ThreadPoolExecutor(self._workload.copy_parallel, thread_name_prefix="ingest-copy") as pool:
                list(pool.map(download, range(len(self._urls))))
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, which raises it
            self._failure = exc
        self.copy_s = time.perf_counter() - start


# --- (d) fsspec's HTTP filesystem with simplecache ----------------------------------------------


class FsspecDataset(Dataset[Item]):
    def __init__(self, urls: Sequence[str], cache_dir: Path) -> None:
        self.urls = list(urls)
        self.cache_dir = str(cache_dir)

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> Item:
        # fsspec keeps one instance per arguments and process (a forked child makes its own)
        fs = fsspec.filesystem("simplecache", target_protocol="http", cache_storage=self.cache_dir)
        with fs.open(self.urls[i], "rb") as f:  # a local file once the URL is in the cache
            return i, as_tensor(read_file(f.name))


def fsspec_cached(urls: Sequence[str], workload: Workload, cache_dir: Path) -> LoaderVariant:
    return LoaderVariant(
        "fsspec",
        lambda: map_loader(FsspecDataset(urls, cache_dir), workload),
        cleanup=lambda: shutil.rmtree(cache_dir, ignore_errors=True),
    )


# --- (e) blobsdk -------------------------------------------------------------------------------


def blobsdk_config(config: blobsdk.ClientConfig) -> blobsdk.ClientConfig:
    """No L1: a worker reads each sample once an epoch, and the shuffle hands it to another
    worker the next, so a host-memory cache would only cost a copy per chunk.  L3 keeps one replica per chunk: with
    two, each node hydrates its copy from L4 and a prefetch reads the dataset from the scarce
    HDD tier twice (measured: 224 MB/s of L4 reads for 112 MB/s of dataset)."""
    return msgspec.structs.replace(config, l1=L1Config(capacity_bytes=0), l3=L3Config(replicas=1))


def _tensor_item(sample: tuple[str, bytearray]) -> Item:
    return sample[0], as_tensor(sample[1])


def blobsdk_dataset(config: blobsdk.ClientConfig, samples: Samples, workload: Workload, name: str = "blobsdk") -> LoaderVariant:
    """``BlobIterableDataset`` (shuffled, sharded over the workers; each worker reads ahead
    ``readahead`` samples and, when the config has L3 nodes, deep-prefetches its next
    ``prefetch_window`` into L3; with L2 and no L3, the readahead's reads fill L2 behind
    them) in the common DataLoader, ``set_epoch`` before each epoch."""
    from blobsdk.torch import BlobIterableDataset

    dataset = BlobIterableDataset(
        blobsdk_config(config),
        samples.paths,
        transform=_tensor_item,
        shuffle=True,
        seed=workload.seed,
        readahead=workload.readahead,
        prefetch_window=workload.prefetch_window,
        prefetch_tier="l3" if config.l3_urls else None,
    )
    return LoaderVariant(name, lambda: DataLoader(dataset, **loader_options(workload)), before_epoch=dataset.set_epoch)


def blobsdk_map(config: blobsdk.ClientConfig, samples: Samples, workload: Workload, name: str = "blobsdk_map") -> LoaderVariant:
    """``BlobDataset`` (map-style, shuffled by the DataLoader): a batch read through one
    readahead, each sample a bytearray of its own, then the common collate's copy of them all
    into one shared-memory tensor.  The baseline of :func:`blobsdk_into`."""
    from blobsdk.torch import BlobDataset

    dataset = BlobDataset(blobsdk_config(config), samples.paths, transform=_tensor_item, readahead=workload.batch_size)
    return LoaderVariant(name, lambda: map_loader(dataset, workload), cleanup=dataset.close)


def _as_batch(batch: Any) -> Batch:
    """A SampleBatch as the job's Batch: the same tensor, no copy."""
    return Batch(keys=batch.paths, sizes=batch.sizes, data=batch.data)


def blobsdk_into(config: blobsdk.ClientConfig, samples: Samples, workload: Workload, name: str = "blobsdk_into") -> LoaderVariant:
    """``BlobBatchDataset``, the same loader and order as :func:`blobsdk_map`: a batch read by
    one ``get_many_into`` straight into its shared-memory tensor, which is what the loader
    hands over (``collate_batch``): no buffer per sample, no collate copy."""
    from blobsdk.torch import BlobBatchDataset, collate_batch

    dataset = BlobBatchDataset(blobsdk_config(config), samples.paths, transform=_as_batch)
    generator = torch.Generator().manual_seed(workload.seed)

    def loader() -> DataLoader[Any]:
        options = {**loader_options(workload), "collate_fn": collate_batch}
        return DataLoader(dataset, shuffle=True, generator=generator, **options)

    return LoaderVariant(name, loader, cleanup=dataset.close)


# --- reference: the loader alone -------------------------------------------------------------------


class MemoryDataset(Dataset[Item]):
    def __init__(self, samples: Samples) -> None:
        self.samples = samples  # a forked worker shares the parent's buffer

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Item:
        return i, as_tensor(bytearray(self.samples.data(i)))


def in_memory(samples: Samples, workload: Workload, name: str = "memory") -> LoaderVariant:
    return LoaderVariant(name, lambda: map_loader(MemoryDataset(samples), workload))


class WithL3Traffic:
    """A variant (the memory reference) run while another process reads the dataset from L3
    at the job's demand (benchmarks/_ingest_traffic.py): the L3 nodes and a reader then do
    the work of blobsdk's warm epochs on the same cores, but the loader waits on none of it.
    Run after blobsdk's variant, which left the dataset in L3."""

    def __init__(self, inner: Variant, config: blobsdk.ClientConfig, workload: Workload, dir: Path) -> None:
        self.name = inner.name
        self._inner = inner
        self._config_path = dir / "traffic.toml"
        self._config_path.parent.mkdir(parents=True, exist_ok=True)
        self._config_path.write_text(blobsdk_config(config).to_toml())
        # Started here, before the job (the variant is made just before it runs), not in
        # prepare(): its start-up (imports, a listing, the first reads) took 1-1.6 s, which
        # the set-up phase would have counted as the first epoch's stall.
        command = [sys.executable, "-m", "benchmarks._ingest_traffic", str(self._config_path), str(workload.demand_Bps)]
        self._reader = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self._reader.stdout is not None
        if self._reader.stdout.readline().strip() != "reading":
            self._reader.communicate()
            raise RuntimeError(f"the background reader exited with code {self._reader.returncode} before reading")

    def prepare(self) -> None:
        self._inner.prepare()

    def epoch(self, epoch: int) -> Iterable[Batch]:
        return self._inner.epoch(epoch)

    def figures(self) -> dict[str, float]:
        return self._inner.figures()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._reader.terminate()
            self._reader.communicate()  # waits, and closes its stdout
