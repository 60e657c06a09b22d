"""The DCP storage of :mod:`blobsdk.dcp` (which says what it does): a writer and a reader over
blobsdk's delta checkpoints.  A module of the integrations package, so the DLIO plugins'
checkpoints (dliofiles.py) reach it inside the package, not through the public module above."""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, NamedTuple

from .._arguments import check_str
from .._extras import requires_extra

with requires_extra("torch", "blobsdk.dcp"):  # the module users import
    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint import metadata as _dcp_metadata
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
    from torch.distributed.checkpoint.planner import (
        LoadItemType,
        LoadPlan,
        LoadPlanner,
        ReadItem,
        SavePlan,
        SavePlanner,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
    from torch.futures import Future

from ..config import ClientConfig
from ..errors import CorruptData
from ..sync import SyncCheckpoints
from ..write import Entry, Part, problem
from .stores import ClosedOnExit, ConfigLike, ProcessClient, Store

_METADATA = "metadata"  # DCP's Metadata, pickled, in the checkpoint state
_ITEMS = "items"  # the write items, by storage key


# Every global a DCP metadata pickle of DCP's own planners holds, and nothing else: DCP's
# metadata classes, torch.Size, torch's dtypes, layouts and memory formats (a layout pickles
# through torch.serialization._get_layout, which only looks its name up).  Resolved here, so
# the unpickler never imports a module or calls a function the pickle names.
_METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("torch.distributed.checkpoint.metadata", name): getattr(_dcp_metadata, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
        if hasattr(_dcp_metadata, name)  # a torch without one never pickles it
    },
    ("torch", "Size"): torch.Size,
    **{
        ("torch.serialization", name): getattr(torch.serialization, name)
        for name in ("_get_layout",)
        if hasattr(torch.serialization, name)  # private: a torch without it pickles layouts otherwise
    },
    **{
        ("torch", name): value
        for name, value in vars(torch).items()
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format))
    },
}


class _RefusedGlobal(Exception):
    pass


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP metadata pickle, refusing any global outside ``_METADATA_GLOBALS`` before
    it is looked up: a pickle can only call or build what it names, so nothing else runs."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _METADATA_GLOBALS[module, name]
        except KeyError:
            raise _RefusedGlobal(f"{module}.{name}") from None


def _unpickle_metadata(data: bytes, where: str) -> object:
    """The DCP metadata pickle ``data`` of ``where`` (a checkpoint another writer of the bucket
    may have written), unpickled through the allowlist; anything else is ``CorruptData``."""
    try:
        return _MetadataUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as exc:
        raise CorruptData(
            f"{where}: its DCP metadata names {exc}, which DCP metadata never holds: refused, not unpickled"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a malformed pickle raises anything: truncated, a bad opcode, a bad argument
        raise CorruptData(f"{where}: its DCP metadata does not unpickle: {exc}") from None


class _Backend(ClosedOnExit):
    """The checkpoints under ``prefix`` of one store, opened on first use in each process."""

    def __init__(
        self,
        config: ConfigLike,
        prefix: str,
        *,
        local: str | os.PathLike[str] | None = None,
        keep: int = 3,
        chunk_size: int | None = None,
    ) -> None:
        self._store = Store.of(config, local)
        check_str("prefix", prefix)  # the rest of it, keep and chunk_size: as Client.checkpoints checks them, on first use
        self.prefix, self.keep, self.chunk_size = prefix, keep, chunk_size
        self._client = ProcessClient(self._store)
        self.step: int | None = None

    def checkpoints(self) -> SyncCheckpoints:
        return self._client.get().checkpoints(self.prefix, keep=self.keep, chunk_size=self.chunk_size)

    def close(self) -> None:
        self._client.close()

    def reset(self, checkpoint_id: str | os.PathLike[Any] | None = None) -> None:
        self.step = None if checkpoint_id is None else _step_of(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[Any]) -> bool:
        try:
            _step_of(checkpoint_id)
        except ValueError:
            return False
        return True

    def __getstate__(self) -> dict[str, Any]:  # pickled (DCP's async process mode): the store, not the client
        return {"store": self._store, "prefix": self.prefix, "keep": self.keep, "chunk_size": self.chunk_size, "step": self.step}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._store, self.prefix, self.keep = state["store"], state["prefix"], state["keep"]
        self.chunk_size, self.step = state["chunk_size"], state["step"]
        self._client = ProcessClient(self._store)


def _step_of(checkpoint_id: str | os.PathLike[Any] | int) -> int:
    text = os.fspath(checkpoint_id) if not isinstance(checkpoint_id, int) else str(checkpoint_id)
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"a blobsdk checkpoint_id is the step, digits only: got {checkpoint_id!r}")
    return int(text)


def _key(index: MetadataIndex) -> str:
    offset = "x".join(map(str, index.offset)) if index.offset is not None else "-"
    return f"{index.fqn}@{offset}#{index.index if index.index is not None else '-'}"


class _Stored(NamedTuple):
    """A write result's storage data: the item's key, and the part of the rank that wrote it
    (the same object in each of a rank's results: pickled once when DCP gathers them)."""

    key: str
    part: Part


