"""The S3 L4 under throttling and stalls, against moto's S3 behind a fault proxy
(tests/sources/s3_faults.py): a SlowDown burst is ridden out within the read's budget, each
throttle backs the limiter off, a body that stalls mid-transfer is retried long before the
request timeout and leaves none of its bytes in the reader's buffer, and a throttle that
outlasts the budget fails the read naming it."""

from __future__ import annotations

import asyncio
import random
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import blobsdk
from blobsdk.config import L1Config, LimiterConfig
from blobsdk.errors import Unavailable
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.net.limiter import AdaptiveLimiter
from blobsdk.net.retry import Backoff
from blobsdk.sources import S3BlockStore
from blobsdk.sources.base import new_block_id
from servers.s3d import S3Server, start_s3

from .s3_faults import S3FaultProxy

MiB = 1 << 20
BUCKET = "faults"
PATH = "/data/blob"
NO_L1 = L1Config(capacity_bytes=0)  # every read goes to S3, straight into the caller's buffer


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with start_s3(tmp_path_factory.mktemp("s3")) as server:
        server.make_bucket(BUCKET)
        yield server


async def _written(moto: S3Server, tmp_path: Path, size: int) -> tuple[str, bytes]:
    """A blob of ``size`` random bytes at PATH, written to moto directly (4 MiB chunks, one
    block): the prefix of its store, and its bytes."""
    data, prefix = random.Random(size).randbytes(size), f"t{secrets.token_hex(4)}"
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        S3BlockStore(BUCKET, prefix, config=moto.config, allow_http=True) as blocks,
        blobsdk.Client.from_stores(meta, blocks) as client,
    ):
        await client.put(PATH, data)
    return prefix, data


def _store(moto: S3Server, proxy: S3FaultProxy, prefix: str, **options: Any) -> S3BlockStore:
    """The store read through ``proxy``, its pauses drawn from a seeded generator."""
    config = {**moto.config, "endpoint": proxy.url}
    backoff = Backoff(rng=random.Random(7).random)
    return S3BlockStore(BUCKET, prefix, config=config, allow_http=True, backoff=backoff, **options)


@asynccontextmanager
async def _reader(moto: S3Server, proxy: S3FaultProxy, tmp_path: Path, prefix: str, **options: Any) -> AsyncIterator[Any]:
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        _store(moto, proxy, prefix, **options) as blocks,
        blobsdk.Client.from_stores(meta, blocks, l1=NO_L1) as client,
    ):
        yield client


async def test_a_slowdown_burst_of_a_second_is_ridden_out_by_a_32_mib_read(moto: S3Server, tmp_path: Path) -> None:
    """Every GET of the read's 8 chunks meets 503 SlowDown for 0.8 s: each is tried again
    after pauses that grow (with jitter) past the burst, and the read returns every byte;
    each SlowDown backs the endpoint's limiter off."""
    prefix, data = await _written(moto, tmp_path, 32 * MiB)
    limiter = AdaptiveLimiter("s3", LimiterConfig(initial=16))
    async with S3FaultProxy(moto.endpoint) as proxy, _reader(moto, proxy, tmp_path, prefix, limiter=limiter) as client:
        proxy.throttle(0.8)
        assert await client.get(PATH) == data
    assert proxy.count("throttled") >= 8 and proxy.count("206") >= 8, proxy.outcomes
    assert limiter.stats()["drops"] == proxy.count("throttled")  # one drop per throttle answered
    assert limiter.limit < 16


async def test_two_of_eight_gets_stalling_mid_body_are_retried_long_before_the_timeout(moto: S3Server, tmp_path: Path) -> None:
    """Two of the 8 GETs send half their body (bytes that are not the object's) and stop: each
    fails after the 0.5 s stall bound and is tried again on a new connection, so the read
    ends long before the 30 s request timeout; every byte in the caller's buffer is the blob's."""
    prefix, data = await _written(moto, tmp_path, 32 * MiB)
    store_options = {"timeout_s": 30.0, "stall_s": 0.5}
    async with S3FaultProxy(moto.endpoint) as proxy, _reader(moto, proxy, tmp_path, prefix, **store_options) as client:
        proxy.stall, proxy.garbage = {2, 5}, True
        out = bytearray(b"\x55") * len(data)
        begun = time.monotonic()
        assert await client.get_into(PATH, out) == len(data)
        took = time.monotonic() - begun
    assert out == data
    assert proxy.count("stalled") == 2 and proxy.count("206") >= 8, proxy.outcomes
    assert took < 15.0, took  # a failure guard: the stall bound ends each stall, not the 30 s timeout


