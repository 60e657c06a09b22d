"""The map-style datasets of :mod:`blobsdk.torch` (imported from there): ``BlobDataset`` (an
item per sample, a batch through one readahead), ``BlobBatchDataset`` (a batch read straight
into one tensor: the zero-copy path into a DataLoader) and ``BlobSampler`` (their order,
sharding and resume).  See blobsdk/torch.py's module docstring for what they share with the
iterable dataset: building, sharding, resume, one client per process, workers' stats.

**BlobBatchDataset**: ``dataset.__getitems__(indices)`` (what the DataLoader's fetcher calls
for a batch) is one :class:`SampleBatch`: the samples back to back in one uint8 tensor,
read by ``get_many_into`` straight into it (the chunks of a block's small samples in one
request), ``transform(batch)`` if given.  No bytes object per sample, no ``torch.cat``: in a
DataLoader worker the tensor is allocated in shared memory, as ``default_collate`` allocates
its batches, so what crosses to the main process is its handle; in the main process
(``num_workers=0``) it is pinned when ``pin_memory=True`` and CUDA is there, ready for
``.to(device, non_blocking=True)``.  (From a worker, ``DataLoader(pin_memory=True)`` copies
the batch into pinned memory once, in the main process: :meth:`SampleBatch.pin_memory`;
a worker's shared memory cannot be pinned there.)  Pass ``collate_fn=collate_batch``: the
batch is already one, and ``default_collate`` would take it apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from contextlib import closing
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, TypedDict, Unpack

from .._extras import requires_extra

with requires_extra("torch", "blobsdk.torch"):
    import torch
    from torch.utils.data import Dataset, Sampler, get_worker_info

from .._arguments import wrong
from ..config import ClientConfig, L1Config, L2Config, ReadConfig
from ..read import READAHEAD_BYTES, READAHEAD_DEPTH
from ..runtime import WorkerStats
from . import elastic
from .order import Position, Sharding, check_epoch, check_identity, fingerprint, resolve_paths, resolve_rank
from .reading import Reading, Transform, check_transform, publish, readahead, worker_stats
from .stores import ClosedOnExit, ConfigLike, ProcessClient, Store

# --- the map-style dataset ------------------------------------------------------------------------


class MapOptions(TypedDict, total=False):
    """The keyword arguments of :class:`BlobDataset` (and its ``local``)."""

    transform: Transform | None
    readahead: int
    readahead_bytes: int


class BlobDataset(ClosedOnExit, Dataset[Any]):
    """``dataset[i]`` is ``transform((path, data))`` of the ``i``-th path; a batch of indices
    is read through one readahead.  Order, sharding and resume are the sampler's: use
    :class:`BlobSampler` (or the DataLoader's ``shuffle``/``generator``)."""

    def __init__(
        self,
        config: ConfigLike,
        paths_or_prefix: str | Sequence[str],
        *,
        local: str | os.PathLike[str] | None = None,
        transform: Transform | None = None,
        readahead: int = READAHEAD_DEPTH,
        readahead_bytes: int = READAHEAD_BYTES,
    ) -> None:
        store = Store.of(config, local)
        self._reading = Reading.of(store, readahead, readahead_bytes, None, None)
        self._transform = check_transform(transform)
        self.paths = resolve_paths(store, paths_or_prefix)
        self.fingerprint = fingerprint(self.paths)  # the list's, which a BlobSampler's state names
        self._client = ProcessClient(store)
        self._stats = WorkerStats()  # the workers' clients' counters, for worker_stats()

    @classmethod
    def local(
        cls,
        root: str | os.PathLike[str],
        paths_or_prefix: str | Sequence[str],
        *,
        read: ReadConfig = ReadConfig(),
        l1: L1Config = L1Config(),
        l2: L2Config | None = None,
        **options: Unpack[MapOptions],
    ) -> BlobDataset:
        """Over the embedded store in ``root`` (as :meth:`blobsdk.Client.local`)."""
        return cls(ClientConfig(read=read, l1=l1, l2=l2), paths_or_prefix, local=root, **options)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        path = self.paths[index]
        client = self._client.get()
        data = client.get(path)
        publish(self._stats, client)
        return self._transform((path, data))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch (the DataLoader's fetcher calls this): its reads run concurrently."""
        paths = [self.paths[i] for i in indices]
        client = self._client.get()
        with closing(readahead(client, paths, self._reading)) as reads:
            items = [self._transform(sample) for sample in reads]
        publish(self._stats, client, force=True)  # before the batch reaches the main process
        return items

    def state_dict(self) -> dict[str, object]:
        """The list's identity (the position is the sampler's)."""
        return {"samples": len(self.paths), "fingerprint": self.fingerprint}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Check that ``state`` was saved over this same list (ValueError if not)."""
        check_identity(state, self.state_dict(), type(self).__name__)

    def worker_stats(self) -> dict[str, Any]:
        """The tier counters of the DataLoader workers' clients, see :func:`worker_stats`."""
        return worker_stats(self._stats, self._client)

    def close(self) -> None:
        """Close this process's client (the next read opens a new one); in the process that
        built the dataset, also remove the workers' stats (no longer collected)."""
        self._client.close()
        self._stats.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self.paths)} samples>"


