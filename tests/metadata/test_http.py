from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from blobsdk.errors import BadRequest, BlobNotFound, ClientClosed, CorruptData, Unavailable
from blobsdk.metadata import CachedMetadataStore, HttpMetadataStore, SqliteMetadataStore, _http
from blobsdk.metadata.base import MetadataStore
from blobsdk.testing.metadata import MetadataStoreTests
from blobsdk.testing.plans import bad_plan, make_plan, put
from blobsdk.wire import MAX_PATHS_PER_REQUEST, MSGPACK, CommitOp, CommitResponse, GetPlansResponse, encode
from servers.api import make_app
from tests.helpers import running_app

from .unchecked import plant_plan


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def api_url(tmp_path):
    async with running_app(make_app(SqliteMetadataStore(tmp_path / "meta.sqlite"))) as url:
        yield url


class TestHttpMetadataStore(MetadataStoreTests):
    @pytest.fixture
    async def store(self, session, api_url):
        async with HttpMetadataStore(session, api_url) as store:
            yield store


async def test_is_a_metadata_store(session, api_url):
    assert isinstance(HttpMetadataStore(session, api_url), MetadataStore)


async def test_with_one_server_a_call_is_that_servers_post(session, api_url):
    """Nothing of the failover wraps the one server's call (several: tests/metadata/test_api_failover.py)."""
    store = HttpMetadataStore(session, api_url)
    assert store.servers.call == store.servers.endpoints[0].post
    assert await store.get_plans(["/b/x"]) == [None]
    assert HttpMetadataStore(session, [api_url, api_url]).servers.call != store.servers.endpoints[0].post


async def test_get_plans_splits_long_lists(session, api_url):
    store = HttpMetadataStore(session, api_url)
    count = 2 * MAX_PATHS_PER_REQUEST + 500
    paths = [f"/b/k{i:05d}" for i in range(count)]
    await store.commit_many([CommitOp(path=p, plan=make_plan(p)) for p in paths[::3]])
    got = await store.get_plans(paths)
    assert [plan is not None for plan in got] == [i % 3 == 0 for i in range(count)]
    assert all(plan.path == path for plan, path in zip(got, paths, strict=True) if plan is not None)


async def test_one_plan_is_one_request_with_no_pages_to_gather(session, api_url, monkeypatch):
    store = HttpMetadataStore(session, api_url)
    await store.commit("/b/x", make_plan("/b/x"))

    async def refused(calls):
        raise AssertionError("gathered pages for one path")

    monkeypatch.setattr(_http, "_gather", refused)
    assert (await store.get_plan("/b/x")).path == "/b/x"
    with pytest.raises(BlobNotFound):
        await store.get_plan("/b/y")


async def test_commit_many_over_the_atomic_limit_is_bad_request(session, api_url):
    store = HttpMetadataStore(session, api_url)
    ops = [CommitOp(path=f"/b/k{i}", plan=make_plan(f"/b/k{i}")) for i in range(1001)]
    with pytest.raises(BadRequest, match="1001"):
        await store.commit_many(ops)
    assert await store.get_plans(["/b/k0"]) == [None]


async def test_unreachable_server_is_unavailable(session, tmp_path):
    async with running_app(make_app(SqliteMetadataStore(tmp_path / "m.sqlite"))) as url:
        pass  # the port is free again once the app stopped
    with pytest.raises(Unavailable):
        await HttpMetadataStore(session, url).get_plan("/b/x")


async def test_aclose_leaves_the_session_open(session, api_url):
    async with HttpMetadataStore(session, api_url) as store:
        await put(store, "/b/x")
    assert not session.closed
    assert (await HttpMetadataStore(session, api_url).get_plan("/b/x")).version == 1


async def test_app_closes_its_store_on_cleanup(tmp_path):
    store = SqliteMetadataStore(tmp_path / "m.sqlite")
    async with running_app(make_app(store)):
        await put(store, "/b/x")
    with pytest.raises(ClientClosed):
        await store.get_plan("/b/x")


async def test_a_bad_plan_from_the_server_is_corrupt_data(session, tmp_path):
    db = tmp_path / "planted.sqlite"
    await plant_plan(db, "/b/x", bad_plan("/b/x", None, {"block_id": "../../etc/passwd"}))
    async with running_app(make_app(SqliteMetadataStore(db))) as url:
        store = HttpMetadataStore(session, url)
        with pytest.raises(CorruptData) as exc:
            await store.get_plan("/b/x")
        assert str(exc.value) == (
            "metadata store returned an invalid plan: plan for '/b/x': "
            "chunk 0: invalid block id '../../etc/passwd': want 32 lowercase hex digits"
        )
        with pytest.raises(CorruptData, match="etc/passwd"):
            await store.get_plans(["/b/nope", "/b/x"])


async def test_a_plan_of_another_path_from_the_server_is_corrupt_data(session):
    async def plans(request: web.Request) -> web.Response:
        body = encode(GetPlansResponse(plans=[make_plan("/b/other")]))
        return web.Response(body=body, content_type=MSGPACK)

    app = web.Application()
    app.router.add_post("/v1/plans", plans)
    async with running_app(app) as url:
        with pytest.raises(CorruptData) as exc:
            await HttpMetadataStore(session, url).get_plan("/b/x")
    assert str(exc.value) == "metadata store returned an invalid plan: plan for '/b/other', not for '/b/x'"


PASSWD = (
    "metadata store returned an invalid plan: plan for '/b/x': "
    "chunk 0: invalid block id '../../etc/passwd': want 32 lowercase hex digits"
)


@pytest.fixture
async def lying_url():
    """A metadata server that answers every lookup and every commit with a plan of '/b/x'
    whose first chunk names the block '../../etc/passwd'."""
    bad = bad_plan("/b/x", None, {"block_id": "../../etc/passwd"})

    async def plans(request: web.Request) -> web.Response:
        return web.Response(body=encode(GetPlansResponse(plans=[bad])), content_type=MSGPACK)

    async def commit(request: web.Request) -> web.Response:
        return web.Response(body=encode(CommitResponse(plans=[bad])), content_type=MSGPACK)

    app = web.Application()
    app.router.add_post("/v1/plans", plans)
    app.router.add_post("/v1/commit", commit)
    async with running_app(app) as url:
        yield url


async def test_a_bad_plan_from_a_lying_server_is_refused_where_it_enters(session, lying_url):
    """Looked up or committed, straight or through the plan cache (which checks nothing
    again): the same CorruptData, and nothing cached."""
    store = HttpMetadataStore(session, lying_url)
    cache = CachedMetadataStore(store)
    for reader in (store, cache):
        for call in (
            lambda r=reader: r.get_plan("/b/x"),
            lambda r=reader: r.get_plans(["/b/x"]),
            lambda r=reader: r.commit("/b/x", make_plan("/b/x")),
        ):
            with pytest.raises(CorruptData) as exc:
                await call()
            assert str(exc.value) == PASSWD
    assert cache.peek("/b/x") is None and cache.stats()["entries"] == 0
