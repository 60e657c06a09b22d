"""The base a MetadataStore backend derives (as zarr's ``Store`` ABC is): the checks once.

Each public method of :class:`MetadataBackend` checks its arguments by the rules of
:mod:`blobsdk.metadata.base` (each error's type and message is theirs), then calls the
backend's ``_method`` with checked arguments only, so a backend (sqlite.py, redis.py,
http.py) does only its own work:

================  ============================================================
public            what the backend's method gets
================  ============================================================
``get_plan``      ``_get_plan(path)``: a valid path; answers the plan or None
``get_plans``     ``_get_plans(paths)``: a list of valid paths
``commit_many``   ``_commit_many(ops)``: a non-empty list of checked ops
``delete``        ``_delete(path, if_version, kind)``: checked
``list_page``     ``_list_page(prefix, start_after, limit)``: checked
``scan_page``     ``_scan_page(start_after, limit)``: checked
``naming_page``   ``_naming_page(ids, after, limit)``: distinct valid ids (never none),
                  the cursor as (block id, path), ("", "") for the first page
``fence_blocks``  ``_fence(ids)``; ``unfence_blocks``: ``_unfence(ids)`` (never empty)
``prune_fences``  ``_prune_fences(older_than)``: a finite float >= 0
================  ============================================================

``commit``, ``list``, ``iter_plans`` and ``iter_naming`` are written here over those.  One
base per capability (:class:`PlanReaderBase` ... :class:`BlockFencesBase`), so a backend of
some capabilities derives only theirs; :class:`MetadataBackend` is all of them.

A plan enters the process where a backend answers it (a SQLite file or a Redis another
writer can write, an API server that may lie): ``get_plan`` and ``get_plans`` check every
plan the backend answers against the plan rules and the path it was asked for
(:func:`arrived`: CorruptData; http.py applies it to a server's answer to a commit too), and
nothing after them checks it again: not the plan caches in front (cache.py, shared.py).
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence

from ..chunks import validate_path
from ..errors import BlobNotFound
from ..wire import BlobInfo, CommitOp, ReadPlan, WriteKind, checked_plan
from .base import (
    check_cursor,
    check_delete,
    check_fence_age,
    check_fence_ids,
    check_limit,
    check_list_args,
    check_naming_args,
    checked_ops,
    iterate_naming,
    iterate_pages,
    iterate_plans,
)


def arrived(plans: Sequence[ReadPlan | None], paths: Sequence[str]) -> builtins.list[ReadPlan | None]:
    """``plans`` as a store answered them for ``paths``, each checked (CorruptData for a bad
    plan or one of another path; :func:`blobsdk.wire.checked_plan`)."""
    return [None if plan is None else checked_plan(plan, path) for plan, path in zip(plans, paths, strict=True)]


class PlanReaderBase(ABC):
    """:class:`~blobsdk.metadata.base.PlanReader`, checked; the backend writes ``_get_plans``
    (and ``_get_plan`` if one lookup has a faster way)."""

    async def get_plan(self, path: str) -> ReadPlan:
        plan = await self._get_plan(validate_path(path))
        if plan is None:
            raise BlobNotFound(f"no blob at {path!r}")
        return checked_plan(plan, path)

    async def get_plans(self, paths: Sequence[str]) -> builtins.list[ReadPlan | None]:
        paths = [validate_path(path) for path in paths]
        return arrived(await self._get_plans(paths), paths)

    async def _get_plan(self, path: str) -> ReadPlan | None:
        (plan,) = await self._get_plans([path])
        return plan

    @abstractmethod
    async def _get_plans(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]: ...


class PlanWriterBase(ABC):
    """:class:`~blobsdk.metadata.base.PlanWriter`, checked; the backend writes ``_commit_many``
    and ``_delete``."""

    async def commit(self, path: str, plan: ReadPlan, if_version: int | None = None) -> ReadPlan:
        (committed,) = await self.commit_many([CommitOp(path=path, plan=plan, if_version=if_version)])
        return committed

    async def commit_many(self, ops: Sequence[CommitOp]) -> builtins.list[ReadPlan]:
        ops = checked_ops(ops)
        return await self._commit_many(ops) if ops else []

    async def delete(self, path: str, if_version: int | None = None, *, kind: WriteKind = "blob") -> BlobInfo:
        check_delete(path, if_version, kind)
        return await self._delete(path, if_version, kind)

    @abstractmethod
    async def _commit_many(self, ops: builtins.list[CommitOp]) -> builtins.list[ReadPlan]: ...

    @abstractmethod
    async def _delete(self, path: str, if_version: int | None, kind: WriteKind) -> BlobInfo: ...


class PlanListerBase(ABC):
    """:class:`~blobsdk.metadata.base.PlanLister`, checked; the backend writes ``_list_page``
    and ``_scan_page``."""

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = 1000
    ) -> tuple[builtins.list[BlobInfo], str | None]:
        check_list_args(prefix, start_after, limit)
        return await self._list_page(prefix, start_after, limit)

    def list(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> AsyncIterator[BlobInfo]:
        check_list_args(prefix, start_after, limit)  # now, not at the first iteration
        return iterate_pages(self, prefix, start_after, limit)

    async def scan_page(self, start_after: str | None = None, limit: int = 1000) -> tuple[builtins.list[ReadPlan], str | None]:
        check_cursor(start_after)
        check_limit(limit)
        return await self._scan_page(start_after, limit)

    def iter_plans(self) -> AsyncIterator[ReadPlan]:
        return iterate_plans(self)

    @abstractmethod
    async def _list_page(
        self, prefix: str, start_after: str | None, limit: int
    ) -> tuple[builtins.list[BlobInfo], str | None]: ...

    @abstractmethod
    async def _scan_page(self, start_after: str | None, limit: int) -> tuple[builtins.list[ReadPlan], str | None]: ...


class BlockIndexBase(ABC):
    """:class:`~blobsdk.metadata.base.BlockIndex`, checked; the backend writes ``_naming_page``."""

    async def naming_page(
        self, block_ids: Sequence[str], start_after: str | None = None, limit: int = 1000
    ) -> tuple[builtins.list[ReadPlan], str | None]:
        ids, after = check_naming_args(block_ids, start_after, limit)
        if not ids:
            return [], None
        return await self._naming_page(ids, after, limit)

    def iter_naming(self, block_ids: Sequence[str]) -> AsyncIterator[ReadPlan]:
        return iterate_naming(self, block_ids)

    @abstractmethod
    async def _naming_page(
        self, block_ids: builtins.list[str], after: tuple[str, str], limit: int
    ) -> tuple[builtins.list[ReadPlan], str | None]: ...


class BlockFencesBase(ABC):
    """:class:`~blobsdk.metadata.base.BlockFences`, checked; the backend writes ``_fence``,
    ``_unfence`` and ``_prune_fences``."""

    async def fence_blocks(self, block_ids: Sequence[str]) -> None:
        if ids := check_fence_ids(block_ids):
            await self._fence(ids)

    async def unfence_blocks(self, block_ids: Sequence[str]) -> None:
        if ids := check_fence_ids(block_ids):
            await self._unfence(ids)

    async def prune_fences(self, older_than: float) -> int:
        return await self._prune_fences(check_fence_age(older_than))

    @abstractmethod
    async def _fence(self, block_ids: builtins.list[str]) -> None: ...

    @abstractmethod
    async def _unfence(self, block_ids: builtins.list[str]) -> None: ...

    @abstractmethod
    async def _prune_fences(self, older_than: float) -> int: ...


class MetadataBackend(PlanReaderBase, PlanWriterBase, PlanListerBase, BlockIndexBase, BlockFencesBase):
    """A whole :class:`~blobsdk.metadata.base.MetadataStore` whose public methods check, then
    call the backend's ``_method`` (see the module docstring): what sqlite.py, redis.py and
    http.py derive."""

    @abstractmethod
    async def aclose(self) -> None: ...


def naming_cursor(after: tuple[str, str]) -> str | None:
    """The ``start_after`` that :func:`~blobsdk.metadata.base.check_naming_args` parsed into
    ``after`` (for a backend that sends it on, as the HTTP one does)."""
    return None if after == ("", "") else "/".join(after)
