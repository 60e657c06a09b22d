"""The MetadataStore conformance suites: what every metadata backend holds
(blobsdk/metadata/base.py), one suite per capability, for blobsdk's own backends and for one
you write: :class:`PlanReaderTests`, :class:`PlanWriterTests` (with the reserved namespace's,
blobsdk/testing/reserved.py), :class:`PlanListerTests`, :class:`BlockIndexTests` and
:class:`BlockFencesTests`; :class:`MetadataStoreTests` is all of them.

A backend's test class (named ``Test...``, so pytest collects it; no suite's name starts with
``Test``, so none is collected alone) subclasses the suites of the capabilities it has and
provides a fixture ``store`` yielding an open, empty store (async: ``pytest_asyncio.fixture``
in pytest-asyncio's strict mode).  Every suite makes its data with ``commit`` and reads it back
with ``get_plan``, so a store under test can commit and read plans whatever else it has.  The
suites need pytest and pytest-asyncio (the ``testing`` extra); their tests carry the asyncio
mark.  The plans they commit come from blobsdk/testing/plans.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from .._extras import requires_extra
from ..errors import BadRequest, BlobNotFound, BlockCollected, InvalidPath, PreconditionFailed
from ..metadata import BlockFences, BlockIndex, MetadataStore, PlanLister, PlanReader, PlanWriter
from ..wire import BlobInfo, CommitOp, ReadPlan
from .plans import BAD_PLANS, INVALID_PATHS, all_listed, bad_plan, make_plan, naming, put, put_all, two_block_plan
from .reserved import ENTRY, ReservedNamespaceTests, one_chunk

with requires_extra("testing", "blobsdk.testing"):
    import pytest


class PlanReaderTests:
    """Reading plans (:class:`~blobsdk.metadata.base.PlanReader`)."""

    pytestmark = pytest.mark.asyncio

    async def test_is_a_plan_reader(self, store: Any) -> None:
        assert isinstance(store, PlanReader)

    async def test_get_missing_raises_blob_not_found(self, store: Any) -> None:
        with pytest.raises(BlobNotFound) as exc:
            await store.get_plan("/b/missing")
        assert type(exc.value) is BlobNotFound
        assert "/b/missing" in str(exc.value)

    async def test_get_plans_aligns_missing_with_none(self, store: Any) -> None:
        committed = await put(store, "/b/there")
        got = await store.get_plans(["/b/nope", "/b/there", "/b/nope2", "/b/there"])
        assert got == [None, committed, None, committed]
        assert await store.get_plans([]) == []

    @pytest.mark.parametrize("path", INVALID_PATHS)
    async def test_invalid_paths_rejected_by_reads(self, store: Any, path: Any) -> None:
        calls: list[Callable[[], Awaitable[object]]] = [lambda: store.get_plan(path), lambda: store.get_plans(["/b/ok", path])]
        for call in calls:
            with pytest.raises(InvalidPath):
                await call()


class PlanWriterTests(ReservedNamespaceTests):
    """Writing plans (:class:`~blobsdk.metadata.base.PlanWriter`), the reserved namespace
    (blobsdk/testing/reserved.py) included."""

    async def test_is_a_plan_writer(self, store: Any) -> None:
        assert isinstance(store, PlanWriter)

    # --- commit and versions -------------------------------------------------------------

    async def test_commit_assigns_versions_and_created(self, store: Any) -> None:
        before = time.time()
        versions = [(await put(store, "/b/x", seed=i)).version for i in range(3)]
        assert versions == [1, 2, 3]
        latest = await store.get_plan("/b/x")
        assert latest.version == 3 and latest.chunks == make_plan("/b/x", seed=2).chunks
        assert before - 1 <= latest.created <= time.time() + 1

    async def test_commit_keeps_caller_fields(self, store: Any) -> None:
        plan = make_plan("/b/x", size=16, seed=7)
        committed = await store.commit("/b/x", plan)
        assert committed == msgspec.structs.replace(plan, version=1, created=committed.created)
        assert await store.get_plan("/b/x") == committed

    async def test_version_monotonic_across_delete_and_recreate(self, store: Any) -> None:
        await put(store, "/b/x")
        await put(store, "/b/x")
        await store.delete("/b/x")
        recreated = await put(store, "/b/x", if_version=0)
        assert recreated.version == 3

    async def test_create_only(self, store: Any) -> None:
        assert (await put(store, "/b/x", if_version=0)).version == 1
        with pytest.raises(PreconditionFailed) as exc:
            await put(store, "/b/x", seed=1, if_version=0)
        assert "/b/x" in str(exc.value) and "version 1" in str(exc.value)
        assert (await store.get_plan("/b/x")).chunks == make_plan("/b/x").chunks

    async def test_if_version_match(self, store: Any) -> None:
        await put(store, "/b/x")
        assert (await put(store, "/b/x", seed=1, if_version=1)).version == 2
        assert (await put(store, "/b/x", seed=2, if_version=2)).version == 3

    async def test_if_version_mismatch_names_path_and_versions(self, store: Any) -> None:
        await put(store, "/b/x")
        await put(store, "/b/x")
        with pytest.raises(PreconditionFailed) as exc:
            await put(store, "/b/x", seed=9, if_version=1)
        message = str(exc.value)
        assert "/b/x" in message and "version 1" in message and "version 2" in message
        assert (await store.get_plan("/b/x")).version == 2

    async def test_if_version_on_missing_or_deleted_path(self, store: Any) -> None:
        with pytest.raises(PreconditionFailed):
            await put(store, "/b/x", if_version=1)
        await put(store, "/b/x")
        await store.delete("/b/x")
        with pytest.raises(PreconditionFailed):
            await put(store, "/b/x", if_version=1)  # version 1 exists only as a tombstone

    async def test_negative_if_version_is_value_error(self, store: Any) -> None:
        with pytest.raises(ValueError):
            await put(store, "/b/x", if_version=-1)
        with pytest.raises(ValueError):
            await store.delete("/b/x", if_version=-1)

    @pytest.mark.parametrize(("plan", "chunk", "message"), BAD_PLANS)
    async def test_invalid_plan_is_bad_request_and_not_committed(self, store: Any, plan: Any, chunk: Any, message: Any) -> None:
        with pytest.raises(BadRequest) as exc:
            await store.commit("/b/x", bad_plan("/b/x", plan, chunk))
        assert str(exc.value) == f"plan for '/b/x': {message}"
        assert await store.get_plans(["/b/x"]) == [None]

    async def test_commit_many_with_one_invalid_plan_commits_none(self, store: Any) -> None:
        ops = [CommitOp(path="/b/ok", plan=make_plan("/b/ok")), CommitOp(path="/b/x", plan=bad_plan("/b/x", {"size": 9}))]
        with pytest.raises(BadRequest, match="chunks cover 10 bytes, size is 9"):
            await store.commit_many(ops)
        assert await store.get_plans(["/b/ok", "/b/x"]) == [None, None]

    async def test_valid_edge_plans_commit(self, store: Any) -> None:
        empty = await store.commit("/b/empty", make_plan("/b/empty", size=0))
        assert (empty.size, empty.chunks) == (0, ())
        lz4 = bad_plan("/b/lz4", None, {"codec": "lz4", "length": 24})  # lz4's worst case for 8 bytes
        assert (await store.commit("/b/lz4", lz4)).chunks == lz4.chunks

    async def test_plan_path_mismatch_is_bad_request(self, store: Any) -> None:
        with pytest.raises(BadRequest):
            await store.commit("/b/x", make_plan("/b/y"))
        assert await store.get_plans(["/b/x", "/b/y"]) == [None, None]

    # --- delete --------------------------------------------------------------------------

    async def test_delete_returns_info_and_hides_blob(self, store: Any) -> None:
        committed = await put(store, "/b/x")
        info = await store.delete("/b/x")
        assert info == committed.info()
        assert isinstance(info, BlobInfo)
        with pytest.raises(BlobNotFound):
            await store.get_plan("/b/x")

    async def test_delete_missing_raises_blob_not_found(self, store: Any) -> None:
        with pytest.raises(BlobNotFound) as exc:
            await store.delete("/b/never")
        assert "/b/never" in str(exc.value)
        await put(store, "/b/x")
        await store.delete("/b/x")
        with pytest.raises(BlobNotFound):
            await store.delete("/b/x")

    async def test_delete_if_version(self, store: Any) -> None:
        await put(store, "/b/x")
        await put(store, "/b/x")
        for wrong in (0, 1, 3):
            with pytest.raises(PreconditionFailed):
                await store.delete("/b/x", if_version=wrong)
        assert (await store.get_plan("/b/x")).version == 2
        assert (await store.delete("/b/x", if_version=2)).version == 2

    # --- commit_many ---------------------------------------------------------------------

    async def test_commit_many_applies_all(self, store: Any) -> None:
        await put(store, "/b/a")
        ops = [
            CommitOp(path="/b/a", plan=make_plan("/b/a", seed=1), if_version=1),
            CommitOp(path="/b/b", plan=make_plan("/b/b"), if_version=0),
            CommitOp(path="/b/c", plan=make_plan("/b/c")),
        ]
        committed = await store.commit_many(ops)
        assert [(p.path, p.version) for p in committed] == [("/b/a", 2), ("/b/b", 1), ("/b/c", 1)]
        assert await store.get_plans(["/b/a", "/b/b", "/b/c"]) == committed
        assert await store.commit_many([]) == []

    async def test_commit_many_is_atomic(self, store: Any) -> None:
        await put(store, "/b/a")
        ops = [
            CommitOp(path="/b/new", plan=make_plan("/b/new")),
            CommitOp(path="/b/a", plan=make_plan("/b/a", seed=1)),
            CommitOp(path="/b/a", plan=make_plan("/b/a", seed=2), if_version=1),  # a is at 2 by now
        ]
        with pytest.raises(PreconditionFailed):
            await store.commit_many(ops)
        assert await store.get_plans(["/b/new"]) == [None]
        assert (await store.get_plan("/b/a")).version == 1
        assert (await put(store, "/b/new")).version == 1  # the failed batch consumed no version

    async def test_commit_many_checks_every_op_first(self, store: Any) -> None:
        ops = [CommitOp(path="/b/ok", plan=make_plan("/b/ok")), CommitOp(path="/b//bad", plan=make_plan("/b//bad"))]
        with pytest.raises(InvalidPath):
            await store.commit_many(ops)
        assert await store.get_plans(["/b/ok"]) == [None]

    # --- path validation -----------------------------------------------------------------

    @pytest.mark.parametrize("path", INVALID_PATHS)
    async def test_invalid_paths_rejected_by_writes(self, store: Any, path: Any) -> None:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.commit(path, make_plan(path)),
            lambda: store.commit_many([CommitOp(path=path, plan=make_plan(path))]),
            lambda: store.delete(path),
        ]
        for call in calls:
            with pytest.raises(InvalidPath):
                await call()

    async def test_longest_path_is_valid(self, store: Any) -> None:
        path = "/b/" + "x" * 1021
        assert len(path.encode()) == 1024
        assert (await put(store, path)).path == path

    # --- concurrency -----------------------------------------------------------------------

    async def test_concurrent_cas_exactly_one_wins(self, store: Any) -> None:
        await put(store, "/b/x")
        results = await asyncio.gather(*(put(store, "/b/x", seed=i, if_version=1) for i in range(20)), return_exceptions=True)
        winners = [r for r in results if isinstance(r, ReadPlan)]
        assert len(winners) == 1 and winners[0].version == 2
        assert all(isinstance(r, PreconditionFailed) for r in results if r is not winners[0])
        assert await store.get_plan("/b/x") == winners[0]

    async def test_concurrent_create_only_exactly_one_wins(self, store: Any) -> None:
        results = await asyncio.gather(*(put(store, "/b/new", seed=i, if_version=0) for i in range(20)), return_exceptions=True)
        assert sum(isinstance(r, ReadPlan) for r in results) == 1
        assert sum(isinstance(r, PreconditionFailed) for r in results) == 19


class PlanListerTests:
    """Listing (:class:`~blobsdk.metadata.base.PlanLister`): blobs under a prefix, every plan."""

    pytestmark = pytest.mark.asyncio

    async def test_is_a_plan_lister(self, store: Any) -> None:
        assert isinstance(store, PlanLister)

    # --- list ----------------------------------------------------------------------------

    async def test_list_sorted_and_paged(self, store: Any) -> None:
        paths = [f"/b/k{i:03d}" for i in range(25)]
        await put_all(store, list(reversed(paths)))
        page, cursor = await store.list_page("/b/", limit=10)
        assert [i.path for i in page] == paths[:10] and cursor == paths[9]
        page, cursor = await store.list_page("/b/", cursor, limit=10)
        assert [i.path for i in page] == paths[10:20]
        page, cursor = await store.list_page("/b/", cursor, limit=10)
        assert [i.path for i in page] == paths[20:] and cursor is None
        assert await all_listed(store, "/b/", limit=7) == paths

    async def test_list_items_are_blob_infos(self, store: Any) -> None:
        committed = await put(store, "/b/x")
        assert [info async for info in store.list("/b")] == [committed.info()]

    async def test_list_prefix_is_exact_string_prefix(self, store: Any) -> None:
        await put_all(store, ["/b/a", "/b/a/x", "/b/ab", "/b/b", "/c/a", "/ba/x"])
        assert await all_listed(store, "/b/a") == ["/b/a", "/b/a/x", "/b/ab"]
        assert await all_listed(store, "/b/a/") == ["/b/a/x"]
        assert await all_listed(store, "/b") == ["/b/a", "/b/a/x", "/b/ab", "/b/b", "/ba/x"]
        assert await all_listed(store, "/b/") == ["/b/a", "/b/a/x", "/b/ab", "/b/b"]
        assert await all_listed(store, "/") == sorted(["/b/a", "/b/a/x", "/b/ab", "/b/b", "/c/a", "/ba/x"])
        assert await all_listed(store, "/zzz") == []

    async def test_list_treats_percent_and_underscore_literally(self, store: Any) -> None:
        await put_all(store, ["/b/x%y", "/b/x_y", "/b/xay", "/b/xzy", "/b/x%%"])
        assert await all_listed(store, "/b/x%") == ["/b/x%%", "/b/x%y"]
        assert await all_listed(store, "/b/x_") == ["/b/x_y"]
        assert await store.get_plans(["/b/x%y", "/b/x_y"]) != [None, None]

    async def test_list_non_ascii_in_code_point_order(self, store: Any) -> None:
        paths = ["/b/z", "/b/é", "/b/日本", "/b/\U0001f600", "/b/\uffff", "/b/\U0010ffff", "/b/\U0010ffffa"]
        await put_all(store, paths)
        assert await all_listed(store, "/b/") == sorted(paths)
        assert await all_listed(store, "/b/\U0010ffff") == ["/b/\U0010ffff", "/b/\U0010ffffa"]
        assert await all_listed(store, "/b/\ud7ff") == []

    async def test_list_start_after_is_exclusive(self, store: Any) -> None:
        await put_all(store, ["/b/a", "/b/b", "/b/c", "/d/a"])
        assert [i.path async for i in store.list("/b/", start_after="/b/a")] == ["/b/b", "/b/c"]
        assert [i.path async for i in store.list("/b/", start_after="/b/bb")] == ["/b/c"]
        assert [i.path async for i in store.list("/b/", start_after="/a")] == ["/b/a", "/b/b", "/b/c"]
        assert [i.path async for i in store.list("/b/", start_after="/c")] == []

    async def test_an_index_entry_is_listed_with_the_blobs(self, store: Any) -> None:
        await store.commit_many([CommitOp(path=ENTRY, plan=one_chunk(ENTRY), kind="index")])
        await put(store, "/b/x")
        assert await all_listed(store, "/b/.blobsdk/") == [ENTRY]
        assert await all_listed(store, "/b/") == [ENTRY, "/b/x"]

    async def test_list_skips_deleted(self, store: Any) -> None:
        await put_all(store, ["/b/a", "/b/b", "/b/c"])
        await store.delete("/b/b")
        page, cursor = await store.list_page("/b/", limit=2)
        assert [i.path for i in page] == ["/b/a", "/b/c"] and cursor is None

    @pytest.mark.parametrize("limit", [0, -1, 10_001, 1.5])
    async def test_list_limit_validation(self, store: Any, limit: Any) -> None:
        with pytest.raises(ValueError):
            await store.list_page("/b/", limit=limit)
        with pytest.raises(ValueError):
            store.list("/b/", limit=limit)
        with pytest.raises(ValueError):
            await store.scan_page(None, limit)

    @pytest.mark.parametrize("prefix", ["", "b", "//", "/b//", "/b/../", "/b\x00"])
    async def test_invalid_prefix(self, store: Any, prefix: Any) -> None:
        with pytest.raises(InvalidPath):
            await store.list_page(prefix)

    # --- scanning every plan ---------------------------------------------------------------

    async def test_iter_plans_yields_every_live_plan(self, store: Any) -> None:
        paths = [f"/b{i % 3}/k{i}" for i in range(40)]
        await put_all(store, paths)
        await store.delete(paths[0])
        plans = [plan async for plan in store.iter_plans()]
        assert [p.path for p in plans] == sorted(paths[1:])
        assert all(p.version == 1 for p in plans)

    async def test_scan_page_cursor(self, store: Any) -> None:
        await put_all(store, ["/a/x", "/b/x", "/c/x"])
        plans, cursor = await store.scan_page(None, 2)
        assert [p.path for p in plans] == ["/a/x", "/b/x"] and cursor == "/b/x"
        plans, cursor = await store.scan_page(cursor, 2)
        assert [p.path for p in plans] == ["/c/x"] and cursor is None


class BlockIndexTests:
    """The block -> plans index (:class:`~blobsdk.metadata.base.BlockIndex`)."""

    pytestmark = pytest.mark.asyncio

    async def test_has_a_block_index(self, store: Any) -> None:
        assert isinstance(store, BlockIndex)

    # --- blocks to plans (repair's reverse index) -------------------------------------------

    async def test_naming_finds_the_live_plans_naming_blocks(self, store: Any) -> None:
        a, b, c = (f"{n:032x}" for n in (1, 2, 3))
        await put_all(store, ["/b/x"])  # block 0
        await put(store, "/b/one", seed=1)
        await put(store, "/z/one", seed=1)  # another bucket, same block
        await store.commit("/b/both", two_block_plan("/b/both", 1, 2))
        await put(store, "/b/moved", seed=2)
        await put(store, "/b/moved", seed=3)  # overwritten: names block 3 now, not 2
        await put(store, "/b/gone", seed=2)
        await store.delete("/b/gone")
        assert await naming(store, [a]) == ["/b/both", "/b/one", "/z/one"]
        assert await naming(store, [b]) == ["/b/both"]
        assert await naming(store, [c]) == ["/b/moved"]
        assert await naming(store, [a, b, c]) == ["/b/both", "/b/moved", "/b/one", "/z/one"]
        assert await naming(store, [f"{9:032x}"]) == [] and await naming(store, []) == []
        plans = [plan async for plan in store.iter_naming([c])]
        assert plans == [await store.get_plan("/b/moved")]

    async def test_naming_follows_a_path_committed_twice_in_one_batch(self, store: Any) -> None:
        ops = [CommitOp(path="/b/x", plan=make_plan("/b/x", seed=s)) for s in (5, 6)]
        await store.commit_many(ops)
        assert await naming(store, [f"{5:032x}"]) == [] and await naming(store, [f"{6:032x}"]) == ["/b/x"]

    async def test_naming_page_cursor(self, store: Any) -> None:
        a, b = f"{1:032x}", f"{2:032x}"
        await put(store, "/b/p", seed=1)
        await put(store, "/b/q", seed=1)
        await put(store, "/b/r", seed=2)
        plans, cursor = await store.naming_page([b, a], None, 2)
        assert [p.path for p in plans] == ["/b/p", "/b/q"] and cursor == f"{a}//b/q"
        plans, cursor = await store.naming_page([b, a], cursor, 2)
        assert [p.path for p in plans] == ["/b/r"] and cursor is None

    async def test_naming_arguments_are_checked(self, store: Any) -> None:
        with pytest.raises(BadRequest, match=r"invalid block id '\.\./x': want 32 lowercase hex digits"):
            await store.naming_page(["../x"])
        with pytest.raises(BadRequest, match="10001 block ids in one naming_page call; the limit is 10000"):
            await store.naming_page([f"{i:032x}" for i in range(10_001)])
        with pytest.raises(BadRequest, match="10001 block ids in one naming_page call; the limit is 10000"):
            store.iter_naming([f"{i:032x}" for i in range(10_001)])
        for bad in ("x", f"{1:032x}/b/x"):
            with pytest.raises(BadRequest, match=f"a naming_page cursor is '<block id>/<path>', got '{bad}'"):
                await store.naming_page([f"{1:032x}"], bad)
        with pytest.raises(BadRequest, match="limit must be an int from 1 to 10000, got 0"):
            await store.naming_page([f"{1:032x}"], None, 0)


class BlockFencesTests:
    """gc's fences (:class:`~blobsdk.metadata.base.BlockFences`)."""

    pytestmark = pytest.mark.asyncio

    async def test_has_block_fences(self, store: Any) -> None:
        assert isinstance(store, BlockFences)

    # --- gc's fences -----------------------------------------------------------------------

    async def test_a_fenced_block_refuses_every_commit_naming_it(self, store: Any) -> None:
        await put(store, "/b/old", seed=1)
        await store.fence_blocks([f"{2:032x}", f"{3:032x}"])
        for commit in (
            lambda: put(store, "/b/x", seed=2),
            lambda: store.commit_many(
                [CommitOp(path="/b/y", plan=make_plan("/b/y", seed=4)), CommitOp(path="/b/z", plan=make_plan("/b/z", seed=3))]
            ),
            lambda: put(store, "/other/x", seed=3),  # a bucket never committed to before the fence
        ):
            with pytest.raises(BlockCollected) as exc:
                await commit()
            assert "was collected by gc" in str(exc.value) and "nothing was committed" in str(exc.value)
        assert await store.get_plans(["/b/x", "/b/y", "/b/z", "/other/x"]) == [None] * 4  # the whole batch refused
        assert (await put(store, "/b/x", seed=4)).version == 1  # other blocks commit as before
        await store.unfence_blocks([f"{2:032x}"])
        assert (await put(store, "/b/x", seed=2)).version == 2
        with pytest.raises(BlockCollected, match=f"commit of '/b/w' refused: block {3:032x} it names"):
            await put(store, "/b/w", seed=3)

    async def test_fences_are_pruned_by_age(self, store: Any) -> None:
        await store.fence_blocks([f"{2:032x}"])
        assert await store.prune_fences(3600) == 0
        with pytest.raises(BlockCollected):
            await put(store, "/b/x", seed=2)
        await asyncio.sleep(0.05)  # the fence is now older than 0.01 s on any clock that moves
        assert await store.prune_fences(0.01) >= 1
        assert (await put(store, "/b/x", seed=2)).version == 1

    async def test_fence_arguments_are_checked(self, store: Any) -> None:
        with pytest.raises(BadRequest, match=r"invalid block id '\.\./x': want 32 lowercase hex digits"):
            await store.fence_blocks(["../x"])
        with pytest.raises(BadRequest, match="10001 block ids in one fence call; the limit is 10000"):
            await store.fence_blocks([f"{i:032x}" for i in range(10_001)])
        for bad in (-1, float("nan"), float("inf"), True, "1"):
            with pytest.raises(BadRequest, match="older_than must be a finite number of seconds >= 0, got"):
                await store.prune_fences(bad)
        await store.fence_blocks([])
        await store.unfence_blocks([f"{9:032x}"])  # not fenced: nothing happens


class MetadataStoreTests(PlanReaderTests, PlanWriterTests, PlanListerTests, BlockIndexTests, BlockFencesTests):
    """Every capability: what a backend that implements the whole MetadataStore runs."""

    async def test_is_a_metadata_store(self, store: Any) -> None:
        assert isinstance(store, MetadataStore)
