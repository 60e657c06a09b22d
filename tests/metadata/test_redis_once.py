"""blobsdk/metadata/_redis.py's retryable writes (``commit_once``, ``delete_once``) against a
real redis-server: a write sent again with its request id, after it was applied, answers
what the first application did, on a single server and on a Redis Cluster."""

from __future__ import annotations

import secrets

import pytest

from blobsdk.errors import BadRequest, CorruptData, PreconditionFailed
from blobsdk.metadata import RedisMetadataStore
from blobsdk.metadata.base import RetryAwareStore
from blobsdk.testing.plans import make_plan
from blobsdk.wire import CommitOp
from tests.metadata_backends import redis_cluster_fixture, redis_server_fixture  # noqa: F401


@pytest.fixture(params=["single", "cluster"])
async def store(request, redis_server, redis_cluster):
    url = redis_server.url if request.param == "single" else redis_cluster.url
    async with RedisMetadataStore(url, namespace=f"t{secrets.token_hex(6)}") as store:
        yield store


def rid() -> str:
    return secrets.token_hex(16)


async def test_the_redis_store_is_retry_aware(store):
    assert isinstance(store, RetryAwareStore)


async def test_a_conditional_commit_sent_again_answers_its_first_versions_not_a_conflict(store):
    path, request_id = "/b/k", rid()
    await store.commit(path, make_plan(path, seed=1))
    ops = [CommitOp(path=path, plan=make_plan(path, seed=2), if_version=1)]
    first = await store.commit_once(ops, request_id)
    again = await store.commit_once(ops, request_id)
    assert [p.version for p in first] == [p.version for p in again] == [2]
    assert first[0].created == again[0].created
    assert (await store.get_plan(path)).version == 2  # applied once
    with pytest.raises(PreconditionFailed):  # a new request id is a new write
        await store.commit_once(ops, rid())


async def test_a_commit_sent_again_after_another_writer_still_answers_its_own_version(store):
    path, request_id = "/b/k", rid()
    ops = [CommitOp(path=path, plan=make_plan(path, seed=3))]
    (mine,) = await store.commit_once(ops, request_id)
    await store.commit(path, make_plan(path, seed=4))
    (again,) = await store.commit_once(ops, request_id)
    assert again.version == mine.version == 1
    live = await store.get_plan(path)
    assert (live.version, live.etag) == (2, make_plan(path, seed=4).etag)  # theirs is not overwritten


async def test_a_batch_sent_again_is_applied_once(store):
    paths = ["/b/x", "/b/y"]
    ops = [CommitOp(path=p, plan=make_plan(p), if_version=0) for p in paths]
    request_id = rid()
    assert [p.version for p in await store.commit_once(ops, request_id)] == [1, 1]
    assert [p.version for p in await store.commit_once(ops, request_id)] == [1, 1]
    assert [p.version for p in await store.get_plans(paths) if p is not None] == [1, 1]


async def test_a_refused_commit_is_not_remembered(store):
    path, request_id = "/b/k", rid()
    await store.commit(path, make_plan(path))
    ops = [CommitOp(path=path, plan=make_plan(path, seed=2), if_version=0)]
    with pytest.raises(PreconditionFailed):
        await store.commit_once(ops, request_id)
    await store.delete(path)
    assert [p.version for p in await store.commit_once(ops, request_id)] == [2]  # not applied before: applied now


async def test_a_delete_sent_again_answers_what_it_deleted_not_blob_not_found(store):
    path, request_id = "/b/k", rid()
    await store.commit(path, make_plan(path))
    first = await store.delete_once(path, None, "blob", request_id)
    again = await store.delete_once(path, None, "blob", request_id)
    assert first == again and first.version == 1
    await store.commit(path, make_plan(path, seed=5))
    assert await store.delete_once(path, None, "blob", request_id) == first
    assert (await store.get_plan(path)).version == 2  # the later blob is not deleted by the retry


async def test_a_request_id_used_again_for_other_paths_is_bad_request(store):
    request_id = rid()
    await store.commit_once([CommitOp(path="/b/x", plan=make_plan("/b/x"))], request_id)
    with pytest.raises(BadRequest, match=rf"^request_id {request_id} was used for another write$"):
        await store.commit_once([CommitOp(path="/b/y", plan=make_plan("/b/y"))], request_id)
    assert await store.get_plans(["/b/y"]) == [None]
    await store.commit("/b/z", make_plan("/b/z"))
    await store.delete_once("/b/z", None, "blob", request_id2 := rid())
    await store.commit("/b/w", make_plan("/b/w"))
    with pytest.raises(BadRequest, match=rf"^request_id {request_id2} was used for another write$"):
        await store.delete_once("/b/w", None, "blob", request_id2)


@pytest.mark.parametrize("bad", ["", "ABCDEF" * 6, "x" * 32, "0" * 31])
async def test_a_malformed_request_id_is_bad_request(store, bad):
    with pytest.raises(BadRequest, match=r"^invalid request_id .*: want 32 lowercase hex digits$"):
        await store.commit_once([CommitOp(path="/b/x", plan=make_plan("/b/x"))], bad)
    with pytest.raises(BadRequest, match=r"^invalid request_id .*: want 32 lowercase hex digits$"):
        await store.delete_once("/b/x", None, "blob", bad)


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        (b"not json", "JSON is malformed: invalid character (byte 4)"),
        (b"[]", "b'[]' is no list"),
        (b'{"a": 1}', "b'{\"a\": 1}' is no list"),
        (b'["x", [1], ["/b/k"]]', "b'[\"x\", [1], [\"/b/k\"]]': could not convert string to float: 'x'"),
        (b'[1, [1, 2], ["/b/k"]]', "b'[1, [1, 2], [\"/b/k\"]]' is no commit's"),
    ],
)
async def test_a_damaged_write_record_is_corrupt_data_naming_the_path(store, stored, why):
    request_id = rid()
    await store._redis.set(store._keys.request("/b/k", request_id), stored)
    with pytest.raises(CorruptData) as caught:
        await store.commit_once([CommitOp(path="/b/k", plan=make_plan("/b/k"))], request_id)
    assert str(caught.value) == f"the stored record of a write to '/b/k' is corrupt: {why}"
    assert await store.get_plans(["/b/k"]) == [None]
