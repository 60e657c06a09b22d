"""A backend of some capabilities: plans in a dict, reading, writing and listing them, with no
fences and no block index.  It derives only the bases of what it has
(blobsdk/metadata/backend.py), which make every argument check, and runs only the suites of
what it has (blobsdk/testing/metadata.py)."""

from __future__ import annotations

import builtins
import time

import msgspec
import pytest

from blobsdk.errors import BlobNotFound
from blobsdk.metadata.backend import PlanListerBase, PlanReaderBase, PlanWriterBase
from blobsdk.metadata.base import BlockFences, BlockIndex, MetadataStore, PlanLister, PlanReader, PlanWriter, check_precondition
from blobsdk.testing.metadata import PlanListerTests, PlanReaderTests, PlanWriterTests
from blobsdk.wire import BlobInfo, CommitOp, ReadPlan, WriteKind


class MemoryPlans(PlanReaderBase, PlanWriterBase, PlanListerBase):
    """Live plans by path, and the last version of every path (deleted ones too)."""

    def __init__(self) -> None:
        self._plans: dict[str, ReadPlan] = {}
        self._versions: dict[str, int] = {}

    async def _get_plans(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        return [self._plans.get(path) for path in paths]

    async def _commit_many(self, ops: builtins.list[CommitOp]) -> builtins.list[ReadPlan]:
        plans, versions, now = dict(self._plans), dict(self._versions), time.time()
        committed = []
        for op in ops:  # on copies: a refused op leaves nothing of the batch
            live = plans.get(op.path)
            check_precondition(op.path, op.if_version, None if live is None else live.version)
            plan = msgspec.structs.replace(op.plan, version=versions.get(op.path, 0) + 1, created=now)
            plans[op.path], versions[op.path] = plan, plan.version
            committed.append(plan)
        self._plans, self._versions = plans, versions
        return committed

    async def _delete(self, path: str, if_version: int | None, kind: WriteKind) -> BlobInfo:
        live = self._plans.get(path)
        if live is None:
            raise BlobNotFound(f"no blob at {path!r}")
        check_precondition(path, if_version, live.version)
        del self._plans[path]
        return live.info()

    async def _list_page(self, prefix: str, start_after: str | None, limit: int) -> tuple[builtins.list[BlobInfo], str | None]:
        plans, cursor = self._page(prefix, start_after, limit)
        return [plan.info() for plan in plans], cursor

    async def _scan_page(self, start_after: str | None, limit: int) -> tuple[builtins.list[ReadPlan], str | None]:
        return self._page("/", start_after, limit)

    def _page(self, prefix: str, start_after: str | None, limit: int) -> tuple[builtins.list[ReadPlan], str | None]:
        paths = sorted(p for p in self._plans if p.startswith(prefix) and (start_after is None or p > start_after))
        page = paths[:limit]
        return [self._plans[p] for p in page], (page[-1] if len(paths) > limit else None)


class TestMemoryPlans(PlanReaderTests, PlanWriterTests, PlanListerTests):
    @pytest.fixture
    async def store(self):
        return MemoryPlans()


def test_a_backend_has_the_capabilities_of_its_bases_only():
    store = MemoryPlans()
    assert all(isinstance(store, capability) for capability in (PlanReader, PlanWriter, PlanLister))
    assert not any(isinstance(store, capability) for capability in (BlockFences, BlockIndex, MetadataStore))
