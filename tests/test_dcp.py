"""blobsdk/dcp.py: torch.distributed.checkpoint over blobsdk's delta checkpoints, in DCP's
single-process (no-dist) mode, sync and async (thread) saves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import blobsdk
from blobsdk.torch import BlobStorageReader, BlobStorageWriter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    return {"model": model.state_dict(), "extra": {"step": 3, "note": "hello"}, "bf": torch.ones(7, dtype=torch.bfloat16)}


def zeroed(like: dict[str, Any]) -> dict[str, Any]:
    """A state of the same structure to load into (tensors zeroed, objects replaced)."""
    return {
        "model": {k: torch.zeros_like(v) for k, v in like["model"].items()},
        "extra": {"step": 0, "note": ""},
        "bf": torch.zeros(7, dtype=torch.bfloat16),
    }


def assert_loaded(loaded: dict[str, Any], saved: dict[str, Any]) -> None:
    for name, tensor in saved["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name
    assert loaded["extra"] == saved["extra"] and torch.equal(loaded["bf"], saved["bf"])


def test_dcp_save_and_load_round_trip(tmp_path: Path) -> None:
    saved = state()
    with BlobStorageWriter.local(tmp_path, "/ck/dcp") as writer:
        dcp.save(saved, storage_writer=writer)
    target = zeroed(saved)
    with BlobStorageReader.local(tmp_path, "/ck/dcp") as reader:
        dcp.load(target, storage_reader=reader)
    assert_loaded(target, saved)


def test_a_second_save_of_a_nearly_unchanged_model_writes_almost_nothing(tmp_path: Path) -> None:
    saved = state()
    with BlobStorageWriter.local(tmp_path, "/ck/delta") as writer:
        dcp.save(saved, storage_writer=writer)
        with torch.no_grad():
            saved["model"]["2.bias"] += 1.0  # 64 floats of ~134k change
        dcp.save(saved, storage_writer=writer)
    with blobsdk.SyncClient.local(tmp_path) as client:
        ck = client.checkpoints("/ck/delta")
        assert ck.list() == [0, 1]
        first, second = ck.manifest(0), ck.manifest(1)
    total = first.new_bytes
    assert second.reused_bytes >= 0.9 * total and second.new_bytes <= 0.1 * total
    target = zeroed(saved)
    with BlobStorageReader.local(tmp_path, "/ck/delta") as reader:
        dcp.load(target, storage_reader=reader)  # the latest
    assert_loaded(target, saved)
    older = zeroed(saved)
    with BlobStorageReader.local(tmp_path, "/ck/delta") as reader:
        dcp.load(older, checkpoint_id="0", storage_reader=reader)
    assert not torch.equal(older["model"]["2.bias"], saved["model"]["2.bias"])


def test_async_save_in_thread_mode(tmp_path: Path) -> None:
    saved = state(1)
    with BlobStorageWriter.local(tmp_path, "/ck/async") as writer:
        future = dcp.async_save(saved, storage_writer=writer, checkpoint_id="5")
        future.result(timeout=60)
    target = zeroed(saved)
    with BlobStorageReader.local(tmp_path, "/ck/async") as reader:
        dcp.load(target, checkpoint_id="5", storage_reader=reader)
    assert_loaded(target, saved)


def test_checkpoint_ids_are_steps() -> None:
    assert BlobStorageWriter.validate_checkpoint_id("12") and BlobStorageReader.validate_checkpoint_id("0")
    assert not BlobStorageWriter.validate_checkpoint_id("/tmp/x") and not BlobStorageReader.validate_checkpoint_id("1.5")
