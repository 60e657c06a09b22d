"""HTTP metadata store: the client of the metadata API server (``servers/api.py``).

A :class:`~blobsdk.metadata.backend.MetadataBackend`: arguments are checked here exactly as
the embedded store checks them, so a bad path fails the same way without a round trip; the
server checks them again.  Every plan the server answers for a path, looked up or committed,
is checked where it arrives (:func:`blobsdk.metadata.backend.arrived`): a bad one is
CorruptData.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Self, TypeVar

import aiohttp

from ..config import Timeouts
from ..errors import BadRequest, Unavailable
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
from ._apiservers import DOWN_S, ApiServers
from .backend import MetadataBackend, arrived, naming_cursor

T = TypeVar("T")


class HttpMetadataStore(MetadataBackend):
    """MetadataStore over HTTP.  Uses, but never closes, the caller's ``session``.

    ``get_plans`` splits long lists into concurrent requests of at most 1000 paths (so a long
    list is not one snapshot).  ``commit_many`` is one request, because atomicity cannot span
    requests: more than 1000 ops raise BadRequest.

    ``base_url`` is one API server, or several over one store (a sequence): every call fails
    over between them, and every write carries a request id so that a retry is applied once
    (blobsdk/metadata/_apiservers.py).  ``timeouts`` (the client's) bound each attempt.
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

    # --- the backend's work (MetadataBackend has checked the arguments and checks the plans
    # answered for paths) ---------------------------------------------------------------------

    async def _get_plan(self, path: str) -> ReadPlan | None:
        """One path: one page, no pages to gather."""
        (plan,) = await self._plans_page([path])
        return plan

    async def _get_plans(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        step = MAX_PATHS_PER_REQUEST
        pages = await _gather([self._plans_page(paths[i : i + step]) for i in range(0, len(paths), step)])
        return [plan for page in pages for plan in page]

    async def _plans_page(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        response = await self.servers.call("/v1/plans", GetPlansRequest(paths=paths), GetPlansResponse)
        if len(response.plans) != len(paths):
            raise Unavailable(f"{self!r} answered {len(response.plans)} plans for {len(paths)} paths")
        return response.plans

    async def _commit_many(self, ops: builtins.list[CommitOp]) -> builtins.list[ReadPlan]:
        """One request; the plans the server answers enter here, and are checked here."""
        if len(ops) > MAX_OPS_PER_REQUEST:
            raise BadRequest(f"commit_many of {len(ops)} ops exceeds the atomic limit of {MAX_OPS_PER_REQUEST}")
        request = CommitRequest(ops=ops, request_id=self.servers.request_id())
        plans = (await self.servers.call("/v1/commit", request, CommitResponse)).plans
        if len(plans) != len(ops):
            raise Unavailable(f"{self!r} answered {len(plans)} plans for a commit of {len(ops)}")
        return [plan for plan in arrived(plans, [op.path for op in ops]) if plan is not None]

    async def _delete(self, path: str, if_version: int | None, kind: WriteKind) -> BlobInfo:
        request = DeleteRequest(path=path, if_version=if_version, kind=kind, request_id=self.servers.request_id())
        return (await self.servers.call("/v1/delete", request, DeleteResponse)).deleted

    async def _list_page(self, prefix: str, start_after: str | None, limit: int) -> tuple[builtins.list[BlobInfo], str | None]:
        request = ListRequest(prefix=prefix, start_after=start_after, limit=limit)
        response = await self.servers.call("/v1/list", request, ListResponse)
        return response.items, response.next_start_after

    async def _scan_page(self, start_after: str | None, limit: int) -> tuple[builtins.list[ReadPlan], str | None]:
        request = ScanRequest(start_after=start_after, limit=limit)
        response = await self.servers.call("/v1/scan", request, ScanResponse)
        return response.plans, response.next_start_after

    async def _naming_page(
        self, block_ids: builtins.list[str], after: tuple[str, str], limit: int
    ) -> tuple[builtins.list[ReadPlan], str | None]:
        request = NamingRequest(block_ids=block_ids, start_after=naming_cursor(after), limit=limit)
        response = await self.servers.call("/v1/naming", request, ScanResponse)
        return response.plans, response.next_start_after

    async def _fence(self, block_ids: builtins.list[str]) -> None:
        await self.servers.call("/v1/fences", FenceRequest(action="add", block_ids=block_ids), FenceResponse)

    async def _unfence(self, block_ids: builtins.list[str]) -> None:
        await self.servers.call("/v1/fences", FenceRequest(action="remove", block_ids=block_ids), FenceResponse)

    async def _prune_fences(self, older_than: float) -> int:
        return (await self.servers.call("/v1/fences", FenceRequest(action="prune", older_than=older_than), FenceResponse)).pruned


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