class BlobSampler(elastic.Resumable, Sampler[int]):
    """This rank's indices of ``data_source`` for one epoch: the same permutation and rank cut
    as :class:`BlobIterableDataset` (every index once per epoch over all ranks, rank counts
    within one), with ``set_epoch`` and a ``state_dict`` that ``StatefulDataLoader`` saves and
    restores, so a resumed epoch yields exactly the indices that were left, in order.  Over a
    :class:`BlobDataset` the state names its list's fingerprint, and a resume over another
    list is refused as the iterable refuses it; over any other sized source, only its length."""

    def __init__(
        self, data_source: Sized, *, shuffle: bool = False, seed: int = 0, rank: int | None = None, world_size: int | None = None
    ) -> None:
        if not isinstance(data_source, Sized):
            raise wrong("BlobSampler: data_source", "a dataset with a len (a BlobDataset)", data_source)
        rank, world_size = resolve_rank(rank, world_size)
        self._sharding = Sharding(len(data_source), shuffle, seed, rank, world_size)
        self._listed = {"fingerprint": data_source.fingerprint} if isinstance(data_source, BlobDataset) else {}
        self.epoch = 0
        self._pending: Position | None = None
        self._current: Position | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iterations run; a loaded position stays if ``epoch`` is its epoch."""
        self.epoch = check_epoch(epoch)
        self._current = None
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None

    def __len__(self) -> int:
        """This rank's indices per epoch: in an epoch resumed in another shape, its share of
        what was left."""
        position = self._pending or self._current
        return elastic.count(self._sharding, position) if position is not None else self._sharding.count()

    def __iter__(self) -> Iterator[int]:
        if self._pending is None:
            self._current = None  # a whole epoch starts
        return self._indices()

    def _indices(self) -> Iterator[int]:
        # A loaded position is taken at the first index, not when the iterator is made (a
        # DataLoader with workers makes one that it drops before the one it reads).
        position = self._current = self._pending or Position(self.epoch)
        self._pending = None
        indices = elastic.indices(self._sharding, position)
        for i in range(position.yielded, len(indices)):
            position.yielded = i + 1
            yield indices[i]

    def state_dict(self) -> dict[str, object]:
        position = self._pending or self._current or Position(self.epoch)
        return {**self._identity(), **elastic.position_state(position)}

    def load_state_dict(self, state: Mapping[str, object] | Sequence[Mapping[str, object]]) -> None:
        """Resume where ``state`` was taken (by this same rank); or, given the states of every
        rank of a job of any world size, resume its epoch with this rank's share of what was left."""
        what, identity = type(self).__name__, self._identity()
        self._check_listed(state)
        if not elastic.is_states(state):
            self._pending = elastic.restore_one(state, identity, what, self._sharding, (0, 1))
            return
        epoch, consumed = elastic.gather(state, elastic.shared(identity), what, self._sharding.samples, by_worker=False)
        self._pending = Position(epoch, consumed=consumed)

    def _identity(self) -> dict[str, object]:
        """What a saved state must match: the sharding's keys, and the list's fingerprint over a BlobDataset."""
        return {**self._sharding.identity(), **self._listed}

    def _check_listed(self, state: object) -> None:
        """Refuse, over a BlobDataset, a state that names no list (saved over another sized
        source, or before the sampler's state named its list): it cannot show it was saved over
        this one, and resumed over another it would skip samples."""
        if not self._listed:
            return
        for one in state if isinstance(state, Sequence) and elastic.is_states(state) else [state]:
            if isinstance(one, Mapping) and "fingerprint" not in one:
                raise ValueError(
                    f"cannot resume: the state names no list (it has no fingerprint), this {type(self).__name__}"
                    f" has fingerprint={self._listed['fingerprint']!r}; if it was saved over this same list,"
                    " add that fingerprint to it"
                )


