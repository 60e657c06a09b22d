"""What blobsdk's DLIO plugins (blobsdk/dlio.py) do, without DLIO: which blob a file DLIO
names is, reading it through this process's client, and a checkpoint's states saved and
loaded as DCP checkpoints.  Kept apart from the DLIO subclasses so it is tested without DLIO,
TensorFlow or MPI, and so the subclasses stay thin across DLIO's releases.

**Where things are.**  DLIO lists its data folder on the local disk, so the files it lists
exist there (empty stand-ins named like the blobs will do); the sample of the file
``{data_folder}/{rel}`` is the blob ``{prefix}/{rel}``.  A checkpoint DLIO names ``suffix``
(``model-0-10-0``: what, epoch, step, rank) is the DCP checkpoint under
``{prefix}/checkpoints/{suffix}``.

**The settings** come from the environment, read once by :meth:`DlioSettings.from_env` (DLIO's
own config has no place for them): ``BLOBSDK_DLIO_PREFIX`` (required), and the store:
``BLOBSDK_DLIO_LOCAL`` (an embedded store's directory) or else ``ClientConfig.from_env``
(``BLOBSDK_CONFIG``, a client.toml).  Forked DataLoader workers and MPI ranks inherit them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import posixpath
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._arguments import check_str
from ..chunks import validate_path
from ..config import ClientConfig
from .stores import ProcessClient, Store

CHECKPOINTS = "checkpoints"  # under the prefix: the DCP checkpoints, one prefix per DLIO checkpoint name


@dataclass(frozen=True)
class DlioSettings:
    """Where DLIO's samples and checkpoints are, and how to open the store."""

    store: Store
    prefix: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DlioSettings:
        env = os.environ if environ is None else environ
        prefix = env.get("BLOBSDK_DLIO_PREFIX", "")
        if not prefix:
            raise ValueError("set BLOBSDK_DLIO_PREFIX to the blob prefix of DLIO's data folder (e.g. /bucket/dlio)")
        local = env.get("BLOBSDK_DLIO_LOCAL") or None
        config = ClientConfig() if local is not None else ClientConfig.from_env(dict(env))
        return cls(Store.of(config, local), _prefix(prefix))


def _prefix(prefix: str) -> str:
    """``prefix`` without its trailing ``/``, once checked as a blob path's start."""
    check_str("prefix", prefix)
    stripped = prefix.rstrip("/")
    validate_path(f"{stripped}/x")  # ValueError from the path rules: no bucket, "..", ...
    return stripped


class SampleFiles:
    """DLIO's sample files, read whole as the blobs they stand for, through this process's
    client (opened on first use, also in a forked DataLoader worker).

    A read may name the files expected next (``ahead``): their reads start at once, on up to
    ``threads`` threads, and a later read of one takes its result.  A guess that never comes
    is dropped once ``max_pending`` guesses wait (its read cancelled, or its bytes let go)."""

    def __init__(
        self, settings: DlioSettings, data_folder: str | os.PathLike[str], *, threads: int = 16, max_pending: int = 64
    ) -> None:
        self.settings = settings
        self.data_folder = os.path.abspath(os.fspath(data_folder))
        self._client = ProcessClient(settings.store)
        self._threads, self._max_pending = threads, max_pending
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # with the pid that made it: a fork makes its own
        self._pending: dict[str, Future[bytearray]] = {}  # in insertion order: the oldest guess first
        self.bytes_read = 0
        self.files_read = 0

    def blob_path(self, filename: str | os.PathLike[str]) -> str:
        """The blob of a file DLIO listed under its data folder; a ValueError for any other
        file (DLIO's list is read from a local folder anyone may write)."""
        path = os.path.abspath(os.fspath(filename))
        rel = os.path.relpath(path, self.data_folder)
        if rel == "." or rel.startswith(("..", os.sep)):
            raise ValueError(f"{filename!s} is not under DLIO's data folder {self.data_folder}")
        blob = f"{self.settings.prefix}/{posixpath.join(*rel.split(os.sep))}"
        validate_path(blob)
        return blob

    def read(self, filename: str | os.PathLike[str], ahead: Sequence[str | os.PathLike[str]] = ()) -> bytearray:
        """The whole sample file, its bytes counted (DLIO's own figure is samples/s times
        the configured record size, whatever was read); the reads of ``ahead`` start first."""
        path = self.blob_path(filename)
        paths = [self.blob_path(name) for name in ahead]
        self._start([p for p in paths if p != path])
        pending = self._pending.pop(path, None)
        data = pending.result() if pending is not None else self._client.get().get(path)
        self.bytes_read += len(data)
        self.files_read += 1
        return data

    def _start(self, paths: list[str]) -> None:
        client = self._client.get()
        for path in paths:
            if path not in self._pending:
                self._pending[path] = self._executor().submit(client.get, path)
        while len(self._pending) > self._max_pending:
            self._pending.pop(next(iter(self._pending))).cancel()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool[0] != os.getpid():
            self._pool = (os.getpid(), ThreadPoolExecutor(self._threads, thread_name_prefix="blobsdk-dlio"))
        return self._pool[1]

    def close(self) -> None:
        pool, self._pool, self._pending = self._pool, None, {}
        if pool is not None and pool[0] == os.getpid():
            pool[1].shutdown(wait=True, cancel_futures=True)
        self._client.close()