async def test_a_persistent_slowdown_fails_the_read_within_its_budget_naming_the_throttle(moto: S3Server, tmp_path: Path) -> None:
    """S3 answers SlowDown and nothing else: the read's tries spread over its budget (3 s
    here: the store's timeout_s), then it fails with Unavailable saying it was throttled, on
    how many tries, over how long; every one of them backed the limiter off."""
    prefix, _ = await _written(moto, tmp_path, 1 * MiB)
    limiter = AdaptiveLimiter("s3", LimiterConfig(initial=16))
    options: dict[str, Any] = {"timeout_s": 3.0, "limiter": limiter}
    async with S3FaultProxy(moto.endpoint) as proxy, _reader(moto, proxy, tmp_path, prefix, **options) as client:
        proxy.throttle(3600)
        begun = time.monotonic()
        with pytest.raises(Unavailable) as raised:
            await client.get(PATH)
        took = time.monotonic() - begun
    tries = proxy.count("throttled")
    pattern = (
        rf"^chunk [0-9a-f]+: every replica failed; last error: s3://{BUCKET}/{prefix} at http://127\.0\.0\.1:\d+: "
        rf"GET http://127\.0\.0\.1:\d+/{BUCKET}/{prefix}/\S+: HTTP 503 SlowDown: injected by the test; "
        rf"gave up after {tries} tries in \d+\.\ds \(throttled: {tries}\): another pause would pass the budget of 3s$"
    )
    assert re.match(pattern, str(raised.value)), str(raised.value)
    assert tries >= 5  # not a fixed small count (it was 4, over 0.35 s)
    assert took < 3.0 + 5.0, took  # a failure guard: the budget, and the last try's time
    assert limiter.stats()["drops"] == tries


@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (429, "SlowDown"), (500, "InternalError")])
async def test_a_burst_of_throttles_or_internal_errors_is_ridden_out(moto: S3Server, status: int, code: str) -> None:
    """A ranged read through 0.6 s of 503 SlowDown, 429 or S3's 500 InternalError returns
    its bytes; only the throttles (429, 503) back the limiter off."""
    prefix, data, block = f"t{secrets.token_hex(4)}", random.Random(1).randbytes(MiB), new_block_id()
    async with S3BlockStore(BUCKET, prefix, config=moto.config, allow_http=True) as direct:
        await direct.write_block(block, [data])
    limiter = AdaptiveLimiter("s3", LimiterConfig(initial=16))
    async with S3FaultProxy(moto.endpoint) as proxy, _store(moto, proxy, prefix, limiter=limiter) as store:
        proxy.throttle(0.6, status, code)
        assert await store.read_range(block, 100, MiB - 200) == data[100:-100]
    assert proxy.count("throttled") >= 2 and proxy.count("206") == 1, proxy.outcomes
    assert limiter.stats()["drops"] == (proxy.count("throttled") if status != 500 else 0)


async def test_a_cancelled_get_into_stops_during_a_throttles_pause(moto: S3Server, tmp_path: Path) -> None:
    """A get_into whose GET is throttled and that is cancelled during the pause before its next
    try ends at once, not after the read's budget: a read into the caller's buffer is cancelled
    with its caller, since a connection receiving into the buffer is closed by then."""
    prefix, data = await _written(moto, tmp_path, 1 * MiB)
    pausing, never = asyncio.Event(), asyncio.Event()

    async def pause(seconds: float) -> None:
        pausing.set()
        await never.wait()  # a pause longer than any test: only a cancellation ends it

    config = {**moto.config}
    async with S3FaultProxy(moto.endpoint) as proxy:
        config["endpoint"] = proxy.url
        backoff = Backoff(rng=random.Random(7).random, sleep=pause)
        async with (
            SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
            S3BlockStore(BUCKET, prefix, config=config, allow_http=True, backoff=backoff, timeout_s=3600.0) as blocks,
            blobsdk.Client.from_stores(meta, blocks, l1=NO_L1) as client,
        ):
            proxy.throttle(3600)
            read = asyncio.create_task(client.get_into(PATH, bytearray(len(data))))
            await asyncio.wait_for(pausing.wait(), 60)
            read.cancel()
            done, _ = await asyncio.wait([read], timeout=60)  # a failure guard: it ends at once
            assert read in done and read.cancelled()