class BlobStorageWriter(_Backend, StorageWriter):
    """DCP ``StorageWriter`` over the checkpoints under ``prefix`` (see the module docstring)."""

    @classmethod
    def local(
        cls, root: str | os.PathLike[str], prefix: str, *, keep: int = 3, chunk_size: int | None = None
    ) -> BlobStorageWriter:
        """Over the embedded store in ``root``; ``chunk_size``: of its checkpoints (default
        the write config's): the grain of deduplication."""
        return cls(ClientConfig(), prefix, local=root, keep=keep, chunk_size=chunk_size)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items as a part (see the module docstring)."""
        items: dict[str, torch.Tensor | bytes] = {}
        sizes = []
        for item in plan.items:
            data = planner.resolve_data(item)
            key = _key(item.index)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                items[key] = data.getvalue()
                sizes.append(len(items[key]))
            else:
                assert isinstance(data, torch.Tensor)
                items[key] = data.detach()
                sizes.append(data.numel() * data.element_size())
        part = self.checkpoints().write_part({_ITEMS: items})
        results = [
            WriteResult(index=item.index, size_in_bytes=size, storage_data=_Stored(key, part))
            for item, key, size in zip(plan.items, items, sizes, strict=True)
        ]
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator: commit every rank's part and the metadata as one checkpoint;
        return once it is committed."""
        parts = [rank[0].storage_data.part for rank in results if rank]
        metadata.storage_data = {result.index: result.storage_data.key for rank in results for result in rank}
        checkpoints = self.checkpoints()
        step = self.step
        if step is None:
            steps = checkpoints.list()
            step = steps[-1] + 1 if steps else 0
        parts.append(checkpoints.write_part({_METADATA: pickle.dumps(metadata)}))
        checkpoints.commit(step, parts)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=None if self.step is None else str(self.step))


class BlobStorageReader(_Backend, StorageReader):
    """DCP ``StorageReader`` over the checkpoints under ``prefix`` (see the module docstring)."""

    def __init__(self, config: ConfigLike, prefix: str, *, local: str | os.PathLike[str] | None = None) -> None:
        super().__init__(config, prefix, local=local)
        self._loaded: int | None = None  # the step read_metadata found
        self._entries: dict[str, Entry] = {}  # its items' manifest entries, by storage key
        self._storage: dict[MetadataIndex, Any] = {}

    @classmethod
    def local(cls, root: str | os.PathLike[str], prefix: str) -> BlobStorageReader:
        """Over the embedded store in ``root``."""
        return cls(ClientConfig(), prefix, local=root)

    def reset(self, checkpoint_id: str | os.PathLike[Any] | None = None) -> None:
        super().reset(checkpoint_id)
        self._loaded = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's DCP metadata (the latest one's, if no ``checkpoint_id``): the
        step is fixed here, so a save meanwhile does not change what ``read_data`` reads.
        Unpickled through an allowlist of the globals DCP's metadata holds: a pickle naming
        any other (another writer's, or a custom planner's ``planner_data``) is ``CorruptData``."""
        checkpoints = self.checkpoints()
        manifest = checkpoints.manifest(self.step)
        self._loaded = manifest.step
        self._entries = {entry.name[-1]: entry for entry in manifest.entries if entry.name[0] == _ITEMS}
        state = checkpoints.load(self._loaded, select=lambda name: name == (_METADATA,))
        if _METADATA not in state:
            raise ValueError(f"checkpoint {self._loaded} under {self.prefix} is not a DCP checkpoint")
        metadata = _unpickle_metadata(state[_METADATA], f"checkpoint {self._loaded} under {self.prefix}")
        if not isinstance(metadata, Metadata):
            raise ValueError(f"checkpoint {self._loaded} under {self.prefix} is not a DCP checkpoint")
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._storage = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the items this rank's plan needs (every chunk of them in parallel through
        the tiers, verified), and only those: a tensor the plan wants whole, into a target
        that can take it (a contiguous CPU tensor of its dtype and shape), straight into the
        target's memory (``load(into=...)``); the rest into fresh memory, then copied."""
        if self._loaded is None:
            self.read_metadata()
        keys = {self._storage[item.storage_index] for item in plan.items}
        targets: dict[int, torch.Tensor] = {}
        into: dict[str, torch.Tensor] = {}
        for i, item in enumerate(plan.items):
            if item.type == LoadItemType.BYTE_IO:
                continue
            targets[i] = target = planner.resolve_tensor(item).detach()
            key = self._storage[item.storage_index]
            if key not in into and self._whole(key, item, target):
                into[key] = target
        state = self.checkpoints().load(
            self._loaded, select=lambda name: name[0] == _ITEMS and name[-1] in keys, into={_ITEMS: into}
        )
        items = state.get(_ITEMS, {})
        for i, read_item in enumerate(plan.items):
            value = items[self._storage[read_item.storage_index]]
            if read_item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(read_item, io.BytesIO(value))
                continue
            target = targets[i]
            if value is not target:  # not filled in place
                target.copy_(narrow_tensor_by_index(value, read_item.storage_offsets, read_item.lengths))
            planner.commit_tensor(read_item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _whole(self, key: str, item: ReadItem, target: torch.Tensor) -> bool:
        """Whether the stored item ``key`` can be read straight into ``target``: the read
        item wants it whole, and the target can take its bytes in place."""
        entry = self._entries.get(key)
        if entry is None or any(item.storage_offsets) or tuple(item.lengths) != entry.shape:
            return False
        return not problem(entry, target)