def dlio_order(rank: int, ranks: int, samples: int, seed: int | None) -> list[int]:
    """The samples a rank's DLIO sampler hands out, in order: the rank's contiguous share of
    ``range(samples)``, shuffled by a legacy numpy ``RandomState(seed)`` (None: not shuffled),
    as DLIO's ``dlio_sampler`` does each epoch."""
    per_rank = -(-samples // ranks)
    order = list(range(rank * per_rank, (rank + 1) * per_rank))
    if seed is not None:
        import numpy as np

        np.random.RandomState(seed).shuffle(order)
    return order


def worker_batches(order: Sequence[int], batch: int, workers: int, worker: int) -> list[list[int]]:
    """The batches one DataLoader worker reads, in order: a DataLoader hands batch ``k`` (of
    ``batch`` samples, the last partial one dropped) to worker ``k % workers``."""
    whole = len(order) // batch
    return [list(order[k * batch : (k + 1) * batch]) for k in range(worker, whole, max(workers, 1))]


class Lookahead:
    """Which samples a worker reads next, from its predicted batches: after sample ``i``, the
    rest of its batch and the whole next one.  A read the prediction did not expect turns it
    off (the harness orders its samples some other way): guesses cost reads, never results."""

    def __init__(self, batches: list[list[int]]) -> None:
        self._flat = [i for batch in batches for i in batch]
        self._ends = list(itertools.accumulate(len(batch) for batch in batches))
        self._at = {index: position for position, index in enumerate(self._flat)}
        self._next = 0  # the position expected next
        self.on = bool(self._flat)

    def after(self, index: int) -> list[int]:
        position = self._at.get(index) if self.on else None
        if position is None or position != self._next % len(self._flat):
            self.on = False
            return []
        self._next = position + 1
        end = next((e for e in self._ends if e > position), len(self._flat))  # this batch's end
        end = next((e for e in self._ends if e > end), len(self._flat))  # and the next one's
        return self._flat[position + 1 : end]


class CheckpointStates:
    """DLIO's checkpoints as DCP checkpoints through blobsdk's DCP writer and reader
    (:mod:`blobsdk.dcp`), each name its own prefix: ``save`` is ``dcp.save`` in this process,
    without a process group (each MPI rank saves its own state)."""

    def __init__(self, settings: DlioSettings) -> None:
        self.settings = settings

    def prefix(self, name: str) -> str:
        check_str("name", name)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"a checkpoint name is one path segment: got {name!r}")
        return f"{self.settings.prefix}/{CHECKPOINTS}/{name}"

    def save(self, name: str, state: dict[str, Any]) -> int:
        """Save ``state`` (tensors, nested dicts of them) as a DCP checkpoint; the bytes of
        its tensors."""
        from torch.distributed.checkpoint.state_dict_saver import save

        from .dcpstorage import BlobStorageWriter

        store = self.settings.store
        with BlobStorageWriter(store.config, self.prefix(name), local=store.local) as writer, _alone():
            save(state, storage_writer=writer, no_dist=True)
        return tensor_bytes(state)

    def load(self, name: str, state: dict[str, Any]) -> int:
        """Load the latest DCP checkpoint ``name`` into ``state``'s tensors, in place; the
        bytes of its tensors."""
        from torch.distributed.checkpoint.state_dict_loader import load

        from .dcpstorage import BlobStorageReader

        store = self.settings.store
        with BlobStorageReader(store.config, self.prefix(name), local=store.local) as reader, _alone():
            load(state, storage_reader=reader, no_dist=True)
        return tensor_bytes(state)


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    """Without DCP's warning that it saves or loads in this process alone: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def tensor_bytes(state: object) -> int:
    """The bytes of every tensor in a (nested) state dict."""
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    nbytes = getattr(state, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else 0
