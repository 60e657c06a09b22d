"""The MetadataStore protocols: flat, O(1) map from blob path to its current ReadPlan.

One protocol per capability, so that a caller asks only for what it uses (as obspec's
``GetAsync``, ``PutAsync``): :class:`PlanReader` (``get_plan``, ``get_plans``),
:class:`PlanWriter` (``commit``, ``commit_many``, ``delete``), :class:`PlanLister`
(``list_page``, ``list``, ``scan_page``, ``iter_plans``), :class:`BlockFences` (gc's
fences) and :class:`BlockIndex` (blocks to plans).  :class:`MetadataStore` is their union
plus ``aclose``: what a backend implements.  A backend derives
:class:`~blobsdk.metadata.backend.MetadataBackend`, whose public methods make the checks
below once and hand the backend's ``_method`` only checked arguments; the checks themselves
are the functions of this module, which the API server applies too.

Semantics every backend holds (blobsdk/testing/metadata.py checks them, a suite per
capability):

- ``get_plan`` of a missing path raises BlobNotFound; ``get_plans`` returns None for it.
- ``commit`` stores a new version: the store assigns ``version`` (previous version + 1,
  monotonic per path even across deletes) and ``created``; the caller's plan carries
  everything else.  ``if_version=None`` commits unconditionally, ``0`` only if the path has
  no live version, ``N`` only if the live version is N; otherwise PreconditionFailed.
- ``commit_many`` applies several commits atomically: all of them or none.
- ``delete`` removes the live version (BlobNotFound if none) with the same ``if_version`` rule.
- ``list`` yields live blobs whose path starts with ``prefix``, sorted by path, in pages.
- Every path argument is validated (InvalidPath) before anything else happens, and every
  committed plan is checked against the plan rules of :mod:`blobsdk.wire` (BadRequest).
- **The reserved namespace** (blobsdk/chunks/names.py): a commit or delete of kind ``"blob"`` (the
  default: a user's write) under ``/{bucket}/.blobsdk/`` is InvalidPath.  Kind ``"index"``
  is blobsdk's own: a commit only at a chunk index entry's path with a one-chunk plan, a
  delete anywhere under ``.blobsdk/`` (gc).  :func:`check_commit_op` and
  :func:`check_delete` hold the rule, so every backend (and the API server, whatever the
  tenant) applies the same one.  Reads and listings there are allowed.
- **Fences** (garbage collection's handshake with writers, :mod:`blobsdk.ops.gc`):
  ``fence_blocks(ids)`` marks blocks gc is about to delete; from the moment it returns, every
  commit (``commit``, ``commit_many``) naming a fenced block is refused whole with
  BlockCollected, atomically with the commit's other checks.  ``unfence_blocks(ids)`` lifts
  fences (blocks gc found referenced after all); ``prune_fences(older_than)`` drops fences
  older than ``older_than`` seconds by the store's own clock and returns how many.
- **Blocks to plans** (repair's reverse index, :mod:`blobsdk.ops.repair`):
  ``naming_page(block_ids)`` pages through the live plans that name any of ``block_ids``, in
  (block id, path) order, answering from an index kept atomically with every commit and
  delete, so its cost is the number of references found, not the number of plans.  A plan
  naming several of the ids may come once per id (on different pages); the cursor is
  ``"<block id>/<path>"`` of the page's last reference.
- A stored plan that no longer decodes (a row or hash field damaged outside the store) is
  CorruptData naming its path (:func:`decode_stored`), never a decoder's own exception.
- **A plan is checked once, where it enters**: every plan a backend answers for a path
  (``get_plan``, ``get_plans``; an API server's answer to a commit too) is checked against
  the plan rules and its path by :class:`~blobsdk.metadata.backend.MetadataBackend`
  (CorruptData), whatever medium it came from: a SQLite file or a Redis another writer can
  write, an API server that may lie.  The plan caches in front (cache.py, shared.py) hold
  plans a backend checked; the shared one checks what it reads back from its own Redis.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import msgspec

from ..chunks import (
    INDEX_DIR,
    RESERVED_DIR,
    is_index_entry,
    is_reserved,
    validate_hex32,
    validate_path,
    validate_prefix,
    validate_writable,
)
from ..errors import BadRequest, BlockCollected, CorruptData, InvalidPath, PreconditionFailed
from ..wire import BlobInfo, CommitOp, ReadPlan, WriteKind, check_plan

T = TypeVar("T")


@runtime_checkable
class PlanReader(Protocol):
    """Reading plans: the read path's one need."""

    async def get_plan(self, path: str) -> ReadPlan:
        """The live plan of ``path`` (BlobNotFound if none)."""
        ...

    async def get_plans(self, paths: Sequence[str]) -> list[ReadPlan | None]:
        """The live plan of each path, None where there is none."""
        ...


