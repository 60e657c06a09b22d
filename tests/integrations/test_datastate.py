"""The data state saved with the model (blobsdk/integrations/datastate.py): ``DataState(loader)``
through a blobsdk checkpoint in one process, and through a DCP save on 2 gloo ranks of 2
DataLoader workers loaded as 3 ranks of 1 and 1 of 3; ``states_of`` and the refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import blobsdk
from blobsdk.integrations.order import fingerprint
from blobsdk.torch import BlobDataset, BlobIterableDataset, BlobSampler, DataState, states_of
from tests import helpers
from tests.integrations.test_elastic import SEED, N, flat, read, stateful

KINDS = ("iterable", "sampled")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("datastate") / "store"
    paths = [f"/train/d/{i:04d}" for i in range(N)]
    with blobsdk.SyncClient.local(root) as client:
        client.put_many((path, path.encode()) for path in paths)
    return root, paths


OPEN: list[BlobDataset | BlobIterableDataset] = []  # the datasets loader_of made, closed by close_all


def close_all() -> None:
    """Close the clients this process opened over the store: SQLite must not be open in a
    process that forks DataLoader workers which open it in turn (they may share its locks)."""
    while OPEN:
        OPEN.pop().close()


@pytest.fixture(autouse=True)
def closed() -> Iterator[None]:
    yield
    close_all()


def loader_of(kind: str, root: Path, paths: list[str], workers: int, epoch: int, **options: Any) -> StatefulDataLoader[Any]:
    """A one-rank StatefulDataLoader over the iterable, or over the map-style with a sampler."""
    if kind == "iterable":
        ds = BlobIterableDataset.local(root, paths, shuffle=True, seed=SEED, rank=0, world_size=1, prefetch_window=None)
        OPEN.append(ds)
        ds.set_epoch(epoch)
        return StatefulDataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list, **options)
    mapped = BlobDataset.local(root, paths)
    OPEN.append(mapped)
    sampler = BlobSampler(mapped, shuffle=True, seed=SEED, rank=0, world_size=1)
    sampler.set_epoch(epoch)
    return StatefulDataLoader(mapped, sampler=sampler, num_workers=workers, batch_size=4, collate_fn=list, **options)


def set_epoch(loader: StatefulDataLoader[Any], epoch: int) -> None:
    (loader.sampler if isinstance(loader.sampler, BlobSampler) else loader.dataset).set_epoch(epoch)  # type: ignore[attr-defined]


# --- through a blobsdk checkpoint, in one process --------------------------------------------------


@stateful
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning")  # on a 2-core machine
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("old_workers", "new_workers"), [(2, 3), (0, 2)])
def test_a_data_state_in_a_blobsdk_checkpoint_finishes_the_epoch_with_other_workers(
    store: tuple[Path, list[str]], tmp_path: Path, kind: str, old_workers: int, new_workers: int
) -> None:
    root, paths = store
    old = loader_of(kind, root, paths, old_workers, epoch=2)
    batches = iter(old)
    seen = read(next(batches) for _ in range(5))
    model = {"w": torch.arange(6.0)}
    with blobsdk.SyncClient.local(tmp_path / "ck") as client:
        ck = client.checkpoints("/ck/run")
        ck.save(7, {"model": model, "data": DataState(old).state_dict()}).wait()
        loaded = ck.load()
    assert torch.equal(loaded["model"]["w"], model["w"]) and isinstance(loaded["data"]["states"], bytes)
    assert len(json.loads(loaded["data"]["states"])) == (1 if kind == "sampled" else max(old_workers, 1))

    close_all()  # before new workers fork
    new = loader_of(kind, root, paths, new_workers, epoch=0)
    DataState(new).load_state_dict(loaded["data"])
    set_epoch(new, 2)  # as a training loop does: the epoch the states name stays resumed
    left = len(new.sampler if kind == "sampled" else new.dataset)  # type: ignore[arg-type]
    rest = read(new)
    assert left == len(rest) == N - 20
    assert len(seen) == 20 and len(seen + rest) == N and sorted(seen + rest) == paths  # epoch 2: each sample once
    set_epoch(new, 3)
    following = read(new)
    assert len(following) == N and sorted(following) == paths  # epoch 3: whole, in the new shape


@stateful
def test_a_data_state_taken_before_the_loader_runs_resumes_the_whole_epoch(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    for kind in KINDS:
        old = loader_of(kind, root, paths, 2, epoch=4)
        state = DataState(old).state_dict()  # its workers are not started for it
        assert getattr(old, "_iterator", None) is None
        new = loader_of(kind, root, paths, 0, epoch=0)
        DataState(new).load_state_dict(state)
        got = read(new)
        assert len(got) == N and sorted(got) == paths
        set_epoch(new, 4)
        assert read(new) == got  # the same epoch: epoch 4's order, whole


@stateful
def test_a_data_state_of_a_loader_given_a_state_is_that_state(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    for kind in KINDS:
        old = loader_of(kind, root, paths, 0, epoch=1)
        batches = iter(old)
        read(next(batches) for _ in range(2))
        restored = loader_of(kind, root, paths, 0, epoch=0)
        restored.load_state_dict(old.state_dict())
        assert DataState(restored).state_dict() == DataState(old).state_dict()
        assert json.loads(DataState(old).state_dict()["states"])[0]["yielded"] == 8


@stateful
def test_a_loaded_epoch_stays_resumed_through_its_set_epoch_not_another(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    for kind in KINDS:
        old = loader_of(kind, root, paths, 0, epoch=2)
        batches = iter(old)
        seen = read(next(batches) for _ in range(5))
        state = DataState(old).state_dict()
        new = loader_of(kind, root, paths, 0, epoch=0)
        DataState(new).load_state_dict(state)
        set_epoch(new, 2)
        rest = read(new)
        assert len(rest) == N - 20 and sorted(seen + rest) == paths
        other = loader_of(kind, root, paths, 0, epoch=0)
        DataState(other).load_state_dict(state)
        set_epoch(other, 3)
        set_epoch(new, 3)
        assert read(other) == read(new) and len(read(other)) == N  # epoch 3, whole


# --- states_of --------------------------------------------------------------------------------------


@stateful
def test_states_of_takes_the_states_of_the_last_batch_handed_out(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    for workers in (0, 2):
        loader = loader_of("sampled", root, paths, workers, epoch=1)
        batches = iter(loader)
        read(next(batches) for _ in range(3))
        assert [state["yielded"] for state in states_of(loader.state_dict())] == [12]  # the sampler runs ahead
        loader = loader_of("iterable", root, paths, workers, epoch=1)
        batches = iter(loader)
        read(next(batches) for _ in range(3))
        assert [state["yielded"] for state in states_of(loader.state_dict())] == ([12] if workers == 0 else [8, 4])
        assert [state.get("worker") for state in states_of(loader.state_dict())] == list(range(max(workers, 1)))
        close_all()  # before the next round's workers fork


@stateful
def test_states_of_refuses_a_state_taken_between_snapshots(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    loader = loader_of("iterable", root, paths, 1, epoch=0, snapshot_every_n_steps=2)
    batches = iter(loader)
    read(next(batches) for _ in range(3))
    with pytest.raises(ValueError) as raised:
        states_of(loader.state_dict())
    assert str(raised.value) == (
        "cannot take the data states: the loader handed out 1 batches since its last snapshot"
        " (make the StatefulDataLoader with snapshot_every_n_steps=1, or take its state at a snapshot)"
    )
    with pytest.raises(ValueError) as raised:
        states_of({"_sampler_iter_state": {"samples_yielded": 3}, "dataset_state": None})
    neither = "cannot take the data states: the loader's state holds neither a sampler's state nor its datasets'"
    assert str(raised.value) == neither


# --- refusals ---------------------------------------------------------------------------------------


@stateful
def test_a_data_state_refuses_loaders_it_cannot_resume(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    with BlobDataset.local(root, paths) as mapped:
        cases: list[tuple[Any, str]] = [
            (DataLoader(mapped), "DataState takes a torchdata StatefulDataLoader, got DataLoader"),
            (
                StatefulDataLoader(mapped, shuffle=True),
                "DataState takes a StatefulDataLoader over a BlobIterableDataset or with a BlobSampler,"
                " got one over BlobDataset with RandomSampler",
            ),
        ]
        for loader, message in cases:
            with pytest.raises(TypeError) as raised:
                DataState(loader)
            assert str(raised.value) == message


BAD_STATES: list[tuple[Any, str]] = [
    ({}, "not a DataState state: expected {'states': bytes}, got {}"),
    ({"states": "[]"}, "not a DataState state: expected {'states': bytes}, got {'states': str}"),
    ([b"[]"], "not a DataState state: expected {'states': bytes}, got list"),
    ({"states": b"[{"}, "not a DataState state: its states are not JSON"),
    ({"states": b"\xff"}, "not a DataState state: its states are not JSON"),
    ({"states": b'{"epoch": 1}'}, "not a DataState state: its states are a JSON dict, not a list"),
    ({"states": b"[]"}, "a {what} state is a dict, got list"),
    ({"states": b"[1]"}, "a {what} state is a dict, got int"),
]


@stateful
@pytest.mark.parametrize("kind", KINDS)
def test_a_data_state_refuses_what_is_not_one_or_another_lists(store: tuple[Path, list[str]], kind: str) -> None:
    root, paths = store
    what = "BlobSampler" if kind == "sampled" else "BlobIterableDataset"
    here = DataState(loader_of(kind, root, paths[:100], 0, epoch=0))
    for state, message in BAD_STATES:
        with pytest.raises(ValueError) as raised:
            here.load_state_dict(state)
        assert str(raised.value) == message.replace("{what}", what)
    saved = DataState(loader_of(kind, root, paths, 0, epoch=0)).state_dict()
    with pytest.raises(ValueError) as raised:
        here.load_state_dict(saved)  # the states of another list
    assert str(raised.value) == f"cannot resume: the state was saved with samples={N}, this {what} has samples=100"
    here.load_state_dict(DataState(loader_of(kind, root, paths[:100], 0, epoch=0)).state_dict())  # its own: accepted


@stateful
@pytest.mark.parametrize("kind", KINDS)
def test_a_data_state_of_one_list_is_refused_over_another_of_the_same_length(store: tuple[Path, list[str]], kind: str) -> None:
    """60 blobs, then 60 others: the sampler's state names its list as the iterable's does, and
    is refused with the same message (the class named), not resumed into 40 of the other 60."""
    root, paths = store
    first, other = paths[:60], paths[60:]
    what = "BlobSampler" if kind == "sampled" else "BlobIterableDataset"
    old = loader_of(kind, root, first, 2, epoch=1)
    batches = iter(old)
    seen = read(next(batches) for _ in range(5))
    state = DataState(old).state_dict()
    close_all()  # before new workers fork
    with pytest.raises(ValueError) as raised:
        DataState(loader_of(kind, root, other, 2, epoch=0)).load_state_dict(state)
    assert str(raised.value) == (
        f"cannot resume: the state was saved with fingerprint={fingerprint(first)!r}, this {what} has"
        f" fingerprint={fingerprint(other)!r}"
    )
    same = loader_of(kind, root, first, 2, epoch=0)
    DataState(same).load_state_dict(state)
    set_epoch(same, 1)
    rest = read(same)
    assert len(seen) == 20 and sorted(seen + rest) == first  # over its own list: the rest of the epoch


@stateful
def test_a_sampler_state_that_names_no_list_is_refused_over_a_blob_dataset(store: tuple[Path, list[str]]) -> None:
    """A state saved without a fingerprint (before the sampler's state named its list, or over a
    plain sized source) cannot show it was saved over this list: refused, saying how to accept it."""
    root, paths = store
    saved = DataState(loader_of("sampled", root, paths[:60], 0, epoch=1)).state_dict()
    states = json.loads(saved["states"])
    unnamed = [{key: value for key, value in one.items() if key != "fingerprint"} for one in states]
    here = loader_of("sampled", root, paths[60:], 0, epoch=0)
    message = (
        "cannot resume: the state names no list (it has no fingerprint), this BlobSampler has"
        f" fingerprint={fingerprint(paths[60:])!r}; if it was saved over this same list, add that fingerprint to it"
    )
    with pytest.raises(ValueError) as raised:
        DataState(here).load_state_dict({"states": json.dumps(unnamed).encode()})
    assert str(raised.value) == message
    with pytest.raises(ValueError) as raised:
        here.sampler.load_state_dict(unnamed[0])  # type: ignore[attr-defined]  # one state, by hand
    assert str(raised.value) == message
    plain = BlobSampler(range(60), shuffle=True, seed=SEED, rank=0, world_size=1)
    plain.load_state_dict(unnamed)  # over a plain sized source the length is all there is to check
    plain.load_state_dict(states)
    assert "fingerprint" not in plain.state_dict()
    here.sampler.load_state_dict([{**unnamed[0], "fingerprint": fingerprint(paths[60:])}])  # type: ignore[attr-defined]


# --- a DCP save on real gloo ranks, loaded in other shapes ------------------------------------------

RANK = """
import json, os, sys, warnings
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchdata.stateful_dataloader import StatefulDataLoader
from blobsdk.torch import BlobDataset, BlobIterableDataset, BlobSampler, BlobStorageReader, BlobStorageWriter, DataState

