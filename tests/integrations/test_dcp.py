"""blobsdk/dcp.py: torch.distributed.checkpoint over blobsdk's delta checkpoints, in DCP's
single-process (no-dist) mode, sync and async (thread) saves, and as 2 gloo ranks; with a path
per step (a new prefix each save), deduplicated through the bucket's chunk index."""

from __future__ import annotations

import builtins
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import blobsdk
from blobsdk.errors import CorruptData
from blobsdk.torch import BlobStorageReader, BlobStorageWriter
from tests import helpers

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


class Opens:
    """What another writer of the bucket may pickle: unpickling it calls ``reduce``, with ``args``."""

    def __init__(self, reduce: Any, *args: Any) -> None:
        self.reduce, self.args = reduce, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.reduce, self.args


def real_metadata(tmp_path: Path) -> Any:
    with BlobStorageWriter.local(tmp_path, "/ck/real") as writer:
        dcp.save(state(), storage_writer=writer)
    with BlobStorageReader.local(tmp_path, "/ck/real") as reader:
        return reader.read_metadata()


@pytest.mark.parametrize(
    ("what", "refused"),
    [
        ("open", "io.open"),  # the pickle alone: open(marker, "w")
        ("exec", "builtins.exec"),  # exec("open(marker, 'w')")
        ("inside", "io.open"),  # a real Metadata whose planner_data holds the open
    ],
)
def test_a_metadata_pickle_naming_any_other_global_is_corrupt_data_and_never_runs(
    tmp_path: Path, what: str, refused: str
) -> None:
    """Another writer of the bucket commits a checkpoint whose DCP metadata is a pickle that
    calls a function as it unpickles: refused by the global it names, which is never called."""
    marker = tmp_path / "marker"
    if what == "exec":
        evil: Any = Opens(builtins.exec, f"open({str(marker)!r}, 'w')")
    else:
        evil = Opens(open, str(marker), "w")
    if what == "inside":
        metadata = real_metadata(tmp_path)
        metadata.planner_data = evil
        evil = metadata
    with blobsdk.SyncClient.local(tmp_path) as client:
        client.checkpoints("/ck/evil").save(7, {"metadata": pickle.dumps(evil)}).wait()
    with BlobStorageReader.local(tmp_path, "/ck/evil") as reader:
        with pytest.raises(CorruptData) as caught:
            reader.read_metadata()
        message = (
            f"checkpoint 7 under /ck/evil: its DCP metadata names {refused}, which DCP metadata never holds: "
            "refused, not unpickled"
        )
        assert str(caught.value) == message
        with pytest.raises(CheckpointException) as failed:
            dcp.load(zeroed(state()), storage_reader=reader)
        assert message in str(failed.value.failures[0][0])  # DCP's words around it, rank 0's failure
    assert not marker.exists()


