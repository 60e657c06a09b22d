"""blobsdk.torch: datasets read by real DataLoader worker processes over a real embedded store
(and, for L3 prefetch, a real local cluster)."""

from __future__ import annotations

import gc
import itertools
import json
import os
import pickle
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import blobsdk
from blobsdk.config import ClientConfig, L1Config, L2Config
from blobsdk.errors import InvalidPath
from blobsdk.integrations.reading import WindowPrefetch
from blobsdk.torch import BlobDataset, BlobIterableDataset, BlobSampler
from servers.cluster import start_cluster
from tests.helpers import until

N = 1200  # samples in the store
PREFIX = "/train/s/"
ADMIN = "torch-admin"

# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which torch 2.14 deprecates.
stateful = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
# Python >= 3.12 warns when a process with threads forks (the fork-safety tests do it on purpose).
forks_with_threads = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


def content(path: str) -> bytes:
    return f"bytes of {path}".encode() * 3


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """An embedded store holding N small samples; their sorted paths."""
    root = tmp_path_factory.mktemp("torch") / "store"
    paths = [f"{PREFIX}{i:05d}" for i in range(N)]
    with blobsdk.SyncClient.local(root) as c:
        c.put_many((p, content(p)) for p in paths)
    return root, paths


def order(loader: Iterable[list[Any]]) -> list[str]:
    """The paths of a DataLoader's batches (collate_fn=list), checking every sample's bytes."""
    out = []
    for batch in loader:
        for path, data in batch:
            assert type(data) is bytearray and data == content(path)
            out.append(path)
    return out


def loader(ds: Any, workers: int = 2, **kw: Any) -> DataLoader[Any]:
    return DataLoader(ds, num_workers=workers, **{"batch_size": 40, "collate_fn": list, **kw})


def flat(lists: Iterable[list[Any]]) -> list[Any]:
    return list(itertools.chain.from_iterable(lists))


def blobsdk_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "blobsdk-sync"}


# --- every sample once, in a seeded order ---------------------------------------------------------


