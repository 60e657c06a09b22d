"""blobsdk/dcp.py: torch.distributed.checkpoint over blobsdk's delta checkpoints, in DCP's
single-process (no-dist) mode, sync and async (thread) saves, and on 2 gloo ranks; under one
prefix and with a new prefix per step."""

from __future__ import annotations

import os
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


def test_dcp_load_reads_whole_tensors_straight_into_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader hands DCP's targets to ``load(into=...)``: only what cannot take its bytes in
    place (the pickled objects; a non-contiguous tensor) is read into fresh memory, then copied."""
    import blobsdk.write.restore

    fresh: list[int] = []
    real = blobsdk.write.restore.fresh_buffer
    monkeypatch.setattr(blobsdk.write.restore, "fresh_buffer", lambda size: fresh.append(size) or real(size))
    saved = state()
    with BlobStorageWriter.local(tmp_path, "/ck/in-place") as writer:
        dcp.save(saved, storage_writer=writer)
    target = zeroed(saved)
    weight = target["model"]["0.weight"]
    with BlobStorageReader.local(tmp_path, "/ck/in-place") as reader:
        dcp.load(target, storage_reader=reader)
    assert_loaded(target, saved)
    assert target["model"]["0.weight"] is weight and fresh and max(fresh) < 4096  # the pickled objects alone (2.5 KB)
    fresh.clear()
    target = zeroed(saved)
    target["model"]["0.weight"] = torch.zeros(256, 512).T  # its shape, not contiguous: read, then copied
    with BlobStorageReader.local(tmp_path, "/ck/in-place") as reader:
        dcp.load(target, storage_reader=reader)
    assert_loaded(target, saved)
    assert max(fresh) >= 512 * 256 * 4


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


def blocks_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "blocks").rglob("*") if p.is_file())


def test_a_path_per_step_dedups_through_the_buckets_chunk_index(tmp_path: Path) -> None:
    """torchtitan's and Lightning's layout: each save under a new prefix compares with no
    previous checkpoint there, and still writes only the changed chunks."""
    saved = state()
    grown = []
    for step in range(3):
        if step:
            with torch.no_grad():
                saved["model"]["2.bias"] += 1.0
        before = blocks_bytes(tmp_path)
        with BlobStorageWriter.local(tmp_path, f"/ck/run/step-{step}", chunk_size=1 << 14) as writer:
            dcp.save(saved, storage_writer=writer)
        grown.append(blocks_bytes(tmp_path) - before)
    with blobsdk.SyncClient.local(tmp_path) as client:
        first, last = (client.checkpoints(f"/ck/run/step-{n}").manifest() for n in (0, 2))
    assert last.new_bytes <= 0.05 * first.new_bytes and last.reused_bytes >= 0.9 * first.new_bytes
    assert grown[1] <= 0.05 * grown[0] and grown[2] <= 0.05 * grown[0]
    for step in (0, 2):
        target = zeroed(saved)
        with BlobStorageReader.local(tmp_path, f"/ck/run/step-{step}") as reader:
            dcp.load(target, storage_reader=reader)
        assert torch.equal(target["model"]["0.weight"], saved["model"]["0.weight"])
        assert torch.equal(target["model"]["2.bias"], saved["model"]["2.bias"]) == (step == 2)


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


RANK = """
import json, os, sys, warnings
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import blobsdk
from blobsdk.torch import BlobStorageReader, BlobStorageWriter

warnings.simplefilter("error")
root, prefix = sys.argv[1], "/ck/ranks"
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
state = {"model": {"shared": torch.arange(1 << 16, dtype=torch.float32), f"rank{rank}": torch.randn(1 << 18)}}
with BlobStorageWriter.local(root, prefix, chunk_size=1 << 16) as writer:
    dcp.save(state, storage_writer=writer)
    with torch.no_grad():
        state["model"][f"rank{rank}"][:10] += 1.0  # one chunk of this rank's 16 changes
    dcp.save(state, storage_writer=writer)
