"""Restore in place (``Checkpoints.load(into=state)``, blobsdk/write/checkpoint.py): the saved
state read into the caller's own numpy arrays and CPU tensors, as DCP's load does, each leaf's
chunks straight into the leaf's memory (one scatter read through the tiers), with no fresh
memory and no copy after the read.

The rule, checked for every leaf the load reads (all, or those ``select`` accepts) before
anything is read, so a refusal changes nothing:

- an array or tensor leaf whose name ``into`` holds is filled in place, if what is there is the
  same kind (a numpy array for an array, a torch tensor for a tensor: else TypeError) with the
  same dtype and shape, C-contiguous, writable (numpy's flag; a tensor has none) and, for a
  tensor, a dense CPU one (else ValueError).  A filled tensor's version counter is bumped, as
  an in-place op's write would be (autograd sees it, and so does ``trust_version_counters``);
- an array or tensor leaf ``into`` lacks is read into fresh memory (as ``load`` without
  ``into`` does) and set in it, nested dicts made as needed;
- a bytes or JSON leaf is set in ``into``, replacing what is there (TypeError if that is an
  array, a tensor or a dict);
- a name whose parent in ``into`` is not a dict: TypeError.

Leaves of ``into`` that the load does not read are left as they are.  ``load`` returns
``into``.  If the read fails part-way, the arrays it was filling hold part of the checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple

import msgspec

from ..errors import BadRequest, CorruptData
from ..runtime.buffers import fresh_buffer
from ..wire import ChunkRef, ReadPlan
from . import patch
from .leaves import put, value_of
from .manifest import Entry, Manifest

_MISSING: Any = object()
_KINDS = {"ndarray": "a numpy array", "tensor": "a tensor", "bytes": "bytes", "json": "JSON"}


class _Place(NamedTuple):
    """An array or tensor of ``into`` to fill, and its memory (flat bytes)."""

    value: Any
    memory: memoryview


async def restore(manifest: Manifest, plan: ReadPlan, into: Any, read: Callable[[list[memoryview]], Awaitable[None]]) -> None:
    """Fill ``into`` with the leaves of ``manifest``, whose data blob's ``plan`` ``read``
    scatters into one buffer per entry (per chunk, and per patch record, for an entry with
    patches: the patches are applied once all is read); see the module docstring."""
    if not isinstance(into, MutableMapping):
        raise TypeError(f"into must be a dict (the state to fill), got {type(into).__name__}")
    places = [_place(manifest.step, entry, _lookup(manifest.step, entry, into)) for entry in manifest.entries]
    records = [_records(manifest, entry, plan) for entry in manifest.entries]
    wanted = sum(
        entry.nbytes + sum(sum(chunk) for chunk in chunk_records)
        for entry, chunk_records in zip(manifest.entries, records, strict=True)
    )
    if wanted != plan.size:
        raise BadRequest(f"checkpoint {manifest.step}: its data is {plan.size} bytes, its manifest names {wanted}")
    fresh = fresh_buffer(sum(entry.nbytes for entry, place in zip(manifest.entries, places, strict=True) if place is None))
    scratch = fresh_buffer(sum(sum(sum(chunk) for chunk in chunk_records) for chunk_records in records))
    outs: list[memoryview] = []
    patched: list[tuple[memoryview, list[memoryview]]] = []  # a chunk's memory, its patch records
    at = used = 0
    memories = []
    for entry, place, chunk_records in zip(manifest.entries, places, records, strict=True):
        if place is None:
            memory, at = fresh[at : at + entry.nbytes], at + entry.nbytes
        else:
            memory = place.memory
        memories.append(memory)
        if not entry.patches:
            outs.append(memory)
            continue
        for i, sizes in enumerate(chunk_records):
            chunk = memory[i * manifest.chunk_size : (i + 1) * manifest.chunk_size]
            mine = []
            for size in sizes:
                mine.append(scratch[used : used + size])
                used += size
            outs += [chunk, *mine]
            if mine:
                patched.append((chunk, mine))
    await read(outs)
    for chunk, mine in patched:
        for record in mine:
            patch.apply(record, chunk)
    for entry, place, memory in zip(manifest.entries, places, memories, strict=True):
        if place is None:
            put(into, entry.name, msgspec.json.decode(entry.value) if entry.kind == "json" else value_of(entry, memory))
        elif entry.kind == "tensor":
            _written(place.value)


def _records(manifest: Manifest, entry: Entry, plan: ReadPlan) -> list[list[int]]:
    """The sizes of each chunk's patch records (none: []), checked against the plan: a
    chunk's base refs must hold exactly its bytes."""
    if not entry.patches:
        return []
    out = []
    for i, (span, count) in enumerate(zip(entry.chunk_refs(), entry.patch_counts(), strict=True)):
        refs = [plan.chunks[k] for k in span]
        base = sum(ref.raw_length for ref in refs[: len(refs) - count])
        length = min(manifest.chunk_size, entry.nbytes - i * manifest.chunk_size)
        if base != length or count > len(refs):
            raise CorruptData(
                f"checkpoint {manifest.step} leaf {'/'.join(entry.name)!r}: chunk {i}'s refs do not hold its {length} bytes"
            )
        out.append([ref.raw_length for ref in refs[len(refs) - count :]])
    return out


