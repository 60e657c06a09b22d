"""Elastic resume: an epoch stopped in one shape of ranks and workers finishes in another, each
sample exactly once (blobsdk/integrations/elastic.py, through BlobSampler and
BlobIterableDataset, the latter with real DataLoader workers)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import blobsdk
from blobsdk.integrations import elastic
from blobsdk.integrations.order import Position, Sharding
from blobsdk.torch import BlobDataset, BlobIterableDataset, BlobSampler, states_of
from tests import helpers

PROPERTIES = settings(max_examples=300, derandomize=True, deadline=None)
SEED = 3
IDENTITY = {"samples": 0, "shuffle": True, "seed": SEED, "fingerprint": "f"}  # "samples" set per case

# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which torch 2.14 deprecates.
stateful = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def flat(lists: Iterable[list[Any]]) -> list[Any]:
    return list(itertools.chain.from_iterable(lists))


def take(items: Iterator[Any], n: int) -> list[Any]:
    return [next(items) for _ in range(n)]


# --- the global view, against a brute-force set computation ---------------------------------------


def slots(world_size: int, workers: int) -> list[tuple[int, int]]:
    return [(rank, worker) for rank in range(world_size) for worker in range(workers)]


def share_of(samples: int, shuffle: bool, epoch: int, slot: tuple[int, int], shape: tuple[int, int], consumed: Any) -> list[int]:
    sharding = Sharding(samples, shuffle, SEED, slot[0], shape[0])
    position = Position(epoch, 0, (slot[1], shape[1]), consumed)
    indices = elastic.indices(sharding, position)
    assert elastic.count(sharding, position) == len(indices)
    return indices


@PROPERTIES
@given(
    data=st.data(),
    samples=st.integers(1, 60),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
    shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3)), min_size=2, max_size=4),
)
def test_an_epoch_stopped_in_any_shapes_finishes_in_another_each_sample_once(
    data: st.DataObject, samples: int, shuffle: bool, epoch: int, shapes: list[tuple[int, int]]
) -> None:
    rest = Sharding(samples, shuffle, SEED, 0, 1).order(epoch).tolist()  # what is left, in order
    handed: list[int] = []
    consumed: tuple[elastic.Generation, ...] = ()
    for shape in shapes[:-1]:  # each shape hands out a prefix of each (rank, worker)'s share, then stops
        states = []
        for slot in slots(*shape):
            share = share_of(samples, shuffle, epoch, slot, shape, consumed)
            assert share == rest[slot[0] :: shape[0]][slot[1] :: shape[1]]
            yielded = data.draw(st.integers(0, len(share)))
            handed += share[:yielded]
            position = Position(epoch, yielded, (slot[1], shape[1]), consumed)
            place = {"rank": slot[0], "world_size": shape[0], "worker": slot[1], "workers": shape[1]}
            states.append({**IDENTITY, "samples": samples, **place, **elastic.position_state(position)})
        states = data.draw(st.permutations(states))
        got_epoch, consumed = elastic.gather(
            states, {**IDENTITY, "samples": samples}, "BlobIterableDataset", samples, by_worker=True
        )
        assert got_epoch == epoch and len(consumed) == len(states[0].get("consumed", [])) + 1
        gone = set(handed)
        rest = [i for i in rest if i not in gone]
    last = shapes[-1]
    finals = [share_of(samples, shuffle, epoch, slot, last, consumed) for slot in slots(*last)]
    assert finals == [rest[r :: last[0]][k :: last[1]] for r, k in slots(*last)]
    assert sorted(handed + flat(finals)) == list(range(samples))  # every sample exactly once


# --- the map-style sampler ------------------------------------------------------------------------


def samplers(n: int, world_size: int, epoch: int) -> list[BlobSampler]:
    out = [BlobSampler(range(n), shuffle=True, seed=SEED, rank=rank, world_size=world_size) for rank in range(world_size)]
    for sampler in out:
        sampler.set_epoch(epoch)
    return out


def test_a_sampler_epoch_stopped_on_two_ranks_finishes_on_three_then_on_one() -> None:
    n = 101
    old = samplers(n, 2, epoch=4)
    taken = [take(iter(sampler), k) for sampler, k in zip(old, (17, 30), strict=True)]
    states = [sampler.state_dict() for sampler in old]
    new = samplers(n, 3, epoch=0)  # the epoch is the states'
    for sampler in new:
        sampler.load_state_dict(states)
    lengths = [len(sampler) for sampler in new]
    running = [iter(sampler) for sampler in new]
    heads = [take(it, 5) for it in running]
    middle = [sampler.state_dict() for sampler in new]
    assert all(len(state["consumed"]) == 1 and state["epoch"] == 4 for state in middle)
    tails = [list(it) for it in running]
    assert lengths == [5 + len(tail) for tail in tails] and sum(lengths) == n - 47
    assert sorted(flat(taken) + flat(heads) + flat(tails)) == list(range(n))

    for rank, state in enumerate(middle):  # a state taken in the resumed epoch resumes in place...
        again = samplers(n, 3, epoch=0)[rank]
        again.load_state_dict(state)
        assert again.state_dict() == state and list(again) == tails[rank]
    one = samplers(n, 1, epoch=0)[0]  # ... and in yet another shape
    one.load_state_dict(middle)
    assert len(one) == n - 47 - 15 and sorted(one) == sorted(flat(tails))
    assert one.state_dict()["consumed"] == [*middle[0]["consumed"], {"world_size": 3, "workers": 1, "yielded": [5, 5, 5]}]

    for sampler in new:  # the next epoch: a whole permutation in the new shape
        sampler.set_epoch(5)
    assert [list(sampler) for sampler in new] == [Sharding(n, True, SEED, rank, 3).indices(5) for rank in range(3)]
    assert sorted(flat(list(sampler) for sampler in new)) == list(range(n)) and [len(s) for s in new] == [34, 34, 33]


def test_a_single_state_resumes_as_before_and_an_epoch_not_yet_started_resumes_whole() -> None:
    old = samplers(40, 2, epoch=1)
    states = [sampler.state_dict() for sampler in old]  # neither started
    assert "consumed" not in states[0]
    new = samplers(40, 4, epoch=0)
    for sampler in new:
        sampler.load_state_dict(states)
    assert sorted(flat(list(sampler) for sampler in new)) == list(range(40))


# --- refusals, each with its exact message ----------------------------------------------------------


def sampler_states() -> tuple[BlobSampler, dict[str, Any], dict[str, Any]]:
    old = samplers(100, 2, epoch=3)
    for sampler, k in zip(old, (10, 20), strict=True):
        take(iter(sampler), k)
    a, b = (sampler.state_dict() for sampler in old)
    here = BlobSampler(range(100), shuffle=True, seed=SEED, rank=0, world_size=3)
    return here, a, b


GENERATION = {"world_size": 1, "workers": 1, "yielded": [5]}
SAMPLER_REFUSALS: list[tuple[str, Any, str]] = [
    ("one rank", lambda a, b: [a], "cannot resume: missing rank 1 of 2"),
    ("a rank twice", lambda a, b: [a, a], "cannot resume: two states of rank 0 of 2"),
    ("two epochs", lambda a, b: [{**a, "epoch": 4}, b], "cannot resume: the states are from epochs 3 and 4"),
    (
        "another seed",
        lambda a, b: [a, {**b, "seed": 2}],
        "cannot resume: the state was saved with seed=2, this BlobSampler has seed=3",
    ),
    (
        "another list",
        lambda a, b: [a, {**b, "samples": 99}],
        "cannot resume: the state was saved with samples=99, this BlobSampler has samples=100",
    ),
    (
        "no shuffle",
        lambda a, b: [a, {**b, "shuffle": False}],
        "cannot resume: the state was saved with shuffle=False, this BlobSampler has shuffle=True",
    ),
    ("two world sizes", lambda a, b: [a, {**b, "world_size": 3}], "cannot resume: the states were saved with world_size=2 and 3"),
    ("a rank out of range", lambda a, b: [a, {**b, "rank": 2}], "cannot resume: a state has rank=2, not an int in [0, 2)"),
    ("no world", lambda a, b: [a, {**b, "world_size": 0}], "cannot resume: a state has world_size=0, not an int >= 1"),
    ("too many yielded", lambda a, b: [a, {**b, "yielded": 51}], "cannot resume: yielded=51 of rank 1 of 2 is not in [0, 50]"),
    (
        "yielded not an int",
        lambda a, b: [a, {**b, "yielded": 1.0}],
        "cannot resume: yielded=1.0 of rank 1 of 2 is not in [0, 50]",
    ),
    ("not a state", lambda a, b: [a, 5], "a BlobSampler state is a dict, got int"),
    ("no state", lambda a, b: [], "a BlobSampler state is a dict, got list"),
    (
        "a state lacking keys",
        lambda a, b: [a, {"epoch": 3}],
        "not a BlobSampler state: missing rank, samples, seed, shuffle, world_size, yielded",
    ),
    (
        "different resumes",
        lambda a, b: [a, {**b, "consumed": [GENERATION]}],
        "cannot resume: the states come from different resumes of their epoch: nothing before one,"
        " 5 samples by 1x1 (ranks x workers) before another",
    ),
    ("consumed not a list", lambda a, b: [a, {**b, "consumed": GENERATION}], "cannot resume: consumed must be a list, got dict"),
    (
        "a bad consumed entry",
        lambda a, b: [a, {**b, "consumed": [{"world_size": 1}]}],
        "cannot resume: {'world_size': 1} is not a consumed entry (world_size, workers and yielded counts)",
    ),
    (
        "consumed counts of the wrong shape",
        lambda a, b: [a, {**b, "consumed": [{**GENERATION, "yielded": [1, 2]}]}],
        "cannot resume: {'world_size': 1, 'workers': 1, 'yielded': [1, 2]} is not a consumed entry"
        " (world_size, workers and yielded counts)",
    ),
    (
        "too many consumed",
        lambda a, b: [a, {**b, "consumed": [{**GENERATION, "yielded": [101]}]}],
        "cannot resume: yielded=101 of rank 0 of 1 is not in [0, 100]",
    ),
]


@pytest.mark.parametrize(("case", "states", "message"), SAMPLER_REFUSALS, ids=[case for case, _, _ in SAMPLER_REFUSALS])
def test_a_sampler_refuses_states_that_do_not_make_one_epoch_of_this_list(case: str, states: Any, message: str) -> None:
    here, a, b = sampler_states()
    with pytest.raises(ValueError) as raised:
        here.load_state_dict(states(a, b))
    assert str(raised.value) == message
    here.load_state_dict([a, b])  # the good set: accepted
    assert len(here) == len(range(0, 70, 3))


def test_gathering_no_state_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        elastic.gather([], IDENTITY, "BlobIterableDataset", 10, by_worker=True)
    assert str(raised.value) == "cannot resume from an empty list of states"


def test_a_single_state_of_a_resumed_epoch_is_checked_too() -> None:
    here, a, _ = sampler_states()
    resumed = {**a, "world_size": 3, "consumed": [{**GENERATION, "yielded": [70]}], "yielded": 11}
    with pytest.raises(ValueError) as raised:
        here.load_state_dict(resumed)
    assert str(raised.value) == "cannot resume: yielded=11 is not in [0, 10]"  # 30 left, 10 of them rank 0's
    here.load_state_dict({**resumed, "yielded": 10})
    assert len(here) == 10 and list(here) == []


# --- the iterable dataset, with real DataLoader workers ----------------------------------------------

N = 120  # samples in the store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("elastic") / "store"
    paths = [f"/train/e/{i:04d}" for i in range(N)]
    with blobsdk.SyncClient.local(root) as client:
        client.put_many((path, path.encode()) for path in paths)
    return root, paths


def dataset(root: Path, paths: list[str], rank: int, world_size: int) -> BlobIterableDataset:
    return BlobIterableDataset.local(root, paths, shuffle=True, seed=SEED, rank=rank, world_size=world_size, prefetch_window=None)


def read(batches: Iterable[list[Any]]) -> list[str]:
    out = []
    for batch in batches:
        for path, data in batch:
            assert data == path.encode()
            out.append(path)
    return out


def stopped_rank(root: Path, paths: list[str], rank: int, after: int) -> tuple[list[str], list[Any]]:
    """Rank ``rank`` of 2, with 2 workers, in epoch 2: the paths it delivered in its first
    ``after`` batches, and its workers' states then (as its StatefulDataLoader saved them)."""
    ds = dataset(root, paths, rank, 2)
    ds.set_epoch(2)
    loader = StatefulDataLoader(ds, num_workers=2, batch_size=4, collate_fn=list, snapshot_every_n_steps=1)
    delivered, state = [], None
    for i, batch in enumerate(loader):
        if i < after:
            delivered += read([batch])
        if i + 1 == after:
            state = loader.state_dict()
    assert state is not None
    return delivered, states_of(state)


