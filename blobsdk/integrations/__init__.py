"""The pieces the modules users import for their frameworks are built from: the datasets'
sample order, elastic resume, reading and data state (:mod:`blobsdk.torch`), the DCP storage
(:mod:`blobsdk.dcp`), blob://'s client, names and files (:mod:`blobsdk.fsspec`), the DLIO
plugins' logic (:mod:`blobsdk.dlio`) and how each opens its store.  Import those modules, not
these: the names here may move between releases.

Every name loads its module on first use: the modules need different extras (torch, fsspec),
and each public module loads only its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .datastate import DataState, states_of
    from .dcpstorage import BlobStorageReader, BlobStorageWriter
    from .dliofiles import CheckpointStates, DlioSettings, Lookahead, SampleFiles, dlio_order, worker_batches
    from .elastic import gather_states
    from .fsclient import ClientSlot, client_factory
    from .fsfiles import BlobFile, BlobWriteFile, Entry, LocalFile, Pin, Spool, read_local_file
    from .fsnames import blob_path, dir_entry, dir_prefix, file_entry, parents, writable_path
    from .mapstyle import BlobBatchDataset, BlobDataset, BlobSampler, SampleBatch, collate_batch
    from .order import Position, Sharding, check_epoch, fingerprint, resolve_paths, resolve_rank
    from .reading import (
        Ahead,
        Iteration,
        Reading,
        Transform,
        WindowPrefetch,
        check_transform,
        current_worker,
        publish,
        readahead,
        worker_stats,
    )
    from .stores import ClosedOnExit, ConfigLike, ProcessClient, Store

__getattr__ = lazy_names(
    __name__,
    {
        "DataState": "datastate",
        "states_of": "datastate",
        "BlobStorageReader": "dcpstorage",
        "BlobStorageWriter": "dcpstorage",
        "CheckpointStates": "dliofiles",
        "DlioSettings": "dliofiles",
        "Lookahead": "dliofiles",
        "SampleFiles": "dliofiles",
        "dlio_order": "dliofiles",
        "worker_batches": "dliofiles",
        "gather_states": "elastic",
        "ClientSlot": "fsclient",
        "client_factory": "fsclient",
        "BlobFile": "fsfiles",
        "BlobWriteFile": "fsfiles",
        "Entry": "fsfiles",
        "LocalFile": "fsfiles",
        "Pin": "fsfiles",
        "Spool": "fsfiles",
        "read_local_file": "fsfiles",
        "blob_path": "fsnames",
        "dir_entry": "fsnames",
        "dir_prefix": "fsnames",
        "file_entry": "fsnames",
        "parents": "fsnames",
        "writable_path": "fsnames",
        "BlobBatchDataset": "mapstyle",
        "BlobDataset": "mapstyle",
        "BlobSampler": "mapstyle",
        "SampleBatch": "mapstyle",
        "collate_batch": "mapstyle",
        "Position": "order",
        "Sharding": "order",
        "check_epoch": "order",
        "fingerprint": "order",
        "resolve_paths": "order",
        "resolve_rank": "order",
        "Ahead": "reading",
        "Iteration": "reading",
        "Reading": "reading",
        "Transform": "reading",
        "WindowPrefetch": "reading",
        "check_transform": "reading",
        "current_worker": "reading",
        "publish": "reading",
        "readahead": "reading",
        "worker_stats": "reading",
        "ClosedOnExit": "stores",
        "ConfigLike": "stores",
        "ProcessClient": "stores",
        "Store": "stores",
    },
)

__all__ = [
    "Ahead",
    "BlobBatchDataset",
    "BlobDataset",
    "BlobFile",
    "BlobSampler",
    "BlobStorageReader",
    "BlobStorageWriter",
    "BlobWriteFile",
    "CheckpointStates",
    "ClientSlot",
    "ClosedOnExit",
    "ConfigLike",
    "DataState",
    "DlioSettings",
    "Entry",
    "Iteration",
    "LocalFile",
    "Lookahead",
    "Pin",
    "Position",
    "ProcessClient",
    "Reading",
    "SampleBatch",
    "SampleFiles",
    "Sharding",
    "Spool",
    "Store",
    "Transform",
    "WindowPrefetch",
    "blob_path",
    "check_epoch",
    "check_transform",
    "client_factory",
    "collate_batch",
    "current_worker",
    "dir_entry",
    "dir_prefix",
    "dlio_order",
    "file_entry",
    "fingerprint",
    "gather_states",
    "parents",
    "publish",
    "read_local_file",
    "readahead",
    "resolve_paths",
    "resolve_rank",
    "states_of",
    "worker_batches",
    "worker_stats",
    "writable_path",
]
