"""servers/hddproxy.py: the block servers' HDD model in front of an HTTP origin, by counting
(requests in service at the origin, bytes through each disk's budget), not by timing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import xxhash
from aiohttp import web

from servers.hddproxy import PROXY_KEY, HddModel, Proxy, make_app, start_hddproxy
from servers.seaweedd import start_seaweed
from tests.helpers import running_app

KiB = 1 << 10
MiB = 1 << 20


class Origin:
    """An origin that records what reached it and holds each answer until released."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.release = asyncio.Event()
        self.reached = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with self.reached:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.seen.append((request.method, request.raw_path, dict(request.headers), body))
            self.reached.notify_all()
        await self.release.wait()
        self.in_flight -= 1
        return web.Response(body=b"answer:" + body, status=207, headers={"X-Origin": "yes"})

    async def until_in_flight(self, n: int) -> None:
        async with self.reached:
            await self.reached.wait_for(lambda: self.in_flight == n)


@pytest.fixture
async def origin() -> AsyncIterator[tuple[Origin, str]]:
    origin = Origin()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", origin.handle)
    async with running_app(app) as url:
        yield origin, url


async def test_each_disk_serves_its_spindles_at_once_and_queues_the_rest_fifo(
    origin: tuple[Origin, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, upstream = origin
    fake.release.set()
    app = make_app(upstream, HddModel(disks=1, spindles=2, latency_ms=0, bandwidth_mbps=0))
    disk = app[PROXY_KEY].disks[0]
    gate, moving = asyncio.Event(), []

    async def take_when_open(nbytes: int, take: Callable[[int], Awaitable[None]] = disk.bandwidth.take) -> None:
        moving.append(nbytes)
        await gate.wait()
        await take(nbytes)

    monkeypatch.setattr(disk.bandwidth, "take", take_when_open)
    async with running_app(app) as url, aiohttp.ClientSession() as session:
        gets = [asyncio.create_task(_get(session, f"{url}/b/k{i}")) for i in range(5)]
        await _until(lambda: disk.spindles.queued == 3)
        assert (disk.spindles.in_service, len(moving)) == (2, 2)  # never more than the disk's spindles move bytes
        gate.set()
        answers = await asyncio.gather(*gets)
    assert answers == [(207, b"answer:")] * 5
    assert disk.stripes == 5 and (disk.spindles.in_service, disk.spindles.queued) == (0, 0)


async def test_a_request_reaches_the_origin_as_it_came_and_its_bytes_go_through_its_stripes_disk(
    origin: tuple[Origin, str],
) -> None:
    fake, upstream = origin
    fake.release.set()
    app = make_app(upstream, HddModel(disks=3, spindles=1, latency_ms=0, bandwidth_mbps=0))
    async with running_app(app) as url, aiohttp.ClientSession() as session:
        headers = {"Authorization": "AWS4-HMAC-SHA256 sig", "Range": "bytes=5-9", "Host": "signed.example:1234"}
        async with session.put(f"{url}/bucket/a%2Fb?x=1&y=%20", data=b"12345", headers=headers) as response:
            assert (response.status, await response.read(), response.headers["X-Origin"]) == (207, b"answer:12345", "yes")
    method, path, got, body = fake.seen[0]
    assert (method, path, body) == ("PUT", "/bucket/a%2Fb?x=1&y=%20", b"12345")
    assert {k: got[k] for k in ("Authorization", "Range", "Host")} == headers  # a SigV4 signature still verifies
    proxy = app[PROXY_KEY]
    disk = proxy.store.disk_of("/bucket/a/b", 0)  # the path as decoded; body and answer both on stripe 0
    assert disk.bandwidth.moved == len(b"12345") + len(b"answer:12345")  # both ways, through that disk's budget
    assert sum(d.stripes for d in proxy.disks) == disk.stripes == 2  # the body written, the answer read
    assert proxy.requests == 1


async def test_stats_count_repeats_and_the_log_names_each_requests_process(origin: tuple[Origin, str], tmp_path: Path) -> None:
    """A repeat is a request for a method, path and Range asked for before; ``--log`` writes
    a line per request naming the process whose socket sent it (this one)."""
    fake, upstream = origin
    fake.release.set()
    log = tmp_path / "requests.jsonl"
    app = make_app(upstream, HddModel(disks=1, spindles=1, latency_ms=0, bandwidth_mbps=0), log)
    async with running_app(app) as url, aiohttp.ClientSession() as session:
        for path, ranged in (("a", "bytes=0-9"), ("a", "bytes=10-19"), ("a", "bytes=0-9"), ("b", None), ("b", None)):
            async with session.get(f"{url}/bucket/{path}", headers={"Range": ranged} if ranged else {}) as response:
                assert response.status == 207
        async with session.get(f"{url}/-/stats") as response:
            stats = await response.json()
    assert (stats["requests"], stats["repeats"]) == (5, 2)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["method"], e["path"], e["range"], e["status"], e["bytes"]) for e in lines] == [
        ("GET", "/bucket/a", "bytes=0-9", 207, len(b"answer:")),
        ("GET", "/bucket/a", "bytes=10-19", 207, len(b"answer:")),
        ("GET", "/bucket/a", "bytes=0-9", 207, len(b"answer:")),
        ("GET", "/bucket/b", None, 207, len(b"answer:")),
        ("GET", "/bucket/b", None, 207, len(b"answer:")),
    ]
    assert {(e["pid"], e["ppid"]) for e in lines} == {(os.getpid(), os.getppid())}
    assert all(e["begun"] <= e["ended"] and e["client"].startswith("127.0.0.1:") for e in lines)


