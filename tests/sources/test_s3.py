"""blobsdk/sources/_s3.py against real S3 APIs (moto's standalone server, and SeaweedFS, each a
subprocess on free loopback ports): the BlockStore conformance suite, and its faults."""

from __future__ import annotations

import asyncio
import random
import re
import secrets
import time

import pytest
from aiohttp import web

from blobsdk.config import LimiterConfig
from blobsdk.errors import BlockNotFound, Overloaded, PreconditionFailed, Unavailable
from blobsdk.net.limiter import AdaptiveLimiter
from blobsdk.net.retry import Backoff
from blobsdk.sources import S3BlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.testing.sources import BlockReplicaTests, MiB, payload
from servers.s3d import start_s3
from servers.seaweedd import start_seaweed
from tests.helpers import S3_STORES, running_app, s3_server


@pytest.fixture(scope="module", params=S3_STORES)
def s3(request):
    with s3_server(request) as server:
        server.make_bucket("blocks")
        yield server


class TestS3BlockStore(BlockReplicaTests):
    @pytest.fixture
    async def store(self, s3):
        # A fresh prefix per test (the bucket is shared); small parts, so the large-block test
        # goes through a multipart upload.
        async with S3BlockStore(
            "blocks", f"t{secrets.token_hex(6)}", config=s3.config, allow_http=True, multipart_bytes=5 * MiB
        ) as store:
            yield store


async def test_a_large_block_is_uploaded_in_parts_and_reads_back(s3):
    async with S3BlockStore("blocks", "multipart", config=s3.config, allow_http=True, multipart_bytes=5 * MiB) as store:
        data = payload(3 * MiB) * 4  # 12 MiB: three parts
        block = new_block_id()
        await store.write_block(block, [data[: 7 * MiB], data[7 * MiB :]])
        assert await store.read_range(block, 0, len(data)) == data
        assert [(info.block_id, info.size) async for info in store.list_blocks()] == [(block, len(data))]


async def test_a_block_rewritten_with_another_size_is_refused(s3):
    async with S3BlockStore("blocks", "immutable", config=s3.config, allow_http=True) as store:
        block = new_block_id()
        await store.write_block(block, [b"abc"])
        with pytest.raises(PreconditionFailed, match=rf"^block {block} exists with 3 bytes, not 4: blocks are immutable$"):
            await store.write_block(block, [b"abcd"])


async def test_a_missing_bucket_is_block_not_found_and_a_bad_bucket_name_refused(s3):
    async with S3BlockStore("no-such-bucket", config=s3.config, allow_http=True) as store:
        with pytest.raises(BlockNotFound):
            await store.read_range(new_block_id(), 0, 1)
        with pytest.raises(ValueError, match=r"^an S3 bucket name has no '/', got 'a/b'$"):
            S3BlockStore("a/b")


@pytest.mark.parametrize("kind", S3_STORES)
async def test_a_dead_endpoint_is_unavailable_within_its_timeout(tmp_path, kind):
    start = start_seaweed if kind == "seaweedfs" else start_s3  # a server of its own: it is stopped
    with start(tmp_path / "s3") as server:
        server.make_bucket("bkt")
        async with S3BlockStore("bkt", config=server.config, allow_http=True, timeout_s=2.0) as store:
            block = new_block_id()
            await store.write_block(block, [b"x" * 100])
            server.stop()
            begun = time.monotonic()
            # Reads are signed GETs of the SDK's own (sources/_s3get.py), retried like obstore's requests.
            refused = (
                rf"^s3://bkt/ at http://127\.0\.0\.1:\d+: cannot reach the S3 endpoint at 127\.0\.0\.1:\d+"
                rf" \(GET /bkt/{store._key(block)}\): connection refused"
            )
            with pytest.raises(Unavailable, match=refused):
                await store.read_range(block, 0, 100)
            with pytest.raises(Unavailable):
                await store.write_block(new_block_id(), [b"y"])
            assert time.monotonic() - begun < 10
            server.start()  # the same ports
            if kind == "moto":  # moto keeps nothing: an empty S3
                server.make_bucket("bkt")
                with pytest.raises(BlockNotFound):
                    await store.read_range(block, 0, 100)
                await store.write_block(block, [b"x" * 100])
            assert await _once_serving(store, block) == b"x" * 100  # SeaweedFS kept it on disk


