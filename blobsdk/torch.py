"""PyTorch datasets over blobs: sharded, shuffled, resumable, read ahead and prefetched.

``BlobIterableDataset(config, paths_or_prefix, ...)`` and ``BlobDataset(config, ...)`` (map-style)
are built like the client: ``config`` is a :class:`~blobsdk.ClientConfig` or a ``client.toml``
path, and ``X.local(dir, paths_or_prefix, ...)`` is the embedded store.  ``paths_or_prefix`` is a
list of blob paths (kept in its order) or a prefix ending in ``/``, listed once, sorted, when the
dataset is built, so every worker and rank works on the same list.  An item is
``transform((path, data))``, by default that pair itself.  ``BlobBatchDataset`` (map-style too)
reads each DataLoader batch straight into one tensor instead (``get_many_into``: no buffer per
sample, no collate copy); it, ``BlobDataset`` and ``BlobSampler`` live in
blobsdk/integrations/mapstyle.py, which says how.

**Data is a bytearray**, the client's own buffer: no copy, and writable, so
``torch.frombuffer(data, dtype=torch.uint8)`` and ``numpy.frombuffer`` need no copy and raise no
read-only warning.  ``default_collate`` treats a bytearray as a sequence of ints, so batch raw
items with a ``collate_fn`` (``collate_fn=list`` keeps them as they are) or decode them in
``transform``.

**Which samples, in which order.** One epoch is a permutation of the whole list (``shuffle``,
a pure function of ``(seed, epoch)``; else the list order), cut into ranks by stride (rank ``r``
of ``W`` takes positions ``r, r+W, ...``, so rank counts differ by at most one), and each rank's
share into its DataLoader workers the same way.  Every sample is read exactly once per epoch
across all ranks and workers.  ``rank``/``world_size`` default to ``torch.distributed`` when it
is initialised, else the ``RANK``/``WORLD_SIZE`` environment variables, else 0 and 1 (read
once, when the dataset is built).  For the map-style dataset the order is the sampler's:
:class:`BlobSampler` does the same permutation and rank cut (the DataLoader spreads its
indices over the workers).

**Epochs.** ``set_epoch(e)`` is called on the dataset in the main process.  The epoch lives in
a one-integer shared-memory tensor that the workers' copies share (fork and spawn alike), so
it reaches workers that are re-created each epoch and ``persistent_workers=True`` ones too.  A
plain ``pickle`` copy gets its own epoch.

**Resume.** ``state_dict()``/``load_state_dict()`` follow torchdata's ``StatefulDataLoader``,
which snapshots each worker's copy of an iterable dataset (every ``snapshot_every_n_steps``
batches) and restores it in the new worker of the same id before that worker's iterator is
made, then resumes the workers' round robin where it stopped: a worker's state is its epoch
and how many of its own samples it has handed out, so a resumed epoch yields exactly the
samples that were left, in the same order.  The state also names the seed, the shuffle, the
rank, the worker and the list (its length and xxh3-64 fingerprint): restoring it anywhere else
is a ValueError, not a silently different epoch.  It restores the epoch it was saved in.
:class:`BlobSampler` keeps the same state for the map-style dataset (torchdata saves a
sampler's state with each batch it hands out), and names its list's fingerprint when built
over a ``BlobDataset`` (whose own state is only that fingerprint, checked on resume).

**Elastic resume.** A job restarted in another shape (ranks or DataLoader workers) finishes the
epoch it stopped in, each of its samples exactly once.  ``DataState(loader)`` (this rank's
``StatefulDataLoader`` over a BlobIterableDataset or with a BlobSampler) is ``Stateful``:
``dcp.save({"model": ..., "data": DataState(loader)})`` on every rank saves all ranks' data
states once (gathered into one value, the same on every rank), and ``dcp.load`` of that dict in
a job of any shape, before its loaders run, resumes each rank's share; in a blobsdk checkpoint,
save ``data_state.state_dict()``, load it back with ``data_state.load_state_dict``.  By hand:
each new rank passes ``load_state_dict`` the list of all old ranks' sampler states, or all old
workers' for the iterable (in any order; in the main process, before the DataLoader is made),
which ``gather_states(states_of(loader.state_dict()))`` collects on every old rank as of the
last batch delivered (the live sampler and dataset run ahead).  What is left is the epoch's order
minus the first ``yielded`` of each old (rank, worker)'s share, cut by the new shape as a whole
epoch; ``set_epoch`` of that epoch keeps the resume, of another goes on with whole epochs.  A
state of a resumed epoch carries ``consumed``, counts of the shapes before
(blobsdk/integrations/elastic.py): it resumes in place, or in yet another shape.  Refused,
naming what differs: another list, seed or shuffle, different epochs, a missing or doubled rank
or worker, a count out of range.  A job that saves its data state every N steps and loses a
rank re-reads, after its restart, at most N steps' batches per rank, and skips nothing.

**Reading.** Each process opens its own :class:`~blobsdk.SyncClient`, never one inherited over
a fork nor pickled (the datasets keep the config, not a client), on first use, and keeps it
from epoch to epoch (its L1, plan cache, connections and the next epoch's readahead outlive an
epoch); it is closed by ``close()``, when the dataset is garbage-collected, or when the process
exits (DataLoader workers included).  Ending or abandoning an iteration
cancels its reads and prefetches.  The iterable reads its samples through
``SyncClient.readahead`` (``readahead`` reads and ``readahead_bytes`` bytes in flight ahead of
the consumer) and deep-prefetches its own next window of ``prefetch_window`` samples into
``prefetch_tier`` ("auto": L3 if the store has it, else L2, else L1): entering window ``k`` starts
the prefetch of window ``k+1`` (the first window entered: of ``k`` too, racing the readahead's
first reads) and cancels those of windows before ``k``; stopping cancels the rest.  Handing out
its last sample, an iteration starts the readahead of the one likely next in this process (the
next epoch when shuffled, else the same order), which that one takes over if the guess was
right: a persistent worker reads an epoch's first batch in its idle time.  The
map-style dataset reads one sample per ``__getitem__``, and a whole batch through one readahead
when the DataLoader asks for batches (``__getitems__``); deep prefetch needs to know the order
ahead, so it is the iterable's job.

**Workers' stats.** ``dataset.worker_stats()``, in the main process, gives the tier counters
(hits, misses, bytes, corrupt, errors) of each DataLoader worker's client, as it last published
them, of the main process's own client, and their total: workers publish into a small shared
file the dataset made (blobsdk/runtime/workerstats.py), at most every 0.5 s while reading, the iterable
at the last sample of its epoch and the map-style after each batch (a client's ``stats()``
takes ~1 ms on this machine, loaded).  Counters are cumulative across epochs, for re-created
workers too.  ``close()`` in the main process removes that file: workers' stats are then no
longer collected.

Figures measured on this machine (2 cores), for 1M paths: the fingerprint ~20 ms when the
dataset is built; the permutation and one worker's shard ~40 ms per epoch and worker; validating
a caller's list ~0.6 s (a listed prefix is valid already).  For 10M paths, elastic resume:
a state is ~100-150 B pickled, ~0.3-0.4 KB once resumed from 8 ranks of 8 workers, ~1.7 KB
from 64 of 8 (a count per old worker, whatever the list's length; JSON about twice that); all
384 workers' states of a 48x8 job ~0.65 MB, a 48-rank sampler's ~16 KB; gathering 512 states
~3 ms; a worker's share of a resumed epoch ~0.45-0.8 s, of a whole epoch ~0.3-0.5 s (loaded
machine).  ``PREFETCH_WINDOW`` = 4096 samples is hand-set, not measured (DESIGN's example):
each worker has at most two windows in flight, one hydrate job per L3 node each, so a node
runs at most two jobs per worker.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from typing import Any, TypedDict, Unpack

from ._extras import requires_extra

with requires_extra("torch", __name__):
    import torch
    from torch.utils.data import IterableDataset

from .config import ClientConfig, L1Config, L2Config, ReadConfig
from .dcp import BlobStorageReader as BlobStorageReader  # PyTorch Distributed Checkpoint storage, re-exported
from .dcp import BlobStorageWriter as BlobStorageWriter
from .integrations import (
    Ahead,
    ClosedOnExit,
    ConfigLike,
    Iteration,
    Position,
    ProcessClient,
    Reading,
    Sharding,
    Store,
    Transform,
    WindowPrefetch,
    check_epoch,
    check_transform,
    current_worker,
    elastic,
    fingerprint,
    publish,
    readahead,
    resolve_paths,
    resolve_rank,
    worker_stats,
)
from .integrations import BlobBatchDataset as BlobBatchDataset  # the map-style datasets, and their sampler
from .integrations import BlobDataset as BlobDataset
from .integrations import BlobSampler as BlobSampler
from .integrations import DataState as DataState  # the data state of a DCP save or a checkpoint
from .integrations import SampleBatch as SampleBatch
from .integrations import collate_batch as collate_batch
from .integrations import gather_states as gather_states  # every rank's states, through torch.distributed
from .integrations import states_of as states_of  # the states a StatefulDataLoader saved
from .read import READAHEAD_BYTES, READAHEAD_DEPTH
from .runtime import Held, WorkerStats
from .sync import SyncClient, SyncReadahead

# Imported here, in the process that builds the dataset, not first in a forked DataLoader
# worker: CPython 3.11's import lock can fail in a child forked while other threads run
# (KeyError in importlib's _ModuleLock.acquire, seen as "worker exited unexpectedly").  torch's
# workers import numpy.random to seed it (when numpy is there); a worker's client imports the
# store backends, each through its face (which loads it on first use).
_IMPORTED_BEFORE_FORK = ("numpy.random",)
_BACKENDS_BEFORE_FORK = (
    ("blobsdk.metadata", "HttpMetadataStore"),
    ("blobsdk.metadata", "SqliteMetadataStore"),
    ("blobsdk.sources", "HttpBlockStore"),
    ("blobsdk.sources", "LocalBlockStore"),
    ("blobsdk.sources", "ReplicatedBlockStore"),
)
for _module in _IMPORTED_BEFORE_FORK:
    with contextlib.suppress(ImportError):
        importlib.import_module(_module)
for _face, _backend in _BACKENDS_BEFORE_FORK:
    with contextlib.suppress(ImportError):
        getattr(importlib.import_module(_face), _backend)


PREFETCH_WINDOW = 4096  # samples per deep-prefetch window (see the module docstring)


# --- the iterable dataset ------------------------------------------------------------------------


class IterableOptions(TypedDict, total=False):
    """The keyword arguments of :class:`BlobIterableDataset` (and its ``local``)."""

    transform: Transform | None
    shuffle: bool
    seed: int
    rank: int | None
    world_size: int | None
    readahead: int
    readahead_bytes: int
    prefetch_window: int | None
    prefetch_tier: str | None


class BlobIterableDataset(ClosedOnExit, elastic.Resumable, IterableDataset[Any]):
    """Every sample of ``paths_or_prefix`` once per epoch, sharded over ranks and DataLoader
    workers, read ahead and deep-prefetched in each worker; see the module docstring."""

    def __init__(
        self,
        config: ConfigLike,
        paths_or_prefix: str | Sequence[str],
        *,
        local: str | os.PathLike[str] | None = None,
        transform: Transform | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        readahead: int = READAHEAD_DEPTH,
        readahead_bytes: int = READAHEAD_BYTES,
        prefetch_window: int | None = PREFETCH_WINDOW,
        prefetch_tier: str | None = "auto",
    ) -> None:
        self._store = Store.of(config, local)
        self._reading = Reading.of(self._store, readahead, readahead_bytes, prefetch_window, prefetch_tier)
        self._transform = check_transform(transform)
        rank, world_size = resolve_rank(rank, world_size)
        self.paths = resolve_paths(self._store, paths_or_prefix)
        self._sharding = Sharding(len(self.paths), shuffle, seed, rank, world_size)
        self._fingerprint = fingerprint(self.paths)
        # One int in shared memory: the workers' copies (forked or spawned) share it.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self._pending: Position | None = None  # loaded by load_state_dict, taken by the next __iter__
        self._resumed: Position | None = None  # an epoch resumed in another shape, for every worker
        self._current: Iteration | None = None  # this process's latest iteration
        self._ahead: Held[Ahead] = Held()  # the next iteration's readahead, started by this one
        # One client per process, kept from epoch to epoch: its L1, plan cache and connections
        # outlive an epoch.
        self._client = ProcessClient(self._store)
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
        **options: Unpack[IterableOptions],
    ) -> BlobIterableDataset:
        """Over the embedded store in ``root`` (as :meth:`blobsdk.Client.local`)."""
        return cls(ClientConfig(read=read, l1=l1, l2=l2), paths_or_prefix, local=root, **options)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iterations run (in the main process; a resumed epoch stays resumed)."""
        self._epoch.fill_(check_epoch(epoch))
        resumed, self._current = self._resumed, None
        if resumed is not None and resumed.epoch != epoch:
            self._resumed = None

    def __len__(self) -> int:
        """This rank's samples per epoch (all its workers together): in an epoch resumed in
        another shape, its share of what was left."""
        resumed = self._resumed
        return self._sharding.count() if resumed is None else elastic.count(self._sharding, resumed)

    def __iter__(self) -> Iterator[Any]:
        worker = current_worker()
        position = self._take_pending(worker) or self._take_resumed(worker) or Position(self.epoch, worker=worker)
        indices = elastic.indices(self._sharding, position)
        self._current = Iteration(position, [self.paths[i] for i in indices])
        return self._samples(self._current)

    def _take_resumed(self, worker: tuple[int, int]) -> Position | None:
        """This worker's start in the epoch resumed in another shape, if it is still running
        (taken once per process: the process's next iteration runs a whole epoch)."""
        resumed, self._resumed = self._resumed, None
        if resumed is None or resumed.epoch != self.epoch:
            return None
        return Position(resumed.epoch, 0, worker, resumed.consumed)

    def _take_pending(self, worker: tuple[int, int]) -> Position | None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.worker != worker:
            saved, here = pending.worker, worker
            raise ValueError(
                f"cannot resume: the state was loaded in DataLoader worker {saved[0]} of {saved[1]} and is iterated"
                f" in worker {here[0]} of {here[1]} (load each worker's state in that worker, as StatefulDataLoader does)"
            )
        return pending

    def _samples(self, it: Iteration) -> Iterator[Any]:
        reading = self._reading
        client = self._client.get()
        reads = self._take_ahead(it) or readahead(client, it.paths[it.position.yielded :], reading)
        last = len(it.paths) - 1
        with WindowPrefetch(client, it.paths, reading.prefetch_window, reading.prefetch_tier) as prefetch, closing(reads):
            for position, sample in enumerate(reads, start=it.position.yielded):
                prefetch.enter(position)
                publish(self._stats, client, force=position == last)  # all of this epoch's reads, at its last sample
                if position == last:
                    self._read_next_ahead(client, it.position)
                item = self._transform(sample)
                it.position.yielded = position + 1
                yield item

    def _read_next_ahead(self, client: SyncClient, position: Position) -> None:
        """Start the readahead of the iteration that likely comes next in this process (the
        next epoch when shuffled, else the same order again) while this one hands its last
        samples out: a worker's first batch of an epoch is then read in its idle time."""
        self._close_ahead()
        epoch = position.epoch + 1 if self._sharding.shuffle else position.epoch
        paths = [self.paths[i] for i in self._sharding.indices(epoch, *position.worker)]
        if paths:
            self._ahead.put(Ahead(paths, readahead(client, paths, self._reading)))

    def _take_ahead(self, it: Iteration) -> SyncReadahead | None:
        """The readahead started for ``it`` by the iteration before, if it guessed right."""
        ahead = self._ahead.take()
        if ahead is None or not ahead.finalizer.still_active():
            return None  # none in this process (a parent's is set aside), or closed at exit
        ahead.finalizer.cancel()
        if it.position.yielded == 0 and ahead.paths == it.paths:
            return ahead.reads
        ahead.reads.close()
        return None

    def _close_ahead(self) -> None:
        ahead = self._ahead.take()
        if ahead is not None:
            ahead.finalizer()

    def state_dict(self) -> dict[str, object]:
        """This process's (worker's) position: the running or last iteration's, else where the
        next one starts."""
        it, worker, resumed = self._current, current_worker(), self._resumed
        if self._pending is not None:
            position = self._pending
        elif it is not None:
            position = it.position
        elif resumed is not None:
            position = Position(resumed.epoch, 0, worker, resumed.consumed)
        else:
            position = Position(self.epoch, worker=worker)
        return {**self._identity(position.worker), **elastic.position_state(position)}

    def load_state_dict(self, state: Mapping[str, object] | Sequence[Mapping[str, object]]) -> None:
        """Make the next iteration in this process resume where ``state`` was taken; or, given
        the states of every worker of every rank of a job (of any shape), in the main process
        before the DataLoader is made, make this rank's workers share what they left: each
        process's first iteration of that epoch, until ``set_epoch`` to another."""
        if not elastic.is_states(state):
            worker = current_worker()
            self._pending = elastic.restore_one(state, self._identity(worker), type(self).__name__, self._sharding, worker)
            self._resumed = None  # this state says where this worker is
            return
        shared = elastic.shared(self._identity((0, 1)))
        epoch, consumed = elastic.gather(state, shared, type(self).__name__, self._sharding.samples, by_worker=True)
        self._epoch.fill_(epoch)
        self._current, self._pending, self._resumed = None, None, Position(epoch, consumed=consumed)

    def _identity(self, worker: tuple[int, int]) -> dict[str, object]:
        identity = {**self._sharding.identity(), "fingerprint": self._fingerprint}
        return {**identity, "worker": worker[0], "workers": worker[1]}

    def worker_stats(self) -> dict[str, Any]:
        """The tier counters of the DataLoader workers' clients, see :func:`worker_stats`."""
        return worker_stats(self._stats, self._client)

    def close(self) -> None:
        """Close this process's client (the next iteration opens another); in the process
        that built the dataset, also remove the workers' stats (no longer collected)."""
        self._close_ahead()
        self._client.close()
        self._stats.close()

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_current": None}  # it belongs to this process (and _ahead pickles empty)

    def __repr__(self) -> str:
        s = self._sharding
        return f"<{type(self).__name__} {s.samples} samples, rank {s.rank} of {s.world_size}, epoch {self.epoch}>"