warnings.simplefilter("error")
warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
warnings.filterwarnings("ignore", "This DataLoader will create 3 worker processes", UserWarning)
store, work, phase, workers = sys.argv[1:5]
rank, world_size, workers = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(workers)
dist.init_process_group("gloo", init_method=f"file://{work}/pg-{phase}", rank=rank, world_size=world_size)
with open(f"{work}/paths.json") as f:
    paths = json.load(f)
ds = BlobIterableDataset.local(store, paths, shuffle=True, seed=3, prefetch_window=None)  # rank and world size: dist's
mapped = BlobDataset.local(store, paths)
sampler = BlobSampler(mapped, shuffle=True, seed=3)
loaders = {
    "iterable": StatefulDataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list),
    "sampled": StatefulDataLoader(mapped, sampler=sampler, num_workers=workers, batch_size=4, collate_fn=list),
}

def read(batches):
    return [path for batch in batches for path, _ in batch]

out = {}
if phase == "old":  # epoch 2, stopped part-way, saved with the model
    ds.set_epoch(2)
    sampler.set_epoch(2)
    running = {name: iter(loader) for name, loader in loaders.items()}
    out = {name: read([next(batches) for _ in range(3 + 2 * rank)]) for name, batches in running.items()}
    state = {"model": {"w": torch.arange(8.0)}, **{name: DataState(loader) for name, loader in loaders.items()}}
    with BlobStorageWriter.local(f"{work}/ck", "/ck/job") as writer:
        dcp.save(state, storage_writer=writer)