async def _once_serving(store: S3BlockStore, block: str, timeout: float = 60.0) -> bytes:
    """The block's first 100 bytes, once the store serves reads again: a restarted SeaweedFS
    answers ListBuckets (its readiness check) before its volume server has registered the
    volumes it loaded, and a read meanwhile is a 500 InternalError (seen on a loaded machine)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await store.read_range(block, 0, 100)
            except Unavailable as exc:
                if "HTTP 500 InternalError" not in str(exc):
                    raise
                await asyncio.sleep(0.2)


def test_the_status_is_read_from_the_status_code_never_from_a_port():
    from blobsdk.sources._s3obstore import _status

    assert (
        _status(Exception("Error performing GET http://127.0.0.1:41653/b/k - Server returned non-2xx status code: 416 Range"))
        == 416
    )
    assert _status(Exception("Error performing GET http://127.0.0.1:41653/b/k in 3ms - error sending request")) == 0


class FakeTime:
    """A clock that only the pauses move: a store's retries spend no real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_slow_down_past_the_budget_is_overloaded_and_each_one_backs_the_limiter_off():
    """A 503 SlowDown that outlasts the read's budget (timeout_s) reaches the read as
    Overloaded (its status carried by the class, not read back from ``__cause__``), after
    tries spread over the budget, not a fixed few; every SlowDown backs the limiter off."""
    slow_down = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    seen: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        seen.append(request.method)
        return web.Response(status=503, body=slow_down, content_type="application/xml")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    fake = FakeTime()
    backoff = Backoff(rng=random.Random(3).random, clock=fake.clock, sleep=fake.sleep)
    async with running_app(app) as url:
        config = {"endpoint": url, "region": "us-east-1", "access_key_id": "test", "secret_access_key": "test"}
        limiter = AdaptiveLimiter("s3", LimiterConfig(initial=20, min_limit=1, max_limit=40))
        async with S3BlockStore("bkt", config=config, allow_http=True, timeout_s=30.0, backoff=backoff, limiter=limiter) as store:
            with pytest.raises(Overloaded) as raised:
                await store.read_range(new_block_id(), 0, 100)
    tries = len(seen)
    assert re.match(
        rf"^s3://bkt/ at http://127\.0\.0\.1:\d+: GET .*: HTTP 503 SlowDown: Please reduce your request rate\.; "
        rf"gave up after {tries} tries in (\d+\.\d)s \(throttled: {tries}\): another pause would pass the budget of 30s$",
        str(raised.value),
    ), str(raised.value)
    assert seen == ["GET"] * tries and 13 <= tries <= 25  # about 17 over 30 s (blobsdk/net/retry.py)
    assert 25.0 <= fake.now < 30.0  # the pauses spent most of the budget, never past it
    assert limiter.stats()["drops"] == tries and limiter.limit < 20


async def test_only_keys_of_the_block_layout_are_listed_as_blocks(s3):
    """Objects beside the blocks (a data object named like an id, an id under the wrong
    shard) are never taken for blocks, so gc can never delete them."""
    import obstore

    store = S3BlockStore("blocks", "layout", config=s3.config, allow_http=True)
    block = new_block_id()
    await store.write_block(block, [b"abc"])
    stray = new_block_id()
    await obstore.put_async(store._store, f"data/{stray}", b"user data")
    await obstore.put_async(store._store, f"zz/{stray}", b"wrong shard")
    assert [(info.block_id, info.size) async for info in store.list_blocks()] == [(block, 3)]


def test_block_time_checks_every_id_and_reads_a_link_ids_time():
    from blobsdk.errors import BadRequest
    from blobsdk.sources.base import block_time, is_link, new_link_id

    for bad in ("abc", "g" * 32, "F" + "0" * 31):
        with pytest.raises(BadRequest, match=r"^invalid block id"):
            block_time(bad)
    link = new_link_id("identity")
    assert is_link(link) and not is_link(new_block_id()) and abs(block_time(link) - time.time()) < 60