target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
with BlobStorageReader.local(root, prefix) as reader:
    dcp.load(target, storage_reader=reader)
same = all(torch.equal(target["model"][k], v) for k, v in state["model"].items())
dist.barrier()
if rank == 0:
    with blobsdk.SyncClient.local(root) as client:
        ck = client.checkpoints(prefix)
        manifests = [ck.manifest(step) for step in ck.list()]
    print(json.dumps({"same": same, "steps": [m.step for m in manifests], "new": [m.new_bytes for m in manifests],
                      "names": sorted("/".join(e.name) for e in manifests[-1].entries)}))
else:
    print(json.dumps({"same": same}))
dist.destroy_process_group()
"""


def test_two_gloo_ranks_save_one_delta_checkpoint_and_each_loads_its_share(tmp_path: Path) -> None:
    """Each rank writes its own items as a part; the coordinator commits both ranks' parts
    and the metadata as one checkpoint; the second save writes only the changed chunks."""
    outs = run_ranks(RANK, tmp_path)
    assert outs[0]["same"] and outs[1]["same"]
    assert outs[0]["steps"] == [0, 1]
    first, second = outs[0]["new"]
    assert first >= 4 * (1 << 18) * 2 + 4 * (1 << 16)  # both ranks' tensors and the shared one, once
    assert second < 3 * (1 << 16) + 64 * 1024  # a chunk per rank, plus DCP's pickled metadata
    assert outs[0]["names"] == ["items/model.rank0@0#0", "items/model.rank1@0#0", "items/model.shared@0#0", "metadata"]


def run_ranks(script: str, root: Path) -> list[dict[str, Any]]:
    """``script`` run as 2 gloo ranks (real processes); each one's last line of output, as JSON."""
    import json
    import socket
    import subprocess
    import sys

    from tests.helpers import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(root)],
            cwd=ROOT,
            env={**os.environ, **env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outs = [json.loads(rank.communicate(timeout=120)[0].strip().splitlines()[-1]) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0]
    return outs


RANK_STEPS = """
import json, sys, warnings
from pathlib import Path
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import blobsdk
from blobsdk.torch import BlobStorageReader, BlobStorageWriter

warnings.simplefilter("error")
root = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
state = {"model": {"shared": torch.arange(1 << 16, dtype=torch.float32), f"rank{rank}": torch.randn(1 << 18)}}
saved = []
for step in range(2):
    if step:
        with torch.no_grad():
            state["model"][f"rank{rank}"][:10] += 1.0  # one chunk of this rank's 16 changes
    with BlobStorageWriter.local(root, f"/ck/run/step-{step}", chunk_size=1 << 16) as writer:
        dcp.save(state, storage_writer=writer)
    saved.append({k: v.clone() for k, v in state["model"].items()})
same = []
for step in range(2):
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    with BlobStorageReader.local(root, f"/ck/run/step-{step}") as reader:
        dcp.load(target, storage_reader=reader)
    same.append(all(torch.equal(target["model"][k], v) for k, v in saved[step].items()))
dist.barrier()
out = {"same": same}
if rank == 0:
    with blobsdk.SyncClient.local(root) as client:
        out["new"] = [client.checkpoints(f"/ck/run/step-{step}").manifest().new_bytes for step in range(2)]
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_two_gloo_ranks_with_a_path_per_step_write_only_the_changed_chunks(tmp_path: Path) -> None:
    """DCP with a new prefix per step on 2 ranks: the second step's parts name the first
    step's chunks through the bucket's chunk index, on each rank."""
    outs = run_ranks(RANK_STEPS, tmp_path)
    assert outs[0]["same"] == [True, True] and outs[1]["same"] == [True, True]
    first, second = outs[0]["new"]
    assert first >= 4 * (1 << 18) * 2 + 4 * (1 << 16)
    assert second < 3 * (1 << 16) + 64 * 1024  # a chunk per rank (of 16 each), plus DCP's pickled metadata
