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

Every chunk read (its patches applied) is checked against the xxh3-128 digest the manifest
holds for it, on the executor in ~16 MiB jobs (xxh3 releases the GIL): a mismatch is
CorruptData naming the checkpoint, the leaf and the chunk, and the leaves read into fresh
memory are not set in ``into``.  The read path has verified each ref's bytes against the
ref's own checksum already; this checks that the refs are the chunks that were saved.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Executor
from typing import Any, NamedTuple

import msgspec
import xxhash

from .._extras import requires_extra
from ..errors import BadRequest, CorruptData
from ..runtime import fresh_buffer, task_group
from ..wire import ChunkRef, ReadPlan
from . import patch
from .leaves import put, value_of
from .manifest import Entry, Manifest

_MISSING: Any = object()
_HASH_BATCH = 16 << 20  # bytes checked per executor job
_KINDS = {"ndarray": "a numpy array", "tensor": "a tensor", "bytes": "bytes", "json": "JSON"}


class _Place(NamedTuple):
    """An array or tensor of ``into`` to fill, and its memory (flat bytes)."""

    value: Any
    memory: memoryview


async def restore(
    manifest: Manifest,
    plan: ReadPlan,
    into: Any,
    read: Callable[[ReadPlan, list[memoryview]], Awaitable[None]],
    *,
    executor: Executor,
    where: str,
) -> None:
    """Fill ``into`` with the leaves of ``manifest``, whose data blob has ``plan``; ``read``
    scatters a plan into buffers, one after another (see :class:`_Reads`); the chunks are
    checked on ``executor``; ``where`` names the checkpoint in errors.  See the module
    docstring."""
    if not isinstance(into, MutableMapping):
        raise TypeError(f"into must be a dict (the state to fill), got {type(into).__name__}")
    places = [_place(manifest.step, entry, _lookup(manifest.step, entry, into)) for entry in manifest.entries]
    fresh = fresh_buffer(sum(entry.nbytes for entry, place in zip(manifest.entries, places, strict=True) if place is None))
    memories, at = [], 0
    for entry, place in zip(manifest.entries, places, strict=True):
        if place is None:
            memories.append(fresh[at : at + entry.nbytes])
            at += entry.nbytes
        else:
            memories.append(place.memory)
    await _Reads(manifest, plan, memories).run(plan, read)
    await _check_digests(manifest, memories, executor, where)
    for entry, place, memory in zip(manifest.entries, places, memories, strict=True):
        if place is None:
            put(into, entry.name, _json_of(entry, where) if entry.kind == "json" else value_of(entry, memory))
        elif entry.kind == "tensor":
            _written(place.value)


def _json_of(entry: Entry, where: str) -> Any:
    """A JSON leaf's value, from its manifest (another writer's data: CorruptData if it does not decode)."""
    try:
        return msgspec.json.decode(entry.value)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where} leaf {'/'.join(entry.name)!r}: its JSON value does not decode: {exc}") from exc


