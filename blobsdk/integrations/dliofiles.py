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
import os
import posixpath
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._arguments import check_str
from ..config import ClientConfig
from ..paths import validate_path
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
    client (opened on first use, also in a forked DataLoader worker)."""

    def __init__(self, settings: DlioSettings, data_folder: str | os.PathLike[str]) -> None:
        self.settings = settings
        self.data_folder = os.path.abspath(os.fspath(data_folder))
        self._client = ProcessClient(settings.store)
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

    def read(self, filename: str | os.PathLike[str]) -> bytearray:
        """The whole sample file, its bytes counted (DLIO's own figure is samples/s times
        the configured record size, whatever was read)."""
        data = self._client.get().get(self.blob_path(filename))
        self.bytes_read += len(data)
        self.files_read += 1
        return data

    def close(self) -> None:
        self._client.close()


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

        from ..dcp import BlobStorageWriter

        store = self.settings.store
        with BlobStorageWriter(store.config, self.prefix(name), local=store.local) as writer, _alone():
            save(state, storage_writer=writer, no_dist=True)
        return tensor_bytes(state)

    def load(self, name: str, state: dict[str, Any]) -> int:
        """Load the latest DCP checkpoint ``name`` into ``state``'s tensors, in place; the
        bytes of its tensors."""
        from torch.distributed.checkpoint.state_dict_loader import load

        from ..dcp import BlobStorageReader

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
