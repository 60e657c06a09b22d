"""The rules every ReadPlan obeys, checked where a plan is committed and where one arrives.

A plan is valid when:

- ``size >= 0`` and ``1 <= chunk_size <= MAX_CHUNK_BYTES`` (64 MiB);
- every chunk names a valid block id (32 lowercase hex digits), has ``offset >= 0``, a
  checksum in 64 bits, and ``1 <= raw_length <= chunk_size``;
- a chunk's stored ``length`` fits its codec: ``length == raw_length`` for ``"none"``,
  ``1 <= length <= lz4_bound(raw_length)`` for ``"lz4"``;
- the chunks cover exactly ``size`` bytes: their raw lengths sum to ``size``.

So a plan never makes a reader allocate more than its chunks hold, or read bytes that are
not in a chunk, and its block ids are safe as file names and URL segments.  A bad plan is
:class:`~blobsdk.errors.BadRequest` when committed (:func:`check_plan`) and
:class:`~blobsdk.errors.CorruptData` when it comes back from a store (:func:`checked_plan`).
"""

from __future__ import annotations

from ..errors import BadRequest, CorruptData
from ..wire import MAX_CHUNK_BYTES, ChunkRef, ReadPlan
from .ids import is_hex32

_UINT64 = 1 << 64


def lz4_bound(raw_length: int) -> int:
    """The most bytes lz4 block compression can turn ``raw_length`` bytes into (LZ4_COMPRESSBOUND)."""
    return raw_length + raw_length // 255 + 16


def check_plan(plan: ReadPlan) -> ReadPlan:
    """``plan`` if it obeys the rules above, else BadRequest naming the first broken one."""
    if plan.size < 0:
        raise BadRequest(f"plan for {plan.path!r}: negative size {plan.size}")
    if not 1 <= plan.chunk_size <= MAX_CHUNK_BYTES:
        raise BadRequest(f"plan for {plan.path!r}: chunk_size {plan.chunk_size} is not from 1 to {MAX_CHUNK_BYTES}")
    covered = 0
    for index, ref in enumerate(plan.chunks):
        if problem := chunk_problem(ref, plan.chunk_size):
            raise BadRequest(f"plan for {plan.path!r}: chunk {index}: {problem}")
        covered += ref.raw_length
    if covered != plan.size:
        raise BadRequest(f"plan for {plan.path!r}: chunks cover {covered} bytes, size is {plan.size}")
    return plan


def chunk_problem(ref: ChunkRef, chunk_size: int) -> str | None:
    """What is wrong with one chunk of a plan whose chunk size is ``chunk_size``, or None."""
    if not is_hex32(ref.block_id):
        return f"invalid block id {ref.block_id!r}: want 32 lowercase hex digits"
    if ref.offset < 0 or not 0 <= ref.checksum < _UINT64:
        return f"negative offset {ref.offset} or checksum {ref.checksum} out of 64 bits"
    if not 1 <= ref.raw_length <= chunk_size:
        return f"raw_length {ref.raw_length} is not from 1 to chunk_size {chunk_size}"
    if ref.codec == "none" and ref.length != ref.raw_length:
        return f"uncompressed chunk with length {ref.length} != raw_length {ref.raw_length}"
    if ref.codec == "lz4" and not 1 <= ref.length <= lz4_bound(ref.raw_length):
        return f"lz4 chunk with length {ref.length} is not from 1 to {lz4_bound(ref.raw_length)} (raw_length {ref.raw_length})"
    return None


def checked_plan(plan: ReadPlan, path: str) -> ReadPlan:
    """``plan`` as a store answered it for ``path``: CorruptData unless it is a valid plan of
    ``path`` (a reader must never see zeros or allocate for bytes no chunk holds)."""
    try:
        if plan.path != path:
            raise BadRequest(f"plan for {plan.path!r}, not for {path!r}")
        return check_plan(plan)
    except BadRequest as exc:
        raise CorruptData(f"metadata store returned an invalid plan: {exc}") from exc