class _Reads:
    """What a restore reads: every chunk's base refs, in plan order, into the leaves' memory,
    and meanwhile the patch records (blobsdk/write/patch.py), in the order they are stored (one
    save's patches lie back to back in its blocks: few, large reads), into scratch memory; then
    each chunk's patches applied, oldest first.  Checked against the plan before anything is
    read.  Cost of the patches (a 1 GiB table after nine saves of 1% of its 512-byte rows:
    2304 records, ~190k runs): ~35 us a record to apply (``patch.apply``, ~80 ms in all, on the
    event loop's thread: a numpy row scatter, which holds the GIL)."""

    def __init__(self, manifest: Manifest, plan: ReadPlan, memories: list[memoryview]) -> None:
        self.bases: list[ChunkRef] = []
        self.base_outs: list[memoryview] = []
        self.patches: list[ChunkRef] = []
        self.chains: list[tuple[memoryview, range]] = []  # a chunk's memory, its patches' indexes
        where = f"checkpoint {manifest.step}"
        firsts = list(itertools.accumulate((entry.ref_count() for entry in manifest.entries), initial=0))
        if firsts[-1] != len(plan.chunks) or any(e.first != at for e, at in zip(manifest.entries, firsts, strict=False)):
            raise CorruptData(f"{where}: its manifest names {firsts[-1]} refs, its data plan holds {len(plan.chunks)}")
        if manifest.chunk_size < 1:
            raise CorruptData(f"{where}: its manifest's chunk size is {manifest.chunk_size}")
        for entry in manifest.entries:
            chunks = -(-entry.nbytes // manifest.chunk_size)
            if len(entry.digests) != chunks:
                name = "/".join(entry.name)
                raise CorruptData(f"{where} leaf {name!r}: its manifest lists {len(entry.digests)} digests for {chunks} chunks")
        for entry, memory in zip(manifest.entries, memories, strict=True):
            if not entry.patches:
                self.bases.extend(plan.chunks[entry.first : entry.first + entry.ref_count()])
                self.base_outs.append(memory)
                continue
            for i, (span, count) in enumerate(zip(entry.chunk_refs(), entry.patch_counts(), strict=True)):
                self._chunk(
                    plan.chunks[span.start : span.stop],
                    count,
                    memory[i * manifest.chunk_size : (i + 1) * manifest.chunk_size],
                    f"{where} leaf {'/'.join(entry.name)!r} chunk {i}",
                )
        size = sum(ref.raw_length for ref in self.bases) + sum(ref.raw_length for ref in self.patches)
        wanted = sum(entry.nbytes for entry in manifest.entries) + sum(ref.raw_length for ref in self.patches)
        if size != wanted:
            raise BadRequest(f"{where}: its data is {size} bytes, its manifest names {wanted}")

    def _chunk(self, held: tuple[ChunkRef, ...], count: int, memory: memoryview, where: str) -> None:
        """A chunk with ``count`` patches: its base refs and its patches, listed."""
        base = held[: len(held) - count]
        if count > len(held) or sum(ref.raw_length for ref in base) != len(memory):
            raise CorruptData(f"{where}: its base refs do not hold its {len(memory)} bytes")
        self.bases.extend(base)
        self.base_outs.append(memory)
        if count:
            self.chains.append((memory, range(len(self.patches), len(self.patches) + count)))
            self.patches.extend(held[len(held) - count :])

    async def run(self, plan: ReadPlan, read: Callable[[ReadPlan, list[memoryview]], Awaitable[None]]) -> None:
        if not self.patches:
            await read(plan, self.base_outs)
            return
        order = sorted(range(len(self.patches)), key=lambda k: (self.patches[k].block_id, self.patches[k].offset))
        scratch = fresh_buffer(sum(ref.raw_length for ref in self.patches))
        records: list[memoryview] = [memoryview(b"")] * len(self.patches)
        at = 0
        for k in order:
            records[k] = scratch[at : at + self.patches[k].raw_length]
            at += self.patches[k].raw_length
        async with task_group() as reads:  # bases and patches at once; a failure stops both
            reads.create_task(_done(read(_subplan(plan, self.bases), self.base_outs)))
            reads.create_task(_done(read(_subplan(plan, [self.patches[k] for k in order]), [records[k] for k in order])))
        for memory, indexes in self.chains:
            for k in indexes:
                patch.apply(records[k], memory)


async def _check_digests(manifest: Manifest, memories: list[memoryview], executor: Executor, where: str) -> None:
    """CorruptData unless every chunk in ``memories`` has the xxh3-128 its manifest holds."""
    size = manifest.chunk_size
    places = [(k, i) for k, entry in enumerate(manifest.entries) for i in range(len(entry.digests))]
    per_job = max(1, _HASH_BATCH // size)
    batches = [places[at : at + per_job] for at in range(0, len(places), per_job)]
    loop = asyncio.get_running_loop()
    jobs = [
        loop.run_in_executor(
            executor,
            _mismatches,
            [(memories[k][i * size : (i + 1) * size], manifest.entries[k].digests[i]) for k, i in batch],
        )
        for batch in batches
    ]
    bad = [batch[n] for batch, found in zip(batches, await asyncio.gather(*jobs), strict=True) for n in found]
    if bad:
        k, i = bad[0]
        more = f" (and {len(bad) - 1} more chunks)" if len(bad) > 1 else ""
        raise CorruptData(
            f"{where} leaf {'/'.join(manifest.entries[k].name)!r} chunk {i}: the bytes read are not the ones saved"
            f" (their xxh3-128 is not the digest its manifest holds){more}"
        )


def _mismatches(pieces: list[tuple[memoryview, bytes]]) -> list[int]:
    """The indexes of the pieces whose xxh3-128 is not the digest paired with them."""
    return [n for n, (piece, digest) in enumerate(pieces) if xxhash.xxh3_128_digest(piece) != digest]


async def _done(awaitable: Awaitable[None]) -> None:
    await awaitable


def _subplan(plan: ReadPlan, refs: list[ChunkRef]) -> ReadPlan:
    return msgspec.structs.replace(plan, chunks=tuple(refs), size=sum(ref.raw_length for ref in refs))


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

    with requires_extra("torch", "restoring a checkpoint into a torch tensor"):  # its bytes are written through numpy
        import numpy  # noqa: F401
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
