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
from tests.test_checkpoint import assert_same, model


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