def selected(manifest: Manifest, plan: ReadPlan, select: Callable[[tuple[str, ...]], bool]) -> tuple[Manifest, ReadPlan]:
    """The manifest of only the entries ``select`` accepts, and the plan of only their chunks."""
    entries: list[Entry] = []
    chunks: list[ChunkRef] = []
    for entry in manifest.entries:
        if not select(entry.name):
            continue
        entries.append(msgspec.structs.replace(entry, first=len(chunks)))
        chunks.extend(plan.chunks[entry.first : entry.first + entry.ref_count()])
    size = sum(ref.raw_length for ref in chunks)
    return msgspec.structs.replace(manifest, entries=tuple(entries)), msgspec.structs.replace(
        plan, chunks=tuple(chunks), size=size
    )


def _lookup(step: int, entry: Entry, into: MutableMapping[str, Any]) -> Any:
    """What ``into`` holds at ``entry``'s name (``_MISSING``: nothing)."""
    node: Any = into
    for depth, key in enumerate(entry.name[:-1], 1):
        node = node.get(key, _MISSING)
        if node is _MISSING:
            return _MISSING
        if not isinstance(node, MutableMapping):
            where, parent = "/".join(entry.name), "/".join(entry.name[:depth])
            raise TypeError(f"checkpoint {step} leaf {where!r}: into's {parent!r} is {_a(node)}, not a dict")
    return node.get(entry.name[-1], _MISSING)


def _place(step: int, entry: Entry, value: Any) -> _Place | None:
    """Where ``entry``'s bytes go: ``value``'s memory, or None (fresh memory, or set as is)."""
    kind = _kind_of(value)
    if value is _MISSING or (entry.kind in ("bytes", "json") and kind is None):
        return None
    where = f"checkpoint {step} leaf {'/'.join(entry.name)!r}"
    if kind != entry.kind:
        raise TypeError(f"{where}: it is {_KINDS[entry.kind]}, into has {_a(value)}")
    problem = _array_problem(entry, value) if kind == "ndarray" else _tensor_problem(entry, value)
    if problem:
        raise ValueError(f"{where}: {problem}")
    memory = _array_memory(value) if kind == "ndarray" else _tensor_memory(value)
    if memory.nbytes != entry.nbytes:
        raise CorruptData(f"{where}: shape {list(entry.shape)} does not hold its {entry.nbytes} bytes")
    return _Place(value, memory)


def problem(entry: Entry, value: Any) -> str:
    """Why ``value`` cannot take ``entry``'s bytes in place ("" if it can); for blobsdk.dcp."""
    kind = _kind_of(value)
    if kind != entry.kind:
        return f"it is {_KINDS[entry.kind]}, into has {_a(value)}"
    return _array_problem(entry, value) if kind == "ndarray" else _tensor_problem(entry, value)


def _kind_of(value: Any) -> str | None:
    """ "ndarray", "tensor", "dict", or None (anything else); without importing numpy or torch."""
    if isinstance(value, MutableMapping):
        return "dict"
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "ndarray"
    if torch is not None and isinstance(value, torch.Tensor):
        return "tensor"
    return None


def _array_problem(entry: Entry, value: Any) -> str:
    if value.dtype.str != entry.dtype or tuple(value.shape) != entry.shape:
        return _differ(entry, value.dtype.str, value.shape, "array")
    if not value.flags.c_contiguous:
        return "into's array is not contiguous"
    if not value.flags.writeable:
        return "into's array is read-only"
    return ""


def _tensor_problem(entry: Entry, value: Any) -> str:
    import torch

    if value.device.type != "cpu" or value.layout != torch.strided or value.is_quantized:
        return f"into's tensor is not a dense CPU tensor ({value.device}, {value.layout})"
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype != entry.dtype or tuple(value.shape) != entry.shape:
        return _differ(entry, dtype, value.shape, "tensor")
    if not value.is_contiguous():
        return "into's tensor is not contiguous"
    if value.is_conj() or value.is_neg():
        return "into's tensor is a lazy conjugate or negation (resolve_conj() or resolve_neg() it first)"
    return ""


def _differ(entry: Entry, dtype: str, shape: Any, noun: str) -> str:
    return f"it is a {entry.dtype} {noun} of shape {list(entry.shape)}, into has a {dtype} one of shape {list(shape)}"


def _array_memory(value: Any) -> memoryview:
    import numpy as np

    return memoryview(value.reshape(-1).view(np.uint8))


def _tensor_memory(value: Any) -> memoryview:
    import torch

    return memoryview(value.detach().reshape(-1).view(torch.uint8).numpy())


def _written(tensor: Any) -> None:
    """Bump ``tensor``'s version counter, as an in-place op that wrote it would have."""
    import torch

    if not tensor.is_inference():  # an inference tensor has no counter
        torch.autograd.graph.increment_version(tensor)


def _a(value: Any) -> str:
    kind = _kind_of(value)
    if kind == "ndarray":
        return "a numpy array"
    if kind is not None:
        return f"a {kind}"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