# --- a batch read into one tensor -----------------------------------------------------------------


@dataclass(frozen=True)
class SampleBatch:
    """A batch's samples back to back in ``data`` (a uint8 tensor): sample ``i`` is
    ``paths[i]``, ``sizes[i]`` bytes from ``offsets[i]``; ``batch[i]`` is its view (no copy)."""

    paths: list[str]
    sizes: list[int]
    data: torch.Tensor

    @property
    def offsets(self) -> list[int]:
        """Where each sample begins in ``data``, and its length last."""
        return list(accumulate(self.sizes, initial=0))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        i = range(len(self.sizes))[i]  # IndexError past either end; a negative one counts from the end
        start = sum(self.sizes[:i])
        return self.data[start : start + self.sizes[i]]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(path, view)`` for each sample, in order."""
        for path, start, size in zip(self.paths, self.offsets, self.sizes, strict=False):
            yield path, self.data[start : start + size]

    def pin_memory(self, device: object = None) -> SampleBatch:
        """This batch in pinned memory (one copy; itself if it is pinned already): what
        ``DataLoader(pin_memory=True)`` calls in the main process for a worker's batch."""
        if self.data.is_pinned():
            return self
        return SampleBatch(self.paths, self.sizes, self.data.pin_memory())


def collate_batch(batch: Any) -> Any:
    """The DataLoader's ``collate_fn`` for :class:`BlobBatchDataset`: its batch (a
    SampleBatch, or what its ``transform`` made of one) is already whole, and kept as is."""
    return batch


class BlobBatchDataset(BlobDataset):
    """Batches read straight into one tensor each (see the module docstring): ``dataset[i]``
    is a SampleBatch of one; a DataLoader's batch (``__getitems__``) one of them all, read at
    once.  Use with ``collate_fn=collate_batch``.  ``transform`` (if given) is applied to each
    SampleBatch, in the worker: a decode that reads the bytes where they are."""

    def __init__(
        self,
        config: ConfigLike,
        paths_or_prefix: str | Sequence[str],
        *,
        local: str | os.PathLike[str] | None = None,
        transform: Callable[[SampleBatch], Any] | None = None,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(config, paths_or_prefix, local=local)
        if not callable(transform) and transform is not None:
            raise TypeError(f"transform must be callable or None, not {type(transform).__name__}")
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory must be a bool, not {type(pin_memory).__name__}")
        self._batch_transform = transform
        self.pin_memory = pin_memory

    @classmethod
    def local(  # type: ignore[override]  # its own options
        cls,
        root: str | os.PathLike[str],
        paths_or_prefix: str | Sequence[str],
        *,
        read: ReadConfig = ReadConfig(),
        l1: L1Config = L1Config(),
        l2: L2Config | None = None,
        transform: Callable[[SampleBatch], Any] | None = None,
        pin_memory: bool = False,
    ) -> BlobBatchDataset:
        """Over the embedded store in ``root`` (as :meth:`blobsdk.Client.local`)."""
        config = ClientConfig(read=read, l1=l1, l2=l2)
        return cls(config, paths_or_prefix, local=root, transform=transform, pin_memory=pin_memory)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """One SampleBatch of these samples (its ``transform``), read by one ``get_many_into``
        into a tensor made for their total size (see :meth:`_allocate`)."""
        paths = [self.paths[i] for i in indices]
        client = self._client.get()
        allocated: list[torch.Tensor] = []
        sizes = client.get_many_into(paths, lambda total: _keep(allocated, self._allocate(total)))
        publish(self._stats, client, force=True)  # before the batch reaches the main process
        batch = SampleBatch(paths, sizes, allocated[-1])
        return batch if self._batch_transform is None else self._batch_transform(batch)

    def _allocate(self, total: int) -> torch.Tensor:
        """A batch's tensor: in shared memory in a DataLoader worker (it crosses to the main
        process as a handle), pinned in the main process if asked and CUDA is there, else plain."""
        if get_worker_info() is not None:
            return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(total))  # type: ignore[no-untyped-call]
        pinned = self.pin_memory and torch.cuda.is_available()
        return torch.empty(total, dtype=torch.uint8, pin_memory=pinned)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self.paths)} samples>"


def _keep(made: list[torch.Tensor], tensor: torch.Tensor) -> torch.Tensor:
    made.append(tensor)
    return tensor
