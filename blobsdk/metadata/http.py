"""HTTP metadata store: the client of the metadata API server (``servers/api.py``).

Arguments are checked here exactly as the embedded store checks them, so a bad path fails
the same way without a round trip; the server checks them again.  Every plan the server
answers is checked too (:func:`blobsdk.chunks.plans.checked_plan`): a bad one is CorruptData.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Self, TypeVar

import aiohttp

from ..chunks.plans import checked_plan
from ..config import Timeouts
from ..errors import BadRequest, BlobNotFound, Unavailable
from ..paths import validate_path
from ..wire import (
    MAX_OPS_PER_REQUEST,
    MAX_PATHS_PER_REQUEST,
    BlobInfo,
    CommitOp,
    CommitRequest,
    CommitResponse,
    DeleteRequest,
    DeleteResponse,
    FenceRequest,
    FenceResponse,
    GetPlansRequest,
    GetPlansResponse,
    ListRequest,
    ListResponse,
    NamingRequest,
    ReadPlan,
    ScanRequest,
    ScanResponse,
    WriteKind,
)
from .apiservers import DOWN_S, ApiServers
from .base import (
    check_commit_op,
    check_cursor,
    check_delete,
    check_fence_age,
    check_fence_ids,
    check_limit,
    check_list_args,
    check_naming_args,
    iterate_naming,
    iterate_pages,
    iterate_plans,
)

T = TypeVar("T")


class HttpMetadataStore:
    """MetadataStore over HTTP.  Uses, but never closes, the caller's ``session``.

    ``get_plans`` splits long lists into concurrent requests of at most 1000 paths (so a long
    list is not one snapshot).  ``commit_many`` is one request, because atomicity cannot span
    requests: more than 1000 ops raise BadRequest.

    ``base_url`` is one API server, or several over one store (a sequence): every call fails
    over between them, and every write carries a request id so that a retry is applied once
    (blobsdk/metadata/apiservers.py).  ``timeouts`` (the client's) bound each attempt.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str | Sequence[str],
        token: str | None = None,
        *,
        timeouts: Timeouts | None = None,
        down_s: float = DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.servers = ApiServers(session, urls, token, timeouts=timeouts, down_s=down_s, clock=clock)

    def __repr__(self) -> str:
        urls = [e.base_url for e in self.servers.endpoints]
        return f"HttpMetadataStore({urls[0] if len(urls) == 1 else urls!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to release: the session belongs to the caller."""

    async def get_plan(self, path: str) -> ReadPlan:
        (plan,) = await self.get_plans([path])
        if plan is None:
            raise BlobNotFound(f"no blob at {path!r}")
        return plan

    async def get_plans(self, paths: Sequence[str]) -> list[ReadPlan | None]:
        paths = [validate_path(path) for path in paths]
        step = MAX_PATHS_PER_REQUEST
        pages = await _gather([self._get_plans(paths[i : i + step]) for i in range(0, len(paths), step)])
        return [plan for page in pages for plan in page]

    async def commit(self, path: str, plan: ReadPlan, if_version: int | None = None) -> ReadPlan:
        (committed,) = await self.commit_many([CommitOp(path=path, plan=plan, if_version=if_version)])
        return committed

    async def commit_many(self, ops: Sequence[CommitOp]) -> list[ReadPlan]:
        ops = list(ops)
        for op in ops:
            check_commit_op(op)
        if len(ops) > MAX_OPS_PER_REQUEST:
            raise BadRequest(f"commit_many of {len(ops)} ops exceeds the atomic limit of {MAX_OPS_PER_REQUEST}")
        if not ops:
            return []
        request = CommitRequest(ops=ops, request_id=self.servers.request_id())
        return (await self.servers.call("/v1/commit", request, CommitResponse)).plans

    async def delete(self, path: str, if_version: int | None = None, *, kind: WriteKind = "blob") -> BlobInfo:
        check_delete(path, if_version, kind)
        request = DeleteRequest(path=path, if_version=if_version, kind=kind, request_id=self.servers.request_id())
        return (await self.servers.call("/v1/delete", request, DeleteResponse)).deleted

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = 1000
    ) -> tuple[list[BlobInfo], str | None]:
        check_list_args(prefix, start_after, limit)
        request = ListRequest(prefix=prefix, start_after=start_after, limit=limit)
        response = await self.servers.call("/v1/list", request, ListResponse)
        return response.items, response.next_start_after

    def list(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> AsyncIterator[BlobInfo]:
        check_list_args(prefix, start_after, limit)  # now, not at the first iteration
        return iterate_pages(self, prefix, start_after, limit)

    async def scan_page(self, start_after: str | None = None, limit: int = 1000) -> tuple[builtins.list[ReadPlan], str | None]:
        """One page of every live plan, sorted by path, and the cursor of the next page."""
        check_cursor(start_after)
        check_limit(limit)
        request = ScanRequest(start_after=start_after, limit=limit)
        response = await self.servers.call("/v1/scan", request, ScanResponse)
        return response.plans, response.next_start_after

    def iter_plans(self) -> AsyncIterator[ReadPlan]:
        return iterate_plans(self)

    async def naming_page(
        self, block_ids: Sequence[str], start_after: str | None = None, limit: int = 1000
    ) -> tuple[builtins.list[ReadPlan], str | None]:
        ids, _ = check_naming_args(block_ids, start_after, limit)
        if not ids:
            return [], None
        request = NamingRequest(block_ids=ids, start_after=start_after, limit=limit)
        response = await self.servers.call("/v1/naming", request, ScanResponse)
        return response.plans, response.next_start_after

    def iter_naming(self, block_ids: Sequence[str]) -> AsyncIterator[ReadPlan]:
        return iterate_naming(self, block_ids)

    async def fence_blocks(self, block_ids: Sequence[str]) -> None:
        if ids := check_fence_ids(block_ids):
            await self.servers.call("/v1/fences", FenceRequest(action="add", block_ids=ids), FenceResponse)

    async def unfence_blocks(self, block_ids: Sequence[str]) -> None:
        if ids := check_fence_ids(block_ids):
            await self.servers.call("/v1/fences", FenceRequest(action="remove", block_ids=ids), FenceResponse)

    async def prune_fences(self, older_than: float) -> int:
        request = FenceRequest(action="prune", older_than=check_fence_age(older_than))
        return (await self.servers.call("/v1/fences", request, FenceResponse)).pruned

    async def _get_plans(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        response = await self.servers.call("/v1/plans", GetPlansRequest(paths=paths), GetPlansResponse)
        if len(response.plans) != len(paths):
            raise Unavailable(f"{self!r} answered {len(response.plans)} plans for {len(paths)} paths")
        return [None if plan is None else checked_plan(plan, path) for plan, path in zip(response.plans, paths, strict=True)]


async def _gather(calls: list[Awaitable[T]]) -> list[T]:
    """Like asyncio.gather, but the first failure cancels and awaits the others, so no task
    outlives the call."""
    if len(calls) <= 1:
        return [await call for call in calls]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for task in tasks:  # mark later failures as seen; the first one is already raised
            if not task.cancelled():
                task.exception()