@runtime_checkable
class PlanWriter(Protocol):
    """Writing plans: commits and deletes, each under its ``if_version`` rule."""

    async def commit(self, path: str, plan: ReadPlan, if_version: int | None = None) -> ReadPlan: ...

    async def commit_many(self, ops: Sequence[CommitOp]) -> list[ReadPlan]:
        """Several commits, atomically: all of them or none."""
        ...

    async def delete(self, path: str, if_version: int | None = None, *, kind: WriteKind = "blob") -> BlobInfo: ...


@runtime_checkable
class PlanLister(Protocol):
    """Listing: the live blobs under a prefix, and every live plan (gc's scan)."""

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = 1000
    ) -> tuple[list[BlobInfo], str | None]:
        """One sorted page and the ``start_after`` of the next page (None at the end)."""
        ...

    def list(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> AsyncIterator[BlobInfo]:
        """Every live blob under ``prefix``, sorted; fetched ``limit`` at a time."""
        ...

    async def scan_page(self, start_after: str | None = None, limit: int = 1000) -> tuple[builtins.list[ReadPlan], str | None]:
        """One page of every live plan, sorted by path, and the cursor of the next page."""
        ...

    def iter_plans(self) -> AsyncIterator[ReadPlan]:
        """Every live plan (for garbage collection)."""
        ...


@runtime_checkable
class BlockFences(Protocol):
    """gc's fences: the handshake that keeps a commit from naming a block gc deletes."""

    async def fence_blocks(self, block_ids: Sequence[str]) -> None:
        """Refuse every later commit that names one of ``block_ids`` (gc is deleting them)."""
        ...

    async def unfence_blocks(self, block_ids: Sequence[str]) -> None:
        """Lift the fences of ``block_ids`` (absent ones are ignored)."""
        ...

    async def prune_fences(self, older_than: float) -> int:
        """Drop fences set more than ``older_than`` seconds ago (the store's clock); how many."""
        ...


@runtime_checkable
class BlockIndex(Protocol):
    """The block -> plans index: the live plans that name some blocks (repair's question)."""

    async def naming_page(
        self, block_ids: Sequence[str], start_after: str | None = None, limit: int = 1000
    ) -> tuple[list[ReadPlan], str | None]:
        """One page of the live plans naming any of ``block_ids`` and the next page's cursor."""
        ...

    def iter_naming(self, block_ids: Sequence[str]) -> AsyncIterator[ReadPlan]:
        """Every live plan naming any of ``block_ids`` (one naming several may come again)."""
        ...


@runtime_checkable
class MetadataStore(PlanReader, PlanWriter, PlanLister, BlockFences, BlockIndex, Protocol):
    """Every capability, and ``aclose``: what a backend implements (most derive
    :class:`~blobsdk.metadata.backend.MetadataBackend`, which checks the arguments once)."""

    async def aclose(self) -> None: ...


@runtime_checkable
class RetryAwareStore(Protocol):
    """A store that applies a write at most once per request id, so that a client whose
    answer was lost may send the same write again, to this or another API server over the
    same store: a retry of an applied write answers what the first application did (its
    versions, its deleted blob), never a second version, a spurious PreconditionFailed or
    BlobNotFound.  A request id used again for other paths is BadRequest.  How long an id is
    remembered is the store's (blobsdk/metadata/_redis.py: ``REQUEST_TTL_S``)."""

    async def commit_once(self, ops: Sequence[CommitOp], request_id: str) -> list[ReadPlan]: ...

    async def delete_once(self, path: str, if_version: int | None, kind: WriteKind, request_id: str) -> BlobInfo: ...


class PassThrough:
    """The MetadataStore calls a wrapper (the plan caches) hands to the store it wraps
    unchanged: listing, gc's scan and fences."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = 1000
    ) -> tuple[builtins.list[BlobInfo], str | None]:
        return await self.store.list_page(prefix, start_after, limit)

    def list(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> AsyncIterator[BlobInfo]:
        return self.store.list(prefix, start_after, limit)

    async def scan_page(self, start_after: str | None = None, limit: int = 1000) -> tuple[builtins.list[ReadPlan], str | None]:
        return await self.store.scan_page(start_after, limit)

    def iter_plans(self) -> AsyncIterator[ReadPlan]:
        return self.store.iter_plans()

    async def naming_page(
        self, block_ids: Sequence[str], start_after: str | None = None, limit: int = 1000
    ) -> tuple[builtins.list[ReadPlan], str | None]:
        return await self.store.naming_page(block_ids, start_after, limit)

    def iter_naming(self, block_ids: Sequence[str]) -> AsyncIterator[ReadPlan]:
        return self.store.iter_naming(block_ids)

    async def fence_blocks(self, block_ids: Sequence[str]) -> None:
        await self.store.fence_blocks(block_ids)

    async def unfence_blocks(self, block_ids: Sequence[str]) -> None:
        await self.store.unfence_blocks(block_ids)

    async def prune_fences(self, older_than: float) -> int:
        return await self.store.prune_fences(older_than)


async def iterate_pages(store: PlanLister, prefix: str, start_after: str | None, limit: int) -> AsyncIterator[BlobInfo]:
    """Shared ``list`` implementation over ``list_page``."""
    cursor = start_after
    while True:
        items, cursor = await store.list_page(prefix, cursor, limit)
        for item in items:
            yield item
        if cursor is None:
            return


async def iterate_plans(store: PlanLister, page: int = 1000) -> AsyncIterator[ReadPlan]:
    """Shared ``iter_plans`` implementation over ``scan_page``."""
    cursor: str | None = None
    while True:
        plans, cursor = await store.scan_page(cursor, page)
        for plan in plans:
            yield plan
        if cursor is None:
            return


def iterate_naming(store: BlockIndex, block_ids: Sequence[str], page: int = 1000) -> AsyncIterator[ReadPlan]:
    """Shared ``iter_naming`` implementation over ``naming_page``; the ids are checked now,
    not at the first iteration."""
    return _naming_pages(store, check_fence_ids(block_ids, "naming_page"), page)


async def _naming_pages(store: BlockIndex, ids: builtins.list[str], page: int) -> AsyncIterator[ReadPlan]:
    cursor: str | None = None
    while ids:
        plans, cursor = await store.naming_page(ids, cursor, page)
        for plan in plans:
            yield plan
        if cursor is None:
            return


MAX_LIST_LIMIT = 10_000


def check_limit(limit: int) -> int:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise BadRequest(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
    return limit


def check_if_version(if_version: int | None) -> int | None:
    if if_version is not None and (not isinstance(if_version, int) or isinstance(if_version, bool) or if_version < 0):
        raise BadRequest(f"if_version must be None or an int >= 0, got {if_version!r}")
    return if_version


def check_commit_op(op: CommitOp) -> None:
    """InvalidPath / ValueError / BadRequest for an op no store may apply."""
    _check_kind(op.kind)
    if op.kind == "blob":
        validate_writable(op.path)
    elif not is_index_entry(validate_path(op.path)):
        raise InvalidPath(f"an index commit of {op.path!r}: an index entry is /{{bucket}}/{INDEX_DIR}/<32 lowercase hex>")
    check_if_version(op.if_version)
    if op.plan.path != op.path:
        raise BadRequest(f"plan.path {op.plan.path!r} does not match the committed path {op.path!r}")
    check_plan(op.plan)
    if op.kind == "index" and len(op.plan.chunks) != 1:
        raise BadRequest(f"an index commit of {op.path!r}: an entry's plan names one chunk, this one {len(op.plan.chunks)}")


def checked_ops(ops: Sequence[CommitOp]) -> builtins.list[CommitOp]:
    """``ops`` as a list, every op checked (:func:`check_commit_op`) before any is applied."""
    ops = builtins.list(ops)
    for op in ops:
        check_commit_op(op)
    return ops


def check_delete(path: str, if_version: int | None, kind: WriteKind) -> None:
    """InvalidPath / BadRequest for a delete no store may apply: a user's (``"blob"``) in the
    reserved namespace, blobsdk's own (``"index"``) outside it."""
    _check_kind(kind)
    if kind == "blob":
        validate_writable(path)
    elif not is_reserved(validate_path(path)):
        raise InvalidPath(f"an index delete of {path!r}: only what lies under /{{bucket}}/{RESERVED_DIR}/")
    check_if_version(if_version)


def _check_kind(kind: object) -> None:
    if kind not in ("blob", "index"):
        raise BadRequest(f"kind must be 'blob' or 'index', got {kind!r}")


MAX_FENCE_IDS = 10_000  # block ids per fence call (the API server's bound per request)


def check_fence_ids(block_ids: Sequence[str], call: str = "fence") -> builtins.list[str]:
    """``block_ids`` as a list of distinct valid block ids (BadRequest otherwise)."""
    ids = builtins.list(dict.fromkeys(validate_hex32(b, "block id") for b in block_ids))
    if len(ids) > MAX_FENCE_IDS:
        raise BadRequest(f"{len(ids)} block ids in one {call} call; the limit is {MAX_FENCE_IDS}")
    return ids


def check_naming_args(
    block_ids: Sequence[str], start_after: str | None, limit: int
) -> tuple[builtins.list[str], tuple[str, str]]:
    """``naming_page``'s arguments checked: the distinct ids and the cursor as (block id,
    path), ("", "") for the first page (BadRequest for a malformed cursor)."""
    ids = check_fence_ids(block_ids, "naming_page")
    check_cursor(start_after)
    check_limit(limit)
    if start_after is None:
        return ids, ("", "")
    block_id, slash, path = start_after.partition("/")
    if not slash or not path.startswith("/"):
        raise BadRequest(f"a naming_page cursor is '<block id>/<path>', got {start_after!r}")
    return ids, (block_id, path)


def check_fence_age(older_than: float) -> float:
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not 0 <= older_than < float("inf"):
        raise BadRequest(f"older_than must be a finite number of seconds >= 0, got {older_than!r}")
    return float(older_than)


def block_collected(path: str, block_id: str) -> BlockCollected:
    return BlockCollected(
        f"commit of {path!r} refused: block {block_id} it names was collected by gc "
        "(written too long before its commit, or behind a skewed clock); nothing was committed"
    )


def check_cursor(start_after: object) -> None:
    if start_after is None:
        return
    if not isinstance(start_after, str):
        raise BadRequest(f"start_after must be None or str, not {type(start_after).__name__}")
    start_after.encode("utf-8")  # UnicodeEncodeError (a ValueError) for lone surrogates


def check_list_args(prefix: str, start_after: str | None, limit: int) -> None:
    validate_prefix(prefix)
    check_cursor(start_after)
    check_limit(limit)


def check_precondition(path: str, if_version: int | None, live: int | None) -> None:
    """PreconditionFailed unless ``if_version`` admits the live version ``live`` (None when
    the path has none; live versions are >= 1)."""
    if if_version is None or if_version == (live or 0):
        return
    raise precondition_failed(path, if_version, live)


def precondition_failed(path: str, if_version: int | None, live: int | None) -> PreconditionFailed:
    expected = "no live version (if_version=0)" if if_version == 0 else f"version {if_version}"
    actual = "no live version" if live is None else f"version {live}"
    return PreconditionFailed(f"precondition failed for {path!r}: expected {expected}, found {actual}")


def prefix_end(prefix: str) -> str:
    """An exclusive upper bound: ``prefix <= s < prefix_end(prefix)`` iff ``s`` starts with
    ``prefix``, for any valid path ``s``.  Stores compare UTF-8 bytes (SQLite's BINARY
    collation, Redis's lexicographic ranges), which orders like Python's code points."""
    stem = prefix.rstrip("\U0010ffff")  # a maximal last character cannot be incremented
    last = ord(stem[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates never occur in a valid (UTF-8) path
        last = 0xE000
    return stem[:-1] + chr(last)


def decode_stored(path: str, decode: Callable[[], T]) -> T:
    """``decode()`` of what a store holds for ``path``; CorruptData naming the path if it
    does not decode (msgspec's errors, or a field of the wrong type or value)."""
    try:
        return decode()
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise CorruptData(f"the stored plan of {path!r} is corrupt: {exc}") from exc