@stateful
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning")  # on a 2-core machine
@pytest.mark.parametrize(("world_size", "workers"), [(3, 1), (1, 3)])
def test_an_iterable_epoch_stopped_on_two_ranks_of_two_workers_finishes_in_another_shape(
    store: tuple[Path, list[str]], world_size: int, workers: int
) -> None:
    root, paths = store
    (seen0, states0), (seen1, states1) = stopped_rank(root, paths, 0, after=3), stopped_rank(root, paths, 1, after=6)
    states = [states1[1], states0[0], states1[0], states0[1]]  # any order
    rest, lengths = [], []
    for rank in range(world_size):
        ds = dataset(root, paths, rank, world_size)
        ds.load_state_dict(states)  # in the main process, before the DataLoader is made
        assert ds.epoch == 2 and ds.state_dict()["consumed"] == [
            {"world_size": 2, "workers": 2, "yielded": [8, 4, 12, 12]}
        ]  # batches of 4, round robin
        lengths.append(len(ds))
        rest.append(read(DataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list)))
        ds.set_epoch(3)
        rest.append(read(DataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list)))
    resumed, following = flat(rest[0::2]), flat(rest[1::2])
    assert lengths == [len(r) for r in rest[0::2]] and sum(lengths) == N - 36
    assert len(seen0 + seen1 + resumed) == N and sorted(seen0 + seen1 + resumed) == paths  # every sample of epoch 2 once
    assert len(following) == N and sorted(following) == paths  # epoch 3: a whole permutation in the new shape