async def test_the_timeline_lists_each_request_begun_since_a_time(origin: tuple[Origin, str]) -> None:
    """``GET /-/timeline?since=T``: (begun, ended, bytes back) of each request begun at T
    or later, on this host's monotonic clock; a ``since`` that is not a number is a 400."""
    fake, upstream = origin
    fake.release.set()
    app = make_app(upstream, HddModel(disks=1, spindles=1, latency_ms=0, bandwidth_mbps=0))
    async with running_app(app) as url, aiohttp.ClientSession() as session:
        async with session.get(f"{url}/bucket/early") as response:
            assert response.status == 207
        between = time.monotonic()
        for body in (b"1", b"22"):
            async with session.put(f"{url}/bucket/late", data=body) as response:
                assert response.status == 207
        async with session.get(f"{url}/-/timeline", params={"since": repr(between)}) as response:
            late = await response.json()
        async with session.get(f"{url}/-/timeline") as response:
            every = await response.json()
        async with session.get(f"{url}/-/timeline", params={"since": "soon"}) as response:
            assert (response.status, await response.text()) == (400, "since must be a number, got 'soon'")
    assert [n for _, _, n in late] == [len(b"answer:1"), len(b"answer:22")]
    assert all(between <= begun <= ended <= time.monotonic() for begun, ended, _ in late)
    assert [n for _, _, n in every] == [len(b"answer:"), len(b"answer:1"), len(b"answer:22")]


def test_each_stripe_of_an_object_has_its_disk() -> None:
    store = Proxy("http://origin", HddModel(disks=3, stripe_bytes=4 * MiB)).store
    assert store.disk_of("/b/k", 0) is store.disk_of("/b/k", 0)
    assert {id(store.disk_of("/b/big", s)) for s in range(32)} == {id(d) for d in store.disks}
    objects = [store.disk_of(f"/b/k{i}", 0) for i in range(300)]
    assert all(60 < objects.count(d) < 140 for d in store.disks)


def test_an_objects_stripes_are_laid_over_the_disks_in_turn() -> None:
    store = Proxy("http://origin", HddModel(disks=3, stripe_bytes=4 * MiB)).store
    for name in ("/b/a", "/b/blocks/0190f3c2", "/b/c"):
        disks = [store.disk_of(name, s) for s in range(16)]  # a 64 MiB block: 16 stripes
        assert all(disks[s] is not disks[s + 1] for s in range(15))
        assert sorted(disks.count(d) for d in store.disks) == [5, 5, 6]


def _disk_index(path: str, stripe: int, disks: int) -> int:
    return (xxhash.xxh3_64_intdigest(path.encode()) + stripe) % disks


async def _sized_origin(request: web.Request) -> web.Response:
    return web.Response(body=bytes(int(request.match_info["size"])))


