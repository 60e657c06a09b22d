"""blobsdk/write/restore.py and the version stamps of blobsdk/write/checkpoint.py: a checkpoint
restored into the caller's own arrays and tensors (``load(into=...)``), and a save that trusts
torch's version counters to skip hashing tensors that did not change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

import blobsdk
from tests.write.test_checkpoint import CHUNK, assert_same, model


def zeroed(state: dict[str, Any]) -> dict[str, Any]:
    """A state shaped like ``state``: its arrays and tensors zeroed, numpy scalars as 0-d
    arrays, the rest left out."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out[key] = zeroed(value)
        elif isinstance(value, np.ndarray | np.generic):
            out[key] = np.zeros_like(np.asarray(value))
        elif isinstance(value, torch.Tensor):
            out[key] = torch.zeros_like(value)
    return out


def named(state: dict[str, Any], at: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf of ``state`` by its name."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in state.items():
        out.update(named(value, (*at, key)) if isinstance(value, dict) else {(*at, key): value})
    return out


def address(array: np.ndarray | torch.Tensor) -> int:
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data_ptr()


async def test_a_state_restores_into_the_callers_own_arrays_and_tensors(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/into")
    state = model()
    await (await ck.save(1, state)).wait()
    into = zeroed(state)
    del into["optim"]["bf"]  # missing: read into fresh memory and set
    into["mine"] = np.ones(3)  # not in the checkpoint: left alone
    arrays = named(into)
    addresses = {name: address(a) for name, a in arrays.items()}
    versions = {name: t._version for name, t in into["optim"].items()}
    assert await ck.load(into=into) is into
    after = named(into)
    assert all(after[name] is a for name, a in arrays.items())  # the same objects, filled in place
    assert {name: address(after[name]) for name in arrays} == addresses
    assert len(arrays) == 7 and into["model"]["w"] is arrays["model", "w"] and into["optim"]["t"] is arrays["optim", "t"]
    assert {name: into["optim"][name]._version for name in versions} == {"t": versions["t"] + 1}  # a write, for autograd
    assert np.array_equal(into.pop("mine"), np.ones(3))
    assert_same(state, into)  # every leaf: the filled ones, the fresh one, bytes and JSON set


async def test_select_with_into_fills_only_the_selected_leaves(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/into-select")
    state = model()
    await (await ck.save(1, state)).wait()
    into = zeroed(state)
    await ck.load(into=into, select=lambda name: name[0] == "model")
    assert_same(state["model"], into["model"])
    assert set(into) == {"model", "optim"} and not into["optim"]["t"].any()  # nothing else read or set


def _replace(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(into: dict[str, Any]) -> None:
        node = into
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _read_only(shape: tuple[int, ...]) -> np.ndarray:
    array = np.zeros(shape, dtype=np.float32)
    array.flags.writeable = False
    return array


W = (512, 256)  # model()'s weights
REFUSED = [
    (("model",), 5, TypeError, "checkpoint 1 leaf 'model/w': into's 'model' is an int, not a dict"),
    (("model", "w"), torch.zeros(W), TypeError, "checkpoint 1 leaf 'model/w': it is a numpy array, into has a tensor"),
    (("model", "w"), {}, TypeError, "checkpoint 1 leaf 'model/w': it is a numpy array, into has a dict"),
    (("model", "w"), None, TypeError, "checkpoint 1 leaf 'model/w': it is a numpy array, into has a NoneType"),
    (("optim", "t"), np.zeros((3, 4)), TypeError, "checkpoint 1 leaf 'optim/t': it is a tensor, into has a numpy array"),
    (("blob",), np.zeros(3), TypeError, "checkpoint 1 leaf 'blob': it is bytes, into has a numpy array"),
    (("step",), torch.zeros(1), TypeError, "checkpoint 1 leaf 'step': it is JSON, into has a tensor"),
    (
        ("model", "w"),
        np.zeros(W, np.float64),
        ValueError,
        "checkpoint 1 leaf 'model/w': it is a <f4 array of shape [512, 256], into has a <f8 one of shape [512, 256]",
    ),
    (
        ("model", "w"),
        np.zeros((256, 512), np.float32),
        ValueError,
        "checkpoint 1 leaf 'model/w': it is a <f4 array of shape [512, 256], into has a <f4 one of shape [256, 512]",
    ),
    (("model", "w"), np.zeros(W[::-1], np.float32).T, ValueError, "checkpoint 1 leaf 'model/w': into's array is not contiguous"),
    (("model", "w"), _read_only(W), ValueError, "checkpoint 1 leaf 'model/w': into's array is read-only"),
    (
        ("optim", "t"),
        torch.zeros(3, 4, dtype=torch.float64),
        ValueError,
        "checkpoint 1 leaf 'optim/t': it is a float32 tensor of shape [3, 4], into has a float64 one of shape [3, 4]",
    ),
    (("optim", "t"), torch.zeros(4, 3).T, ValueError, "checkpoint 1 leaf 'optim/t': into's tensor is not contiguous"),
    (
        ("optim", "t"),
        torch.zeros(3, 4, device="meta"),
        ValueError,
        "checkpoint 1 leaf 'optim/t': into's tensor is not a dense CPU tensor (meta, torch.strided)",
    ),
    (
        ("c",),
        torch.zeros(2, dtype=torch.complex64).conj(),
        ValueError,
        "checkpoint 1 leaf 'c': into's tensor is a lazy conjugate or negation (resolve_conj() or resolve_neg() it first)",
    ),
]


@pytest.mark.parametrize(("path", "value", "error", "message"), REFUSED, ids=[m.split(": ", 1)[1] for *_, m in REFUSED])
async def test_a_state_that_cannot_take_the_checkpoint_in_place_is_refused_before_anything_is_read(
    client: blobsdk.Client, path: tuple[str, ...], value: Any, error: type[Exception], message: str
) -> None:
    ck = client.checkpoints("/ck/into-refused")
    state = {**model(), "c": torch.ones(2, dtype=torch.complex64)}
    await (await ck.save(1, state)).wait()
    into = zeroed(state)
    _replace(path, value)(into)
    before = set(into)
    with pytest.raises(error) as caught:
        await ck.load(into=into)
    assert str(caught.value) == message
    assert set(into) == before and not into["optim"]["bf"].any()  # nothing read (every check comes first), nothing set


async def test_into_must_be_a_dict(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/into-list")
    await (await ck.save(1, {"a": np.ones(2)})).wait()
    with pytest.raises(TypeError) as caught:
        await ck.load(into=[np.zeros(2)])  # type: ignore[arg-type]
    assert str(caught.value) == "into must be a dict (the state to fill), got list"


async def test_a_stored_shape_that_does_not_hold_the_bytes_is_corrupt_data_in_place_too(client: blobsdk.Client) -> None:
    from blobsdk.write.manifest import Manifest

    ck = client.checkpoints("/ck/into-corrupt")
    await (await ck.save(1, {"t": torch.arange(8, dtype=torch.float32)})).wait()
    path = "/ck/into-corrupt/000000000001/manifest"
    manifest = msgspec.msgpack.decode(await client.get(path), type=Manifest)
    entries = tuple(msgspec.structs.replace(e, shape=(3, 3)) for e in manifest.entries)
    await client.put(path, msgspec.msgpack.encode(msgspec.structs.replace(manifest, entries=entries)))
    into = {"t": torch.zeros(3, 3)}
    with pytest.raises(blobsdk.CorruptData) as caught:
        await ck.load(1, into=into)
    assert str(caught.value) == "checkpoint 1 leaf 't': shape [3, 3] does not hold its 32 bytes"
    assert not into["t"].any()


def test_the_blocking_twin_restores_in_place(tmp_path: Any) -> None:
    with blobsdk.SyncClient.local(tmp_path) as client:
        ck = client.checkpoints("/ck/into-sync")
        ck.save(1, {"w": torch.arange(6.0)}).wait()
        into = {"w": torch.zeros(6)}
        target = into["w"]
        assert ck.load(into=into)["w"] is target and torch.equal(target, torch.arange(6.0))


# --- trust_version_counters: a tensor whose stamp did not change is not hashed again ------------

MiB = 1 << 20


def tensors(seed: int = 0) -> dict[str, Any]:
    """64 MiB of tensors, a numpy array (always hashed) and an inference tensor (no counter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        frozen = torch.ones(CHUNK // 4)
    return {
        "layers": {f"l{i}": torch.randn(4 * MiB, generator=generator) for i in range(4)},
        "n": np.arange(CHUNK // 8, dtype=np.int64),
        "frozen": frozen,
    }


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes every call of the chunk hash is given, counted apart from ``hashed_bytes``."""
    import blobsdk.write.stage as module

    calls: list[int] = []
    real = module._hash

    def counting(data: memoryview, starts: range, chunk_size: int) -> list[bytes]:
        calls.append(sum(len(data[s : s + chunk_size]) for s in starts))
        return real(data, starts, chunk_size)

    monkeypatch.setattr(module, "_hash", counting)
    return calls


@pytest.mark.parametrize("trust", [True, False])
async def test_with_trust_an_unchanged_tensor_is_not_hashed_again_and_a_changed_one_is(
    client: blobsdk.Client, hashed: list[int], trust: bool
) -> None:
    ck = client.checkpoints("/ck/stamps", trust_version_counters=trust)
    state = tensors()
    always = 2 * CHUNK  # the numpy array and the inference tensor: no counter to trust
    await (await ck.save(1, state)).wait()
    assert ck.hashed_bytes == sum(hashed) == 64 * MiB + always
    second = await (await ck.save(2, state)).wait()
    assert ck.hashed_bytes - (64 * MiB + always) == (always if trust else 64 * MiB + always)
    assert second.new_bytes == 0
    with torch.no_grad():
        state["layers"]["l2"][5] += 1.0  # one chunk of one tensor
    before = ck.hashed_bytes
    third = await (await ck.save(3, state)).wait()
    assert ck.hashed_bytes - before == (16 * MiB + always if trust else 64 * MiB + always) and sum(hashed) == ck.hashed_bytes
    assert third.new_bytes == CHUNK
    assert_same(state, await ck.load(3))


WRITES: list[tuple[str, Callable[[torch.Tensor], None], bool, bool]] = [
    # (how, the write, whether the tensor's counter moves, whether a save with trust sees it)
    ("in place under no_grad", lambda t: t.add_(1.0), True, True),
    ("through detach()", lambda t: t.detach().add_(1.0), True, True),
    ("through a view", lambda t: t[3:].add_(1.0), True, True),
    ("its data swapped (t.data = ...)", lambda t: setattr(t, "data", torch.full_like(t, 7.0)), False, True),  # another storage
    ("through .data", lambda t: t.data.add_(1.0), False, False),  # .data has a counter of its own
    ("through a numpy view", lambda t: t.numpy().__iadd__(1.0), False, False),
]


@pytest.mark.parametrize(("write", "moves", "seen"), [w[1:] for w in WRITES], ids=[w[0] for w in WRITES])
@pytest.mark.parametrize("trust", [True, False])
async def test_only_writes_that_move_the_version_counter_or_the_storage_are_seen_with_trust(
    client: blobsdk.Client, write: Callable[[torch.Tensor], None], moves: bool, seen: bool, trust: bool
) -> None:
    """What trust_version_counters costs: a write that bypasses the tensor's counter (through
    ``.data``, or a numpy view) goes unseen, the tensor's chunks are reused from the last save
    unread.  Without trust every save hashes, and sees every write."""
    ck = client.checkpoints("/ck/bypass", trust_version_counters=trust)
    t = torch.zeros(2 * CHUNK // 4)
    await (await ck.save(1, {"t": t})).wait()
    version = t._version
    with torch.no_grad():
        write(t)
    assert (t._version != version) is moves and t.any()
    await (await ck.save(2, {"t": t})).wait()
    saved = (await ck.load(2))["t"]
    assert torch.equal(saved, t) is (seen or not trust)
    assert (not saved.any()) is (trust and not seen)  # unseen: checkpoint 2 still holds the zeros


async def test_a_write_to_the_numpy_array_a_tensor_was_made_from_goes_unseen_with_trust(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/from-numpy", trust_version_counters=True)
    source = np.zeros(CHUNK // 4, dtype=np.float32)
    state = {"t": torch.from_numpy(source)}
    await (await ck.save(1, state)).wait()
    source[0] = 1.0  # the tensor's memory, but not through it: its counter does not move
    await (await ck.save(2, state)).wait()
    assert float((await ck.load(2))["t"][0]) == 0.0  # stale: the documented caveat
    await (await client.checkpoints("/ck/from-numpy").save(3, state)).wait()  # without trust: hashed
    assert float((await ck.load(3))["t"][0]) == 1.0


async def test_stamps_count_only_against_the_checkpoint_this_object_committed(client: blobsdk.Client) -> None:
    """Another writer's save in between is the base of the next one: nothing in it was
    stamped by this object, so everything is hashed (and the checkpoint is exact)."""
    mine = client.checkpoints("/ck/two-writers", trust_version_counters=True)
    state = {"t": torch.zeros(2 * CHUNK // 4)}
    await (await mine.save(1, state)).wait()
    other = {"t": torch.ones(2 * CHUNK // 4)}
    await (await client.checkpoints("/ck/two-writers", trust_version_counters=True).save(2, other)).wait()
    before = mine.hashed_bytes
    await (await mine.save(3, state)).wait()
    assert mine.hashed_bytes - before == 2 * CHUNK
    assert_same(state, await mine.load(3))


async def test_a_restore_in_place_counts_as_a_write_for_the_next_save(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/restore-then-save", trust_version_counters=True)
    state = {"t": torch.zeros(2 * CHUNK // 4)}
    await (await ck.save(1, state)).wait()
    with torch.no_grad():
        state["t"].add_(1.0)
    await (await ck.save(2, state)).wait()
    await ck.load(1, into=state)  # back to zeros, in place: the counter moves
    await (await ck.save(3, state)).wait()
    assert torch.equal((await ck.load(3))["t"], torch.zeros(2 * CHUNK // 4))