def test_a_state_taken_in_a_resumed_iterable_epoch_resumes_in_place_and_elsewhere(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    old = [dataset(root, paths, rank, 2) for rank in range(2)]
    heads = [take(iter(ds), k) for ds, k in zip(old, (7, 40), strict=True)]
    states = [d.state_dict() for d in old]
    whole = dataset(root, paths, 0, 1)
    whole.load_state_dict(states)
    ds = dataset(root, paths, 0, 1)
    ds.load_state_dict(states)
    items = iter(ds)
    head = take(items, 5)
    state = ds.state_dict()
    items.close()
    again = dataset(root, paths, 0, 1)
    again.load_state_dict(state)
    tail = [path for path, _ in again]
    assert head + [(path, bytearray(path.encode())) for path in tail] == list(whole) and len(tail) == N - 52
    assert sorted([p for p, _ in flat(heads) + head] + tail) == paths
    halves = [dataset(root, paths, rank, 2) for rank in range(2)]
    for half in halves:
        half.load_state_dict([state])
    assert sorted(flat([path for path, _ in half] for half in halves)) == sorted(tail)


def sampler_loader(ds: BlobDataset, rank: int, world_size: int, epoch: int, workers: int = 2) -> StatefulDataLoader[Any]:
    sampler = BlobSampler(ds, shuffle=True, seed=SEED, rank=rank, world_size=world_size)
    sampler.set_epoch(epoch)
    return StatefulDataLoader(ds, sampler=sampler, num_workers=workers, batch_size=4, collate_fn=list)


def epoch_and_state(loader: StatefulDataLoader[Any], after: int) -> tuple[list[list[str]], dict[str, Any]]:
    """Every batch of one epoch, and the loader's state once ``after`` batches were taken."""
    batches, state = [], None
    for i, batch in enumerate(loader):
        batches.append(read([batch]))
        if i + 1 == after:
            state = loader.state_dict()
    assert state is not None
    return batches, state


@stateful
def test_a_map_style_epoch_through_stateful_loaders_finishes_on_three_ranks_and_their_states_resume(
    store: tuple[Path, list[str]],
) -> None:
    root, paths = store
    with BlobDataset.local(root, paths) as ds:
        saved = [epoch_and_state(sampler_loader(ds, rank, 2, epoch=1), after) for rank, after in ((0, 4), (1, 9))]
        seen = flat(flat(batches[:after]) for (batches, _), after in zip(saved, (4, 9), strict=True))
        # the sampler's state as of the last batch delivered (the live sampler runs ahead)
        states = flat(states_of(state) for _, state in saved)
        assert [state["yielded"] for state in states] == [16, 36]
        rest = []
        for rank in range(3):
            loader = sampler_loader(ds, rank, 3, epoch=0)
            loader.sampler.load_state_dict(states)  # type: ignore[attr-defined]
            batches, state = epoch_and_state(loader, after=2)
            assert len(loader) == len(batches)
            again = sampler_loader(ds, rank, 3, epoch=0)  # a state of the resumed epoch, through its loader
            again.load_state_dict(state)
            assert [read([batch]) for batch in again] == batches[2:]
            rest += flat(batches)
    assert len(seen + rest) == N and sorted(seen + rest) == paths


def test_an_iterable_refuses_an_incomplete_or_foreign_set_of_workers(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    here = dataset(root, paths[:100], 0, 3)
    base = {**dataset(root, paths[:100], 0, 2).state_dict(), "workers": 2, "epoch": 3}
    states = [{**base, "rank": r, "worker": k, "yielded": 3} for r in range(2) for k in range(2)]
    fingerprint = base["fingerprint"]
    cases: list[tuple[list[Any], str]] = [
        (states[1:], "cannot resume: missing worker 0 of 2 of rank 0 of 2"),
        ([*states[:3], states[2]], "cannot resume: two states of worker 0 of 2 of rank 1 of 2"),
        ([*states[:3], {**states[3], "workers": 3}], "cannot resume: the states were saved with workers=2 and 3"),
        ([*states[:3], {**states[3], "worker": 2}], "cannot resume: a state has worker=2, not an int in [0, 2)"),
        (
            [*states[:3], {**states[3], "yielded": 26}],
            "cannot resume: yielded=26 of worker 1 of 2 of rank 1 of 2 is not in [0, 25]",
        ),
        (
            [*states[:3], {**states[3], "fingerprint": "0"}],
            f"cannot resume: the state was saved with fingerprint='0', this BlobIterableDataset has fingerprint={fingerprint!r}",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError) as raised:
            here.load_state_dict(bad)
        assert str(raised.value) == message
    here.load_state_dict(states)
    assert len(here) == len(range(0, 88, 3))


# --- real gloo ranks, real DataLoader workers ------------------------------------------------------

RANK = """
import json, os, sys, warnings
import torch.distributed as dist
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from blobsdk.torch import BlobIterableDataset, BlobSampler, gather_states, states_of

warnings.simplefilter("error")
warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
warnings.filterwarnings("ignore", "This DataLoader will create 3 worker processes", UserWarning)
store, work, phase, workers = sys.argv[1:5]
rank, world_size, workers = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(workers)
dist.init_process_group("gloo", init_method=f"file://{work}/pg-{phase}", rank=rank, world_size=world_size)
with open(f"{work}/paths.json") as f:
    paths = json.load(f)
sampler = BlobSampler(range(len(paths)), shuffle=True, seed=3)  # rank and world size: torch.distributed's
ds = BlobIterableDataset.local(store, paths, shuffle=True, seed=3, prefetch_window=None)

def read(loader):
    return [path for batch in loader for path, _ in batch]

if phase == "old":  # epoch 2, stopped part-way
    sampler.set_epoch(2)
    ds.set_epoch(2)
    indices = iter(sampler)
    out = {"taken": [next(indices) for _ in range(10 + 7 * rank)], "seen": []}
    loader = StatefulDataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list, snapshot_every_n_steps=1)
    for i, batch in enumerate(loader):
        if i < 3 + 2 * rank:
            out["seen"] += [path for path, _ in batch]
        if i + 1 == 3 + 2 * rank:
            saved = states_of(loader.state_dict())
    out["sampler"] = gather_states(sampler.state_dict())
    out["iterable"] = gather_states(saved)
else:  # resumed in another shape, then the next epoch
    with open(f"{work}/states.json") as f:
        states = json.load(f)
    sampler.load_state_dict(states["sampler"])
    ds.load_state_dict(states["iterable"])
    out = {"taken": list(sampler), "seen": read(DataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list))}
    sampler.set_epoch(3)
    ds.set_epoch(3)
    out["next_taken"] = list(sampler)
    out["next_seen"] = read(DataLoader(ds, num_workers=workers, batch_size=4, collate_fn=list))
dist.destroy_process_group()
print(json.dumps(out))
"""


def run_ranks(store: Path, work: Path, phase: str, world_size: int, workers: int) -> list[dict[str, Any]]:
    """``RANK`` as ``world_size`` gloo ranks of ``workers`` DataLoader workers; each one's output."""
    return helpers.run_ranks(RANK, world_size, str(store), str(work), phase, str(workers))


def test_two_gloo_ranks_of_two_workers_stopped_mid_epoch_finish_it_as_three_by_one_and_one_by_three(
    store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    root, paths = store
    (tmp_path / "paths.json").write_text(json.dumps(paths))
    old = run_ranks(root, tmp_path, "old", world_size=2, workers=2)
    assert old[0]["sampler"] == old[1]["sampler"] and len(old[0]["sampler"]) == 2  # every rank has every state
    assert old[0]["iterable"] == old[1]["iterable"] and len(old[0]["iterable"]) == 4
    (tmp_path / "states.json").write_text(json.dumps({"sampler": old[0]["sampler"], "iterable": old[0]["iterable"]}))
    for world_size, workers in ((3, 1), (1, 3)):
        new = run_ranks(root, tmp_path, f"new{world_size}x{workers}", world_size, workers)
        taken = flat(out["taken"] for out in old + new)
        seen = flat(out["seen"] for out in old + new)
        assert len(taken) == N and sorted(taken) == list(range(N))  # epoch 2, each index once
        assert len(seen) == N and sorted(seen) == paths  # epoch 2, each sample once
        following = flat(out["next_taken"] for out in new)
        assert len(following) == N and sorted(following) == list(range(N))  # epoch 3: whole, in the new shape
        following_seen = flat(out["next_seen"] for out in new)
        assert len(following_seen) == N and sorted(following_seen) == paths