else:  # another shape: load, finish epoch 2, then epoch 3
    state = {"model": {"w": torch.zeros(8)}, **{name: DataState(loader) for name, loader in loaders.items()}}
    with BlobStorageReader.local(f"{work}/ck", "/ck/job") as reader:
        dcp.load(state, storage_reader=reader)
    ds.set_epoch(2)  # as a training loop does: the epoch the states name stays resumed
    sampler.set_epoch(2)
    out = {"model": state["model"]["w"].tolist(), **{name: read(loader) for name, loader in loaders.items()}}
    ds.set_epoch(3)
    sampler.set_epoch(3)
    out.update({f"next_{name}": read(loader) for name, loader in loaders.items()})
dist.destroy_process_group()
print(json.dumps(out))
"""


def run_ranks(store: Path, work: Path, phase: str, world_size: int, workers: int) -> list[dict[str, Any]]:
    """``RANK`` as ``world_size`` gloo ranks of ``workers`` DataLoader workers; each one's output."""
    return helpers.run_ranks(RANK, world_size, str(store), str(work), phase, str(workers))


def test_a_dcp_save_on_two_ranks_of_two_workers_finishes_its_epoch_as_three_by_one_and_one_by_three(
    store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    root, paths = store
    (tmp_path / "paths.json").write_text(json.dumps(paths))
    old = run_ranks(root, tmp_path, "old", world_size=2, workers=2)
    assert [len(out["iterable"]) for out in old] == [len(out["sampled"]) for out in old] == [12, 20]
    for world_size, workers in ((3, 1), (1, 3)):
        new = run_ranks(root, tmp_path, f"new{world_size}x{workers}", world_size, workers)
        assert all(out["model"] == list(range(8)) for out in new)
        for kind in KINDS:
            seen = flat(out[kind] for out in old + new)
            assert len(seen) == N and sorted(seen) == paths  # epoch 2: each sample once, over both jobs
            following = flat(out[f"next_{kind}"] for out in new)
            assert len(following) == N and sorted(following) == paths  # epoch 3: whole, in the new shape
