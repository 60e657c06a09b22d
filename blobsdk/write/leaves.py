"""A checkpoint's state as leaves and back (blobsdk/write/checkpoint.py): a nested dict
flattened into named leaves (numpy arrays, CPU tensors, bytes, JSON), each with the flat bytes
to chunk; and the state rebuilt from a manifest and its data, every stored dtype and shape
checked before use."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .._extras import requires_extra
from ..errors import CorruptData
from .manifest import Entry, Kind


class Stamp:
    """What says a tensor still holds the bytes it held at an earlier save, if its version
    counter is trusted (``trust_version_counters``, blobsdk/write/checkpoint.py): the same
    storage (by identity, held weakly: a storage freed and its address reused is another one),
    at the same address, of the same size, viewed at the same offset, shape, strides and dtype,
    and a version counter (bumped by every in-place op on the tensor or a view of it) that has
    not moved."""

    __slots__ = ("_key", "_storage")

    def __init__(self, tensor: Any) -> None:
        storage = tensor.untyped_storage()
        self._storage = weakref.ref(storage)
        shape, stride = tuple(tensor.shape), tensor.stride()
        self._key = (storage.data_ptr(), storage.nbytes(), tensor._version, tensor.storage_offset(), shape, stride, tensor.dtype)

    def same(self, other: Stamp | None) -> bool:
        if other is None or other._key != self._key:
            return False
        storage = self._storage()
        return storage is not None and storage is other._storage()


@dataclass
class Leaf:
    name: tuple[str, ...]
    kind: Kind
    dtype: str = ""
    shape: tuple[int, ...] = ()
    value: bytes = b""
    data: memoryview | None = None  # the bytes to chunk, flat
    stamp: Stamp | None = None  # a tensor's (None: an inference tensor, which has no version counter)


_JSON_SCALARS = (type(None), bool, int, float, str)


def flatten(state: Mapping[str, Any], name: tuple[str, ...]) -> Iterator[Leaf]:
    if not isinstance(state, Mapping):
        raise TypeError(f"a checkpoint state is a dict of str keys, got {type(state).__name__}")
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state key {key!r} at {'/'.join(name) or 'the root'}: keys must be str")
        here = (*name, key)
        if isinstance(value, Mapping):
            yield from flatten(value, here)
        else:
            yield _leaf(here, value)


def _leaf(name: tuple[str, ...], value: Any) -> Leaf:
    where = "/".join(name)
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        return _array_leaf(name, value)
    if module == "torch" or module.startswith("torch."):
        return _tensor_leaf(name, value)
    if isinstance(value, bytes | bytearray | memoryview):
        return Leaf(name, "bytes", data=memoryview(value).cast("B"))
    problem = _json_problem(value, "")
    if problem is None:
        return Leaf(name, "json", value=msgspec.json.encode(value))
    at, what = problem
    if at:  # a list (of lists) holding something that is not JSON
        raise TypeError(f"state {where!r}: cannot checkpoint the list: its item {at} is {what}")
    if isinstance(value, float):
        raise TypeError(f"state {where!r}: cannot checkpoint {what}")
    raise TypeError(
        f"state {where!r}: cannot checkpoint a {type(value).__name__}"
        " (numpy arrays, CPU torch tensors, bytes, and JSON scalars (finite floats) or lists of them)"
    )


def _json_problem(value: Any, at: str) -> tuple[str, str] | None:
    """None if ``value`` is JSON that loads back equal (scalars, finite floats, and lists of
    them), else where in it (``[2]``, ``[0][1]``; ``""``: itself) and what is wrong."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (at, f"{value!r}, a float that is not finite (JSON has no nan or inf)")
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (problem := _json_problem(item, f"{at}[{i}]")) is not None:
                return problem
        return None
    kind = type(value).__name__
    return at, f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} (a list holds JSON scalars (finite floats) or lists of them)"


def _array_leaf(name: tuple[str, ...], value: Any) -> Leaf:
    import numpy as np

    if not isinstance(value, np.ndarray):
        value = np.asarray(value)  # a numpy scalar
    if value.dtype.hasobject or value.dtype.fields is not None:
        raise TypeError(f"state {'/'.join(name)!r}: cannot checkpoint a numpy array of dtype {value.dtype} (objects or fields)")
    flat: Any = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    return Leaf(name, "ndarray", dtype=value.dtype.str, shape=tuple(value.shape), data=memoryview(flat))


def _tensor_leaf(name: tuple[str, ...], value: Any) -> Leaf:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"state {'/'.join(name)!r}: cannot checkpoint a {type(value).__name__}")
    if value.device.type != "cpu" or value.is_sparse or value.is_quantized:
        where = "/".join(name)
        raise TypeError(f"state {where!r}: only dense CPU tensors can be checkpointed, got {value.device} {value.layout}")
    with requires_extra("torch", "checkpointing a torch tensor"):  # its bytes are read through numpy
        import numpy  # noqa: F401
    stamp = None if value.is_inference() else Stamp(value)  # before its bytes are read
    flat: Any = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    dtype = str(value.dtype).removeprefix("torch.")
    return Leaf(name, "tensor", dtype=dtype, shape=tuple(value.shape), data=memoryview(flat), stamp=stamp)


def put(state: MutableMapping[str, Any], name: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``name`` in ``state``, making the dicts on the way as needed."""
    node = state
    for key in name[:-1]:
        node = node.setdefault(key, {})
    node[name[-1]] = value


def value_of(entry: Entry, piece: memoryview) -> Any:
    """The leaf ``entry`` names, over its bytes ``piece``.  The dtype and shape come from
    stored data, so they are checked before use: a dtype name must name a dtype (never any
    other attribute of torch or numpy), and the shape must hold exactly the bytes."""
    if entry.kind == "bytes":
        return bytes(piece)
    if entry.kind == "ndarray":
        with requires_extra("numpy", "loading a checkpoint that holds numpy arrays"):
            import numpy as np

        return np.frombuffer(piece, dtype=_numpy_dtype(entry)).reshape(_shape(entry, piece))
    with requires_extra("torch", "loading a checkpoint that holds tensors"):
        import torch

    dtype = getattr(torch, entry.dtype, None) if entry.dtype.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise CorruptData(f"checkpoint leaf {'/'.join(entry.name)!r}: {entry.dtype!r} is not a torch dtype")
    shape = _shape(entry, piece, dtype.itemsize)
    if not piece.nbytes:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(piece, dtype=torch.uint8).view(dtype).reshape(shape)


def _numpy_dtype(entry: Entry) -> Any:
    import numpy as np

    try:
        dtype = np.dtype(entry.dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.hasobject or dtype.fields is not None:
        raise CorruptData(f"checkpoint leaf {'/'.join(entry.name)!r}: {entry.dtype!r} is not a plain numpy dtype")
    return dtype


def _shape(entry: Entry, piece: memoryview, itemsize: int | None = None) -> tuple[int, ...]:
    """``entry.shape``, if it holds exactly ``piece``'s bytes."""
    if itemsize is None:
        itemsize = _numpy_dtype(entry).itemsize
    if any(n < 0 for n in entry.shape) or math.prod(entry.shape) * itemsize != piece.nbytes:
        where = "/".join(entry.name)
        raise CorruptData(f"checkpoint leaf {where!r}: shape {list(entry.shape)} does not hold its {piece.nbytes} bytes")
    return entry.shape