def test_a_metadata_pickle_that_does_not_unpickle_is_corrupt_data(tmp_path: Path) -> None:
    good = pickle.dumps(real_metadata(tmp_path))
    with blobsdk.SyncClient.local(tmp_path) as client:
        client.checkpoints("/ck/cut").save(2, {"metadata": good[: len(good) // 2]}).wait()
    with BlobStorageReader.local(tmp_path, "/ck/cut") as reader, pytest.raises(CorruptData) as caught:
        reader.read_metadata()
    assert str(caught.value) == "checkpoint 2 under /ck/cut: its DCP metadata does not unpickle: pickle data was truncated"


DTYPES = (torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.bool, torch.uint8, torch.int8, torch.int32)


def test_the_metadata_of_every_kind_of_item_blobsdk_saves_loads_through_the_allowlist(tmp_path: Path) -> None:
    """Nested and flattened keys, scalars and empty tensors, every common dtype, a parameter,
    objects DCP pickles as bytes: their metadata holds only the allowed globals."""
    saved: dict[str, Any] = {
        "nested": {"a": [torch.ones(3), {"b": torch.arange(4)}], "objects": [1, "x", None, (2.5, b"y")]},
        "scalar": torch.tensor(3.0),
        "empty": torch.empty(0, 3),
        "weight": torch.nn.Parameter(torch.ones(2, 2)),
        "dtypes": {str(dtype): torch.ones(2, dtype=dtype) for dtype in DTYPES},
    }
    with BlobStorageWriter.local(tmp_path, "/ck/kinds") as writer:
        dcp.save(saved, storage_writer=writer)
    target: dict[str, Any] = {
        "nested": {"a": [torch.zeros(3), {"b": torch.zeros(4, dtype=torch.int64)}], "objects": None},
        "scalar": torch.tensor(0.0),
        "empty": torch.empty(0, 3),
        "weight": torch.nn.Parameter(torch.zeros(2, 2)),
        "dtypes": {name: torch.zeros_like(value) for name, value in saved["dtypes"].items()},
    }
    with BlobStorageReader.local(tmp_path, "/ck/kinds") as reader:
        dcp.load(target, storage_reader=reader)
    assert target["nested"]["objects"] == [1, "x", None, (2.5, b"y")]
    assert torch.equal(target["nested"]["a"][1]["b"], torch.arange(4)) and torch.equal(target["scalar"], saved["scalar"])
    assert all(torch.equal(target["dtypes"][name], value) for name, value in saved["dtypes"].items())


RANK = """
import json, os, sys, warnings
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
import blobsdk
from blobsdk.errors import CorruptData
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
    outs = helpers.run_ranks(RANK, 2, str(tmp_path))
    assert outs[0]["same"] and outs[1]["same"]
    assert outs[0]["steps"] == [0, 1]
    first, second = outs[0]["new"]
    assert first >= 4 * (1 << 18) * 2 + 4 * (1 << 16)  # both ranks' tensors and the shared one, once
    assert second < 3 * (1 << 16) + 64 * 1024  # a chunk per rank, plus DCP's pickled metadata
    assert outs[0]["names"] == ["items/model.rank0@0#0", "items/model.rank1@0#0", "items/model.shared@0#0", "metadata"]


# --- a path per step (torchtitan's and Lightning's layout): a new prefix each save ------------------


def blocks_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "blocks").rglob("*") if p.is_file())


def big_state(seed: int = 0) -> dict[str, Any]:
    """~12.7 MiB of weights in the default 4 MiB grain, and DCP's pickled objects."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1200)
    )
    return {"model": model.state_dict(), "extra": {"step": 3, "note": "hello"}, "bf": torch.ones(7, dtype=torch.bfloat16)}


def test_a_path_per_step_second_save_writes_almost_nothing(tmp_path: Path) -> None:
    """Each save under its own prefix (``/ck/run/step-{n}``) names the chunks the previous
    step's checkpoint stored, through the bucket's chunk index."""
    saved = big_state()
    steps, grown = [], []  # the weights saved, the blocks directory's size after each save
    for n in range(2):
        with BlobStorageWriter.local(tmp_path, f"/ck/run/step-{n}") as writer:
            dcp.save(saved, storage_writer=writer)
        grown.append(blocks_bytes(tmp_path))
        steps.append({k: v.clone() for k, v in saved["model"].items()})
        with torch.no_grad():
            saved["model"]["2.bias"] += 1.0  # 1024 floats of ~3.3M change
            saved["extra"]["step"] += 1
    with blobsdk.SyncClient.local(tmp_path) as client:
        first, second = (client.checkpoints(f"/ck/run/step-{n}").manifest() for n in range(2))
    assert first.reused_bytes == 0 and first.new_bytes > 12 << 20
    assert second.new_bytes <= 0.05 * first.new_bytes
    changed = {"/".join(e.name): e.new_bytes for e in second.entries if e.new_bytes}
    assert sorted(changed) == ["items/extra.step@-#-", "items/model.2.bias@0#0"]  # DCP pickles the changed int
    assert changed["items/model.2.bias@0#0"] == 4096 and second.new_bytes < 2 * 4096
    assert grown[1] - grown[0] <= 0.05 * grown[0]
    for n, weights in enumerate(steps):
        target = {"model": {k: torch.zeros_like(v) for k, v in weights.items()}, "extra": {"step": 0, "note": ""}}
        target["bf"] = torch.zeros(7, dtype=torch.bfloat16)
        with BlobStorageReader.local(tmp_path, f"/ck/run/step-{n}") as reader:
            dcp.load(target, storage_reader=reader)
        assert all(torch.equal(target["model"][k], v) for k, v in weights.items()), n
        assert target["extra"] == {"step": 3 + n, "note": "hello"}


RANK_PER_STEP = """
import json, os, sys, warnings
from pathlib import Path
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from blobsdk.torch import BlobStorageReader, BlobStorageWriter

warnings.simplefilter("error")
root = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
state = {"model": {"shared": torch.arange(1 << 16, dtype=torch.float32), f"rank{rank}": torch.randn(1 << 19)}}
saved, grown = [], []
for n in range(2):
    with BlobStorageWriter.local(root, f"/ck/run/step-{n}", chunk_size=1 << 16) as writer:
        dcp.save(state, storage_writer=writer)  # returns once the coordinator committed it
    grown.append(sum(p.stat().st_size for p in Path(root, "blocks").rglob("*") if p.is_file()))
    saved.append({k: v.clone() for k, v in state["model"].items()})
    with torch.no_grad():
        state["model"][f"rank{rank}"][:10] += 1.0  # one chunk of this rank's 32 changes
same = []
for n, weights in enumerate(saved):
    target = {"model": {k: torch.zeros_like(v) for k, v in weights.items()}}
    with BlobStorageReader.local(root, f"/ck/run/step-{n}") as reader:
        dcp.load(target, storage_reader=reader)
    same.append(all(torch.equal(target["model"][k], v) for k, v in weights.items()))
dist.barrier()
out = {"same": same}
if rank == 0:
    import blobsdk
    with blobsdk.SyncClient.local(root) as client:
        manifests = [client.checkpoints(f"/ck/run/step-{n}").manifest() for n in range(2)]
    out.update(grown=grown, new=[m.new_bytes for m in manifests])
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_two_gloo_ranks_with_a_path_per_step_write_almost_nothing_the_second_time(tmp_path: Path) -> None:
    """Each rank's part of step 1 names, through the bucket's chunk index, the chunks step 0
    (another prefix) stored: the index is recorded before step 0's ``dcp.save`` returns."""
    outs = helpers.run_ranks(RANK_PER_STEP, 2, str(tmp_path))
    assert outs[0]["same"] == [True, True] and outs[1]["same"] == [True, True]
    first, second = outs[0]["new"]
    assert first >= 4 * (1 << 19) * 2 + 4 * (1 << 16)  # both ranks' tensors and the shared one, once
    assert second <= 0.05 * first
    assert second < 2 * (1 << 16) + 8 * 1024  # a chunk per rank, plus DCP's pickled metadata
    after_first, after_second = outs[0]["grown"]  # the blocks directory's size
    assert after_second - after_first <= 0.05 * after_first