async def test_a_large_request_is_served_by_each_stripes_own_disk() -> None:
    """A striped store reads a large request's stripes from their own disks: every byte goes
    through the budget of its stripe's disk, not the first byte's."""
    upstream = web.Application()
    upstream.router.add_get("/b/{size}", _sized_origin)
    stripe, size, start = 64 * KiB, 1 * MiB + 1000, 3 * 64 * KiB + 5
    app = make_app("", HddModel(disks=3, spindles=1, latency_ms=0, bandwidth_mbps=0, stripe_bytes=stripe))
    async with running_app(upstream) as origin_url:
        app[PROXY_KEY].upstream = origin_url
        async with running_app(app) as url, aiohttp.ClientSession() as session:
            headers = {"Range": f"bytes={start}-"}  # the origin answers 200 with `size` bytes; the proxy counts from `start`
            async with session.get(f"{url}/b/{size}", headers=headers) as response:
                assert await response.read() == bytes(size)
    want = [0, 0, 0]
    for offset in range(start, start + size):
        if offset == start or offset % stripe == 0:
            run_end = min(start + size, (offset // stripe + 1) * stripe)
            want[_disk_index(f"/b/{size}", offset // stripe, 3)] += run_end - offset
    proxy = app[PROXY_KEY]
    assert [d.bandwidth.moved for d in proxy.disks] == want
    assert min(want) > 0  # the request met every disk
    assert sum(d.stripes for d in proxy.disks) == (start + size - 1) // stripe - start // stripe + 1


async def test_a_requests_stripes_on_different_disks_are_in_service_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each disk has 1 spindle; a request of two stripes on two disks holds both at once."""
    stripe = 1024
    path = next(f"/b/{n}" for n in range(2 * stripe, 3 * stripe) if _disk_index(f"/b/{n}", 0, 2) != _disk_index(f"/b/{n}", 1, 2))
    upstream = web.Application()
    upstream.router.add_get("/b/{size}", _sized_origin)
    app = make_app("", HddModel(disks=2, spindles=1, latency_ms=0, bandwidth_mbps=0, stripe_bytes=stripe))
    gate, moving = asyncio.Event(), set()

    def gated(disk: int, take: Callable[[int], Awaitable[None]]) -> Callable[[int], Awaitable[None]]:
        async def take_when_open(nbytes: int) -> None:
            moving.add(disk)
            await gate.wait()
            await take(nbytes)

        return take_when_open

    for i, disk in enumerate(app[PROXY_KEY].disks):
        monkeypatch.setattr(disk.bandwidth, "take", gated(i, disk.bandwidth.take))
    async with running_app(upstream) as origin_url:
        app[PROXY_KEY].upstream = origin_url
        async with running_app(app) as url, aiohttp.ClientSession() as session:
            get = asyncio.create_task(_get(session, f"{url}{path}"))
            await _until(lambda: moving == {0, 1})
            assert [d.spindles.in_service for d in app[PROXY_KEY].disks] == [1, 1]
            gate.set()
            assert await get == (200, bytes(int(path.rsplit("/", 1)[1])))


def test_the_model_must_make_sense() -> None:
    with pytest.raises(ValueError, match=r"^need disks >= 1, spindles, latency_ms and bandwidth_mbps >= 0, stripe_bytes >= 1$"):
        HddModel(disks=0)


def test_seaweedfs_answers_signed_requests_through_the_proxy(tmp_path: Path) -> None:
    """A SigV4-signed PUT, ranged GET and listing made for the proxy's address verify at
    SeaweedFS (the proxy forwards Host as it came)."""
    import boto3
    from botocore.config import Config

    with (
        start_seaweed(tmp_path / "seaweedfs") as seaweed,
        start_hddproxy(tmp_path / "proxy", seaweed.endpoint, HddModel()) as proxy,
    ):
        seaweed.make_bucket("bucket-one")
        options = seaweed.config
        s3 = boto3.client(
            "s3",
            endpoint_url=proxy.endpoint,
            region_name=options["region"],
            aws_access_key_id=options["access_key_id"],
            aws_secret_access_key=options["secret_access_key"],
            config=Config(s3={"addressing_style": "path"}),
        )
        data = bytes(range(256)) * 4096
        s3.put_object(Bucket="bucket-one", Key="dir/one two", Body=data)
        ranged = s3.get_object(Bucket="bucket-one", Key="dir/one two", Range="bytes=1000-1999")["Body"].read()
        listed = [o["Key"] for o in s3.list_objects_v2(Bucket="bucket-one", Prefix="dir/")["Contents"]]
        assert proxy.process is not None and proxy.process.poll() is None
        stats = proxy.stats()
    assert stats["requests"] >= 4  # the readiness probe, the PUT, the GET and the listing
    assert stats["bytes"] >= len(data) + 1000
    assert (ranged, listed) == (data[1000:2000], ["dir/one two"])


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with session.get(url) as response:
        return response.status, await response.read()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in 5 s")