def test_two_workers_read_every_sample_once_in_an_order_fixed_by_seed_and_epoch(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    ds = BlobIterableDataset.local(root, PREFIX, shuffle=True, seed=7, prefetch_window=128)
    first, again = order(loader(ds)), order(loader(ds))
    ds.set_epoch(1)
    other = order(loader(ds))
    assert sorted(first) == sorted(other) == paths  # each exactly once (len == N, no duplicates)
    assert first == again and other != first and first != paths


def test_the_order_is_a_permutation_of_the_whole_list_then_sharded(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    index = {p: i for i, p in enumerate(paths)}

    def rank0(seed: int, epoch: int) -> list[str]:
        ds = BlobIterableDataset.local(root, paths, shuffle=True, seed=seed, rank=0, world_size=3, prefetch_window=None)
        ds.set_epoch(epoch)
        return [p for p, _ in ds]

    a, b, c = rank0(1, 0), rank0(1, 1), rank0(2, 0)
    assert a == rank0(1, 0) and len({tuple(a), tuple(b), tuple(c)}) == 3
    assert set(a) != set(b) != set(c)  # a rank's share changes with the epoch: shuffled before the cut
    first = [index[p] for p in a[:40]]
    assert max(first) - min(first) > N // 2  # not a shuffle within a window of the list
    unshuffled = BlobIterableDataset.local(root, paths, rank=1, world_size=3, prefetch_window=None)
    assert [p for p, _ in unshuffled] == paths[1::3]


def test_set_epoch_reaches_persistent_workers(store: tuple[Path, list[str]]) -> None:
    root, _ = store
    ds = BlobIterableDataset.local(root, PREFIX, shuffle=True, seed=3)
    persistent = loader(ds, persistent_workers=True)
    epoch0 = order(persistent)
    ds.set_epoch(1)
    epoch1 = order(persistent)
    assert epoch1 != epoch0 and epoch1 == order(loader(ds))  # what fresh workers read in epoch 1


@forks_with_threads
def test_a_spawned_persistent_worker_gets_the_dataset_by_pickle_and_the_epoch_by_shared_memory(
    store: tuple[Path, list[str]],
) -> None:
    root, _ = store
    ds = BlobIterableDataset.local(root, PREFIX, shuffle=True, seed=3)
    spawned = loader(ds, workers=1, multiprocessing_context="spawn", persistent_workers=True)
    epoch0 = order(spawned)
    ds.set_epoch(1)
    assert order(spawned) == [p for p, _ in ds] != epoch0  # one worker reads as the main process does


# --- resume --------------------------------------------------------------------------------------


def run_and_save(dl: StatefulDataLoader[Any], after: int) -> tuple[list[list[str]], dict[str, Any]]:
    """Every batch of one epoch, and the loader's state once ``after`` batches were taken."""
    batches, state = [], None
    for i, batch in enumerate(dl):
        batches.append([p for p, _ in batch])
        if i + 1 == after:
            state = dl.state_dict()
    assert state is not None
    return batches, state


@stateful
@pytest.mark.parametrize("snapshot_every", [1, 4])
def test_a_resumed_iterable_epoch_yields_exactly_the_rest_in_order(store: tuple[Path, list[str]], snapshot_every: int) -> None:
    root, paths = store

    def stateful_loader(ds: BlobIterableDataset) -> StatefulDataLoader[Any]:
        return StatefulDataLoader(ds, num_workers=2, batch_size=32, collate_fn=list, snapshot_every_n_steps=snapshot_every)

    ds = BlobIterableDataset.local(root, PREFIX, shuffle=True, seed=11, prefetch_window=64)
    ds.set_epoch(2)
    batches, state = run_and_save(stateful_loader(ds), after=11)
    restarted = BlobIterableDataset.local(root, PREFIX, shuffle=True, seed=11, prefetch_window=64)  # epoch 0: the state says 2
    resumed = stateful_loader(restarted)
    resumed.load_state_dict(state)
    rest = [[p for p, _ in batch] for batch in resumed]
    assert rest == batches[11:] and sorted(flat(batches)) == paths


@stateful
@pytest.mark.parametrize("shuffled_by", ["BlobSampler", "the DataLoader's generator"])
def test_a_resumed_map_style_epoch_yields_exactly_the_rest_in_order(store: tuple[Path, list[str]], shuffled_by: str) -> None:
    root, paths = store

    def stateful_loader(ds: BlobDataset) -> StatefulDataLoader[Any]:
        if shuffled_by == "BlobSampler":
            sampler = BlobSampler(ds, shuffle=True, seed=5)
            sampler.set_epoch(1)
            return StatefulDataLoader(ds, sampler=sampler, num_workers=2, batch_size=32, collate_fn=list)
        generator = torch.Generator().manual_seed(5)
        return StatefulDataLoader(ds, shuffle=True, generator=generator, num_workers=2, batch_size=32, collate_fn=list)

    with BlobDataset.local(root, PREFIX) as ds:
        batches, state = run_and_save(stateful_loader(ds), after=13)
    with BlobDataset.local(root, PREFIX) as restarted:
        resumed = stateful_loader(restarted)
        resumed.load_state_dict(state)
        rest = [[p for p, _ in batch] for batch in resumed]
    assert rest == batches[13:] and sorted(flat(batches)) == paths and flat(batches) != paths


@stateful
def test_resuming_over_another_list_is_refused(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    ds = BlobIterableDataset.local(root, paths[:600])
    _, state = run_and_save(StatefulDataLoader(ds, num_workers=2, batch_size=32, collate_fn=list), after=3)
    other = StatefulDataLoader(BlobIterableDataset.local(root, paths[600:]), num_workers=2, batch_size=32, collate_fn=list)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot resume: the state was saved with fingerprint="):
        next(iter(other))
    with BlobDataset.local(root, paths[:600]) as ds600, BlobDataset.local(root, paths[600:]) as other600:
        with pytest.raises(ValueError, match="cannot resume: the state was saved with fingerprint="):
            other600.load_state_dict(ds600.state_dict())
        ds600.load_state_dict(ds600.state_dict())  # the same list: accepted


# --- ranks ---------------------------------------------------------------------------------------


def test_three_ranks_of_two_workers_cover_the_data_exactly_once(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    data = paths[:1001]
    shares = []
    for rank in range(3):
        ds = BlobIterableDataset.local(root, data, shuffle=True, seed=1, rank=rank, world_size=3)
        shares.append(order(loader(ds)))
        assert len(ds) == len(shares[-1])
    assert [len(s) for s in shares] == [334, 334, 333]
    assert sorted(flat(shares)) == data


def test_blob_sampler_ranks_cover_the_indices_exactly_once() -> None:
    samplers = [BlobSampler(range(1001), shuffle=True, seed=4, rank=r, world_size=3) for r in range(3)]
    for s in samplers:
        s.set_epoch(2)
    shares = [list(s) for s in samplers]
    assert [len(s) for s in shares] == [len(s) for s in samplers] == [334, 334, 333]
    assert sorted(flat(shares)) == list(range(1001)) and flat(shares) != list(range(1001))
    samplers[0].set_epoch(3)
    assert list(samplers[0]) != shares[0]


def test_rank_and_world_size_default_to_torch_distributed_then_the_environment(
    store: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root, paths = store

    def rank_of() -> tuple[object, object]:
        state = BlobIterableDataset.local(root, paths[:10]).state_dict()
        return state["rank"], state["world_size"]

    assert rank_of() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rank_of() == (2, 4) and len(BlobIterableDataset.local(root, paths[:10])) == 2
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert rank_of() == (0, 1)  # an initialised process group wins over the environment
    finally:
        dist.destroy_process_group()


# --- items ---------------------------------------------------------------------------------------


def decode(sample: tuple[str, bytearray]) -> tuple[str, bytes, int]:
    path, data = sample
    return path, bytes(data).upper(), os.getpid()


def test_the_transform_is_applied_in_the_workers(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    iterable = BlobIterableDataset.local(root, paths[:300], transform=decode)
    with BlobDataset.local(root, paths[:300], transform=decode) as mapped:
        for ds in (iterable, mapped):
            items = [item for batch in loader(ds) for item in batch]
            assert sorted(p for p, _, _ in items) == paths[:300]
            assert all(data == content(p).upper() for p, data, _ in items)
            assert os.getpid() not in {pid for _, _, pid in items} and len({pid for _, _, pid in items}) == 2
        assert mapped[5] == (paths[5], content(paths[5]).upper(), os.getpid())


# --- processes and clients -------------------------------------------------------------------------


def test_datasets_pickle_without_a_client(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    ds = BlobIterableDataset.local(root, paths[:50], shuffle=True)
    ds.set_epoch(3)
    running = iter(ds)
    next(running)  # a client is open in this process
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.epoch == 3 and [p for p, _ in copy] == [p for p, _ in ds]
    copy.set_epoch(4)
    assert ds.epoch == 3  # a pickled copy has an epoch of its own
    running.close()
    with BlobDataset.local(root, paths[:50]) as mapped:
        assert mapped[0][0] == paths[0]  # open
        twin = pickle.loads(pickle.dumps(mapped))
        assert bytes(twin[1][1]) == content(paths[1])
        twin.close()


@forks_with_threads
def test_a_dataset_whose_client_was_opened_in_the_parent_works_in_forked_workers(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    with BlobDataset.local(root, paths) as mapped:
        assert mapped[0] == (paths[0], bytearray(content(paths[0])))  # the parent's client is open
        assert sorted(order(loader(mapped, multiprocessing_context="fork"))) == paths
        assert mapped[1] == (paths[1], bytearray(content(paths[1])))  # and still works here
    iterable = BlobIterableDataset.local(root, paths, shuffle=True)
    running = iter(iterable)
    head = [next(running)[0] for _ in range(10)]  # mid-iteration in the parent
    assert sorted(order(loader(iterable, multiprocessing_context="fork"))) == paths
    assert head + [p for p, _ in running] == [p for p, _ in iterable]


def test_one_client_per_process_lives_from_epoch_to_epoch_until_the_dataset_closes(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    before = blobsdk_threads()
    ds = BlobIterableDataset.local(root, paths[:100], prefetch_window=10)
    assert len(list(ds)) == 100 and len(blobsdk_threads() - before) == 1  # exhausted: the client stays
    running = iter(ds)
    next(running)
    running.close()
    assert len(list(ds)) == 100 and len(blobsdk_threads() - before) == 1  # the same client, epoch after epoch
    ds.close()
    assert blobsdk_threads() == before
    with ds:
        assert len(list(ds)) == 100  # opens again
    assert blobsdk_threads() == before
    iterated = BlobIterableDataset.local(root, paths[:10])
    assert len(list(iterated)) == 10
    del iterated
    gc.collect()
    assert blobsdk_threads() == before  # garbage-collected: closed
    mapped = BlobDataset.local(root, paths[:100])
    assert mapped[0][0] == paths[0]
    assert len(blobsdk_threads() - before) == 1
    mapped.close()
    assert blobsdk_threads() == before
    assert mapped[1][0] == paths[1]  # opens again
    del mapped
    gc.collect()
    assert blobsdk_threads() == before  # garbage-collected: closed


def l4_reads(ds: BlobIterableDataset) -> int:
    return int(ds._client.get().stats()["l4"]["hits"])


def test_an_epoch_ending_starts_reading_the_next_one(store: tuple[Path, list[str]]) -> None:
    """Its first ``readahead`` samples are read while the last ones are handed out, and the
    next iteration takes them over: each sample read once an epoch, in the right order."""
    root, paths = store
    n, depth = 100, 8
    with BlobIterableDataset.local(root, paths[:n], l1=L1Config(capacity_bytes=0), shuffle=True, readahead=depth) as ds:
        first = [p for p, _ in ds]
        until(lambda: l4_reads(ds) == n + depth)  # epoch 1's head, read before it starts
        ds.set_epoch(1)
        second = [p for p, _ in ds]
        assert sorted(second) == sorted(first) and second != first
        assert second == epoch_order(root, paths[:n], 1)
        until(lambda: l4_reads(ds) == 2 * n + depth)  # no sample of epoch 1 read twice
        ds.set_epoch(5)  # not the epoch guessed: epoch 2's head is dropped, 5 is read from the start
        assert [p for p, _ in ds] == epoch_order(root, paths[:n], 5)
        until(lambda: l4_reads(ds) == 3 * n + 2 * depth)


def test_unshuffled_epochs_read_the_same_order_ahead(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    with BlobIterableDataset.local(root, paths[:50], l1=L1Config(capacity_bytes=0), readahead=4) as ds:
        assert [p for p, _ in ds] == paths[:50]
        assert [p for p, _ in ds] == paths[:50]  # no set_epoch: the same order, its head read ahead
        until(lambda: l4_reads(ds) == 2 * 50 + 4)


def epoch_order(root: Path, paths: list[str], epoch: int) -> list[str]:
    """Epoch ``epoch``'s order, as a fresh dataset reads it."""
    with BlobIterableDataset.local(root, paths, shuffle=True) as ds:
        ds.set_epoch(epoch)
        return [p for p, _ in ds]


def test_the_prefetch_runs_one_window_ahead_and_stops_with_the_iteration(tmp_path: Path) -> None:
    paths = [f"/w/{i:03d}" for i in range(250)]
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put_many((p, content(p)) for p in paths)
        with WindowPrefetch(c, paths, 100, "l1") as prefetch:
            prefetch.enter(0)
            assert list(prefetch.running) == [0, 1]  # the first window entered is warmed too
            assert prefetch.running[0].wait().chunks_done == 100
            prefetch.enter(99)
            assert list(prefetch.running) == [0, 1]
            prefetch.enter(100)
            handles = dict(prefetch.running)
            assert list(handles) == [1, 2]
            assert [h.wait().chunks_done for h in handles.values()] == [100, 50]  # window 2 is the last 50
            prefetch.enter(200)  # the last window: nothing beyond it, and window 1 is behind
            assert list(prefetch.running) == [2]
        assert prefetch.running == {}
        assert c.stats()["l1"]["cache_entries"] == 250  # each sample is one chunk
        with WindowPrefetch(c, paths, 100, "l1") as resumed:
            resumed.enter(150)  # a resumed iteration enters window 1 first
            assert list(resumed.running) == [1, 2]


# --- bad arguments -------------------------------------------------------------------------------


BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"rank": 1}, ValueError, "pass both rank and world_size or neither, got rank=1, world_size=None"),
    ({"rank": 3, "world_size": 3}, ValueError, "rank must be an int in [0, 3), got 3"),
    ({"rank": -1, "world_size": 3}, ValueError, "rank must be an int in [0, 3), got -1"),
    ({"rank": True, "world_size": 3}, ValueError, "rank must be an int in [0, 3), got True"),
    ({"rank": 0, "world_size": 0}, ValueError, "world_size must be an int >= 1, got 0"),
    ({"rank": 0, "world_size": "2"}, ValueError, "world_size must be an int >= 1, got '2'"),
    ({"shuffle": 1}, ValueError, "shuffle must be a bool, got 1"),
    ({"seed": 1.5}, ValueError, "seed must be an int, got 1.5"),
    ({"readahead": 0}, ValueError, "readahead must be an int >= 1, got 0"),
    ({"readahead_bytes": 0}, ValueError, "readahead_bytes must be an int >= 1, got 0"),
    ({"prefetch_window": 0}, ValueError, "prefetch_window must be an int >= 1 or None, got 0"),
    ({"prefetch_tier": "l4"}, ValueError, "prefetch_tier must be 'auto', 'l1', 'l2', 'l3' or None, got 'l4'"),
    ({"prefetch_tier": "l3"}, ValueError, "prefetch_tier 'l3' is not configured for this store; configured: 'l1'"),
    ({"transform": "upper"}, TypeError, "transform must be callable or None, not str"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_a_clear_error(
    store: tuple[Path, list[str]], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    root, _ = store
    with pytest.raises(error) as raised:
        BlobIterableDataset.local(root, PREFIX, **kwargs)
    assert str(raised.value) == message


BAD_SOURCES: list[tuple[object, type[Exception], str]] = [
    (
        "/train/s/00001",
        ValueError,
        "paths_or_prefix must be a list of blob paths or a prefix ending in '/', got '/train/s/00001'",
    ),
    (7, TypeError, "paths_or_prefix must be a list of blob paths or a prefix string, not int"),
    ([], ValueError, "paths_or_prefix is an empty list"),
    ("/train/none/", ValueError, "no blobs under '/train/none/'"),
]


@pytest.mark.parametrize(("source", "error", "message"), BAD_SOURCES)
@pytest.mark.parametrize("kind", [BlobIterableDataset, BlobDataset])
def test_bad_paths_are_refused(store: tuple[Path, list[str]], kind: Any, source: object, error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        kind.local(store[0], source)
    assert str(raised.value) == message
    with pytest.raises(InvalidPath):
        kind.local(store[0], ["/train/s/00001", "relative"])


def test_bad_configs_are_refused(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"config": 3}, TypeError, "config must be a ClientConfig or a client.toml path, not int"),
        (
            {"config": ClientConfig()},
            ValueError,
            "config names no stores (api_url or metadata_url): use .local(DIR, ...) for an embedded store",
        ),
        (
            {"config": ClientConfig(api_url="http://127.0.0.1:1", block_urls=("http://127.0.0.1:2",)), "local": root},
            ValueError,
            "local= is the embedded store: its config must name no servers",
        ),
    ]
    for kind in (BlobIterableDataset, BlobDataset):
        for kwargs, error, message in cases:
            with pytest.raises(error) as raised:
                kind(paths_or_prefix=paths, **kwargs)
            assert str(raised.value) == message
    with pytest.raises(ValueError) as raised:
        BlobIterableDataset.local(
            root, paths, l1=L1Config(capacity_bytes=0), l2=L2Config(dir=str(root / "l2")), prefetch_tier="l1"
        )
    assert str(raised.value) == "prefetch_tier 'l1' is not configured for this store; configured: 'l2'"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "the environment sets RANK but not WORLD_SIZE"),
        ({"WORLD_SIZE": "2"}, "the environment sets WORLD_SIZE but not RANK"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "environment variable RANK must be an int, got 'one'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank must be an int in [0, 2), got 2"),
    ],
)
def test_a_bad_rank_environment_is_refused(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        BlobSampler(range(10))
    assert str(raised.value) == message


def test_bad_epochs_and_states_are_refused(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    ds = BlobIterableDataset.local(root, paths[:100], seed=1)
    sampler = BlobSampler(range(100), seed=1)
    good, good_sampler = ds.state_dict(), sampler.state_dict()
    iterable = "this BlobIterableDataset has"
    cases: list[tuple[Any, Any, str]] = [
        (ds.set_epoch, -1, "epoch must be an int >= 0, got -1"),
        (sampler.set_epoch, "1", "epoch must be an int >= 0, got '1'"),
        (ds.load_state_dict, [], "a BlobIterableDataset state is a dict, got list"),
        (
            ds.load_state_dict,
            {"epoch": 0},
            "not a BlobIterableDataset state: missing fingerprint, rank, samples, seed, shuffle, worker, workers, world_size,"
            " yielded",
        ),
        (ds.load_state_dict, {**good, "seed": 2}, f"cannot resume: the state was saved with seed=2, {iterable} seed=1"),
        (ds.load_state_dict, {**good, "workers": 2}, f"cannot resume: the state was saved with workers=2, {iterable} workers=1"),
        (ds.load_state_dict, {**good, "yielded": 101}, "cannot resume: yielded=101 is not in [0, 100]"),
        (ds.load_state_dict, {**good, "epoch": -2}, "epoch must be an int >= 0, got -2"),
        (
            sampler.load_state_dict,
            {**good_sampler, "world_size": 2},
            "cannot resume: the state was saved with world_size=2, this BlobSampler has world_size=1",
        ),
        (sampler.load_state_dict, {**good_sampler, "yielded": "3"}, "cannot resume: yielded='3' is not in [0, 100]"),
    ]
    for call, argument, message in cases:
        with pytest.raises(ValueError) as raised:
            call(argument)
        assert str(raised.value) == message
    with BlobDataset.local(root, paths[:100]) as mapped, pytest.raises(ValueError) as raised:
        mapped.load_state_dict({"samples": 100})
    assert str(raised.value) == "not a BlobDataset state: missing fingerprint"


def test_a_state_loaded_in_one_worker_is_refused_by_another(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    ds = BlobIterableDataset.local(root, paths[:100])
    ds.load_state_dict({**ds.state_dict(), "yielded": 10})  # here: "worker 0 of 1"
    with pytest.raises(ValueError) as raised:
        next(iter(loader(ds)))
    assert (
        str(raised.value)
        .splitlines()[-1]
        .endswith(
            "cannot resume: the state was loaded in DataLoader worker 0 of 1 and is iterated in worker 0 of 2"
            " (load each worker's state in that worker, as StatefulDataLoader does)"
        )
    )
    resumed = [p for p, _ in ds]  # where it was loaded it resumes
    assert resumed == [p for p, _ in BlobIterableDataset.local(root, paths[:100])][10:]


def test_a_resumed_sampler_and_dataset_report_their_position(store: tuple[Path, list[str]]) -> None:
    root, paths = store
    sampler = BlobSampler(range(50), shuffle=True)
    running = iter(sampler)
    taken = [next(running) for _ in range(20)]
    state = sampler.state_dict()
    assert (state["epoch"], state["yielded"]) == (0, 20)
    fresh = BlobSampler(range(50), shuffle=True)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and taken + list(fresh) == list(BlobSampler(range(50), shuffle=True))
    ds = BlobIterableDataset.local(root, paths[:50], shuffle=True)
    ds.set_epoch(1)
    assert {k: ds.state_dict()[k] for k in ("epoch", "yielded")} == {"epoch": 1, "yielded": 0}
    items = iter(ds)
    head = [next(items)[0] for _ in range(7)]
    saved = ds.state_dict()
    items.close()
    assert (saved["epoch"], saved["yielded"]) == (1, 7)
    again = BlobIterableDataset.local(root, paths[:50], shuffle=True)
    again.load_state_dict(saved)
    assert head + [p for p, _ in again] == [p for p, _ in ds]


# --- L3 prefetch from workers, on a real cluster ----------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with start_cluster(tmp_path_factory.mktemp("cluster"), block_servers=1, l3_nodes=1, admin_token=ADMIN, trackers=0) as cluster:
        yield cluster


def node_stats(cluster: Any) -> dict[str, Any]:
    (node,) = (p.url for p in cluster.processes if p.kind == "l3")
    with urllib.request.urlopen(f"{node}/stats", timeout=10) as answer:
        return json.load(answer)  # type: ignore[no-any-return]


def set_block_faults(cluster: Any, rules: list[dict[str, Any]]) -> None:
    (block,) = (p.url for p in cluster.processes if p.kind == "block")
    body = json.dumps({"rules": rules, "seed": 1}).encode()
    headers = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"{block}/admin/faults", data=body, headers=headers, method="PUT")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def slowly(sample: tuple[str, bytearray]) -> tuple[str, bytearray]:
    time.sleep(0.003)  # a training step's worth of work, so the prefetch can run ahead
    return sample


def test_workers_prefetch_their_next_windows_into_l3(cluster: Any) -> None:
    paths = [f"/l3/{i:04d}" for i in range(1000)]
    with blobsdk.SyncClient(cluster.config) as c:
        c.put_many((p, content(p)) for p in paths)
    before = node_stats(cluster)
    ds = BlobIterableDataset(
        cluster.config_path, "/l3/", shuffle=True, seed=0, readahead=4, prefetch_window=100, transform=slowly
    )
    assert sorted(order(loader(ds))) == paths
    after = node_stats(cluster)
    jobs = after["jobs"]["kept"] - before["jobs"]["kept"]
    hits = after["requests"]["hits"] - before["requests"]["hits"]
    misses = after["requests"]["misses"] - before["requests"]["misses"]
    assert jobs == 10  # 2 workers x windows 0..4 of their 500 samples: one hydrate job each
    # Every sample once, plus at most each worker's next-epoch head (readahead=4), started as
    # its iteration ended and cancelled when the worker exited.
    assert 1000 <= hits + misses <= 1000 + 2 * 4
    assert hits >= 400, (hits, misses)  # windows 1..4 were (mostly: 800 of 800 when quiet) in L3 before their reads


def test_stopping_an_iteration_cancels_its_l3_prefetch(cluster: Any) -> None:
    paths = [f"/slow/{i:04d}" for i in range(200)]
    with blobsdk.SyncClient(cluster.config) as c:
        c.put_many((p, content(p)) for p in paths)
    ds = BlobIterableDataset(cluster.config, "/slow/", prefetch_window=100, readahead=2)
    set_block_faults(cluster, [{"route": "/v1/blocks", "methods": ["GET"], "latency_ms": 300}])
    try:
        running = iter(ds)
        assert [next(running)[0] for _ in range(3)] == paths[:3]
        assert node_stats(cluster)["jobs"]["running"] == 2  # windows 0 and 1: 100 chunks each at 300 ms, 8 at a time
        running.close()
        assert node_stats(cluster)["jobs"]["running"] == 0
    finally:
        set_block_faults(cluster, [])


# --- the peer tier between DataLoader workers ------------------------------------------------------


def test_two_loaders_reading_one_dataset_at_once_feed_each_other_through_their_workers_peers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two jobs' DataLoaders (2 workers each: 4 processes, each with its own client and peer
    server) read the same samples at about the same time, as two ranks would."""
    with start_cluster(tmp_path_factory.mktemp("peers"), block_servers=1, l3_nodes=0, trackers=1) as cluster:
        paths = [f"/shared/{i:04d}" for i in range(400)]
        with blobsdk.SyncClient(cluster.config) as c:
            c.put_many((p, content(p)) for p in paths)
        first, second = (loader(BlobIterableDataset(cluster.config_path, "/shared/", readahead=4)) for _ in range(2))
        seen = [order([a, b]) for a, b in zip(first, second, strict=True)]
        assert sorted(flat(seen)) == sorted(paths * 2)  # every sample, twice, every byte checked
        (tracker,) = (p.url for p in cluster.processes if p.kind == "tracker")
        with urllib.request.urlopen(f"{tracker}/stats", timeout=10) as answer:
            counts = json.load(answer)["counts"]
        assert counts["peers_registered"] >= 5, counts  # 4 workers, the writer, and the parent's listing clients
        assert counts.get("located_peer", 0) >= 50 and counts.get("reports_missing", 0) <= 20, counts  # from a peer that had it
