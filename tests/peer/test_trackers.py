"""blobsdk/peer/trackers.py against real trackers (servers/tracker.py, in-loop on port 0)."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import msgspec
import pytest
from aiohttp import web

from blobsdk.auth import ServeKey
from blobsdk.peer import trackers
from blobsdk.peer.trackers import HEARTBEAT_MIN_S, HOLD_MAX_S, MAX_SOURCES, Announced, Trackers
from blobsdk.wire import (
    AnnounceResponse,
    ChunkRef,
    HelloResponse,
    Located,
    LocateRequest,
    LocateResponse,
    Source,
    encode,
)
from servers._common.faults import FaultConfig, FaultRule
from servers.tracker import TRACKER, make_app
from servers.tracker_rules import Tracker, TrackerConfig
from tests.helpers import running_app

REFS = [ChunkRef(block_id=f"{i:032x}", offset=0, length=1, raw_length=1, checksum=i) for i in range(40)]
KEYS = [ref.key for ref in REFS]


def pid(n: int) -> str:
    return f"{n:032x}"


class Deployment:
    """Two in-loop trackers and a session; ``peer(n)`` is a Trackers client for peer n."""

    def __init__(self, stack: AsyncExitStack, session: aiohttp.ClientSession) -> None:
        self.stack, self.session = stack, session
        self.urls: list[str] = []
        self.trackers: dict[str, Tracker] = {}

    async def start(self, count: int = 2, config: TrackerConfig | None = None, faults: FaultConfig | None = None) -> None:
        for _ in range(count):
            app = make_app(config, faults=faults)
            url = await self.stack.enter_async_context(running_app(app))
            self.urls.append(url)
            self.trackers[url] = app[TRACKER]

    async def peer(self, n: int, urls: list[str] | None = None, **kwargs: object) -> Trackers:
        client = Trackers(
            self.session,
            urls or self.urls,
            peer_id=pid(n),
            address=f"http://127.0.0.1:{7400 + n}",
            serve_key=ServeKey.generate(),
            **kwargs,
        )  # type: ignore[arg-type]
        return await self.stack.enter_async_context(client)


@pytest.fixture
async def deployment() -> AsyncIterator[Deployment]:
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield Deployment(stack, session)


async def test_keys_are_sharded_over_the_trackers_and_peers_find_each_other(deployment: Deployment) -> None:
    await deployment.start(2)
    first, second = await deployment.peer(1), await deployment.peer(2)
    assert all(sources == [] for sources in (await first.locate(REFS)).values())  # nobody has them: origin
    announced = await first.announce(filled=KEYS)
    assert announced.keep == set(KEYS)
    found = await second.locate(REFS)
    assert all([(s.peer_id, s.complete) for s in found[key]] == [(pid(1), True)] for key in KEYS)
    assert first.tenant == second.tenant == "default"  # the trackers have no auth
    owners = {url: {key for key in KEYS if first.tracker_of(key) == url} for url in deployment.urls}
    assert all(owners.values())  # both trackers own some of the 40 keys
    for url, tracker in deployment.trackers.items():
        assert tracker.swarm_count() == len(owners[url])  # each key lives on its own tracker only


async def test_a_peer_reported_for_bad_bytes_is_banned_and_never_handed_out(deployment: Deployment) -> None:
    await deployment.start(1, TrackerConfig(ban_after=2))
    bad, victim = await deployment.peer(1), await deployment.peer(2)
    await bad.locate(REFS[:2])
    await bad.announce(filled=KEYS[:2])
    assert await victim.report(pid(1), KEYS[0], "bad_bytes") is False
    assert await victim.report(pid(1), KEYS[1], "bad_bytes") is True
    assert (await victim.locate(REFS[:2])) == {KEYS[0]: [], KEYS[1]: []}


async def test_a_dead_tracker_costs_no_read_more_than_a_refused_connect(deployment: Deployment) -> None:
    await deployment.start(1)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = await deployment.peer(1, urls=[*deployment.urls, dead])
    assert client.is_down(dead) and not client.is_down(deployment.urls[0])
    assert client.counts["errors"] == 1  # the refused hello
    found = await client.locate(REFS)
    assert all(s == [] for s in found.values())
    assert client.counts["skipped_down"] == 1  # its keys skipped, not asked
    assert client.counts["errors"] == 1  # not even a refused connect: it was not asked


async def test_a_slow_tracker_is_skipped_within_the_timeout_and_down_after_three_slow_calls(deployment: Deployment) -> None:
    """The call timeout is the real one (asyncio.timeout); how long the tracker stays down runs
    on a fake clock."""
    slow = FaultConfig(rules=(FaultRule(route="/v1/locate", latency_ms=1000.0),))
    await deployment.start(1, faults=slow)
    now = [0.0]
    client = await deployment.peer(1, timeout_s=0.1, down_s=0.3, clock=lambda: now[0])
    (url,) = deployment.urls
    for n in range(1, 4):
        begun = time.perf_counter()
        assert await client.locate(REFS[:1]) == {KEYS[0]: []}
        assert client.counts["timeouts"] == n  # skipped by the timeout: the answer was 1 s away
        # At least the timeout; well short of the 1 s default (a bound for a hang, not for speed).
        assert 0.1 <= time.perf_counter() - begun < 1.0
        assert client.is_down(url) == (n == 3)  # one stall is no outage; three in a row are
    assert client.counts["timeouts"] == 3 and client.counts["errors"] == 1
    assert await client.announce(filled=KEYS[:1]) == Announced()  # dropped at once while down
    assert client.counts["skipped_down"] == 1 and client.counts["timeouts"] == 3  # not asked
    now[0] = 0.299
    assert client.is_down(url)
    now[0] = 0.3
    assert not client.is_down(url)


async def test_a_tracker_that_forgot_the_peer_gets_a_hello_again(deployment: Deployment) -> None:
    await deployment.start(1, TrackerConfig(peer_ttl_s=0.2, heartbeat_s=60))
    forgotten: list[str] = []
    client = await deployment.peer(1, forgotten=forgotten.append)
    assert forgotten == deployment.urls  # the first hello registered it
    await asyncio.sleep(0.25)  # aged out: the heartbeat is a minute away
    assert (await client.announce(filled=KEYS[:1])).keep == {KEYS[0]}
    assert client.counts["hellos_again"] == 1 and client.counts["errors"] == 0
    assert forgotten == deployment.urls * 2  # registered again: the peer tier announces its copies again


async def test_heartbeats_keep_the_peer_known(deployment: Deployment) -> None:
    await deployment.start(1, TrackerConfig(peer_ttl_s=0.3, heartbeat_s=0.05))
    client = await deployment.peer(1)
    await client.announce(filled=KEYS[:1])
    await asyncio.sleep(0.6)
    (tracker,) = deployment.trackers.values()
    assert tracker.peer_count() == 1 and client.counts["hellos"] >= 5
    assert client.counts["hellos_again"] == 0


def test_it_needs_a_tracker() -> None:
    with pytest.raises(ValueError, match="at least one tracker URL"):
        Trackers(None, [], peer_id=pid(1), address="http://127.0.0.1:1", serve_key=ServeKey.generate())  # type: ignore[arg-type]


async def test_a_batch_past_the_tracker_s_request_bound_is_split(deployment: Deployment) -> None:
    await deployment.start(1)
    client = await deployment.peer(1)
    many = [f"{i:040x}" for i in range(5000)]  # one request may carry 4096
    assert (await client.announce(filled=many)).keep == set(many)
    assert client.counts["errors"] == 0
    (tracker,) = deployment.trackers.values()
    assert tracker.swarm_count() == 5000


# --- a tracker that answers nonsense ---------------------------------------------------------------

TICKET = "1999999999." + "A" * 43
HELLO = HelloResponse(heartbeat_s=5.0, ttl_s=15.0, tenant="default")
SELF = "http://127.0.0.1:7401"  # peer 1's own address (Deployment.peer)


def source(address: str, n: int = 2, ticket: str = TICKET) -> Source:
    return Source(peer_id=pid(n), address=address, complete=True, ticket=ticket)


class Liar:
    """An in-loop tracker that answers what the test says, whatever it is asked."""

    def __init__(self) -> None:
        self.hello = HELLO
        self.hellos = 0
        self.sources: list[Source] = []
        self.extra: list[Located] = []  # answers for keys nobody asked about
        self.announced = AnnounceResponse(keep=[], hold=[], hold_s=30.0)
        self.chunked = False  # answers without a Content-Length

    def app(self) -> web.Application:
        async def answer(body: object) -> web.StreamResponse:
            if not self.chunked:
                return web.Response(body=encode(body), content_type="application/msgpack")
            response = web.StreamResponse(headers={"Content-Type": "application/msgpack"})
            response.enable_chunked_encoding()
            await response.prepare(self.request)
            await response.write(encode(body))
            await response.write_eof()
            return response

        async def peers(request: web.Request) -> web.StreamResponse:
            self.hellos += 1
            return await answer(self.hello)

        async def locate(request: web.Request) -> web.StreamResponse:
            self.request = request
            asked = msgspec.msgpack.decode(await request.read(), type=LocateRequest)
            located = [Located(key=ref.key, sources=self.sources) for ref in asked.refs]
            return await answer(LocateResponse(located=located + self.extra))

        async def announce(request: web.Request) -> web.StreamResponse:
            return await answer(self.announced)

        app = web.Application()
        app.router.add_post("/v1/peers", peers)
        app.router.add_post("/v1/locate", locate)
        app.router.add_post("/v1/announce", announce)
        return app


@pytest.fixture
async def liar(deployment: Deployment) -> Liar:
    lying = Liar()
    url = await deployment.stack.enter_async_context(running_app(lying.app()))
    deployment.urls.append(url)
    return lying


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "blobsdk.peer.trackers" and r.levelno == logging.WARNING]


async def test_bad_sources_from_a_tracker_are_skipped_and_counted(
    deployment: Deployment, liar: Liar, caplog: pytest.LogCaptureFixture
) -> None:
    good, other = source("http://127.0.0.1:7402"), source("http://[::1]:7403", n=3)
    liar.sources = [
        source("ftp://127.0.0.1:7402"),
        good,
        source("http://127.0.0.1:99999"),  # a port out of range
        source("garbage"),
        source("http://127.0.0.1:7402/v1/chunks"),  # a path
        source("http://user:pw@127.0.0.1:7402"),  # credentials
        source("http://127.0.0.1"),  # no port
        source("http://127.0.0.1:7405/", n=5),  # a trailing slash: fine
        Source(peer_id="not hex", address="http://127.0.0.1:7406", complete=True, ticket=TICKET),
        source("http://127.0.0.1:7407", ticket="1.x\r\nX-Evil: yes"),  # a header of its own
        source(SELF, n=9),  # this peer itself
        Source(peer_id=pid(1), address="http://127.0.0.1:7408", complete=True, ticket=TICKET),  # its own id
        source("http://127.0.0.1:7402", n=4),  # an address already listed
        other,
    ]
    client = await deployment.peer(1)
    with caplog.at_level(logging.WARNING, logger="blobsdk.peer.trackers"):
        found = await client.locate(REFS[:1])
    assert found == {
        KEYS[0]: [
            good,
            source("http://127.0.0.1:7405", n=5),  # without its trailing slash
            other,
        ]
    }
    assert client.counts["bad_sources"] == 11 and client.counts["errors"] == 0 and not client.is_down(deployment.urls[0])
    assert warnings_of(caplog) == [
        f"tracker {deployment.urls[0]} handed out 11 bad sources, skipped: ftp://127.0.0.1:7402, http://127.0.0.1:99999, garbage"
    ]


async def test_at_most_max_sources_are_kept_and_keys_not_asked_about_are_ignored(deployment: Deployment, liar: Liar) -> None:
    liar.sources = [source(f"http://127.0.0.1:{7410 + n}", n=n + 2) for n in range(3 * MAX_SOURCES)]
    liar.extra = [Located(key=KEYS[5], sources=liar.sources)]
    client = await deployment.peer(1)
    assert await client.locate(REFS[:1]) == {KEYS[0]: liar.sources[:MAX_SOURCES]}
    assert client.counts["bad_sources"] == 0


@pytest.mark.parametrize(
    ("hello", "what"),
    [
        (msgspec.structs.replace(HELLO, heartbeat_s=0.0), "heartbeat_s 0.0 is not a positive number of seconds"),
        (msgspec.structs.replace(HELLO, heartbeat_s=-1.0), "heartbeat_s -1.0 is not a positive number of seconds"),
        (msgspec.structs.replace(HELLO, heartbeat_s=math.nan), "heartbeat_s nan is not a positive number of seconds"),
        (msgspec.structs.replace(HELLO, heartbeat_s=math.inf), "heartbeat_s inf is not a positive number of seconds"),
        (msgspec.structs.replace(HELLO, ttl_s=-5.0), "ttl_s -5.0 is not a positive number of seconds"),
        (msgspec.structs.replace(HELLO, tenant=""), "tenant '' is no tenant name"),
        (msgspec.structs.replace(HELLO, tenant="a\nb"), "tenant 'a\\nb' is no tenant name"),
    ],
)
async def test_a_hello_answered_with_nonsense_is_a_failing_tracker_never_a_busy_loop(
    deployment: Deployment, liar: Liar, hello: HelloResponse, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    liar.hello = hello
    with caplog.at_level(logging.WARNING, logger="blobsdk.peer.trackers"):
        client = await deployment.peer(1, down_s=60)
        await asyncio.sleep(0.1)  # a busy heartbeat loop said thousands of hellos by now
    url = deployment.urls[0]
    assert liar.hellos == 1 and client.is_down(url) and client.tenant is None
    assert client.counts["nonsense"] == 1 and client.counts["errors"] == 1 and client.counts["hellos"] == 0
    assert warnings_of(caplog) == [f"tracker {url} answered nonsense, treated as down: {what}"]
    assert await client.locate(REFS[:1]) == {KEYS[0]: []} and client.counts["skipped_down"] == 1


async def test_a_heartbeat_shorter_than_the_floor_is_sent_at_the_floor(
    deployment: Deployment, liar: Liar, caplog: pytest.LogCaptureFixture
) -> None:
    liar.hello = msgspec.structs.replace(HELLO, heartbeat_s=1e-9)
    with caplog.at_level(logging.WARNING, logger="blobsdk.peer.trackers"):
        client = await deployment.peer(1)
        await asyncio.sleep(0.1)  # at most 0.1 / HEARTBEAT_MIN_S + 1 hellos, never a busy loop
    assert 1 <= liar.hellos <= 0.1 / HEARTBEAT_MIN_S + 1 and not client.is_down(deployment.urls[0])
    url = deployment.urls[0]
    assert warnings_of(caplog)[0] == f"tracker {url} asks for a heartbeat every 1e-09 s: sent every {HEARTBEAT_MIN_S:g} s"


async def test_a_tracker_that_changes_the_peer_s_tenant_is_a_failing_tracker(
    deployment: Deployment, liar: Liar, caplog: pytest.LogCaptureFixture
) -> None:
    client = await deployment.peer(1, forgotten=lambda url: None)
    assert client.tenant == "default"
    liar.hello = msgspec.structs.replace(HELLO, tenant="mallory")
    with caplog.at_level(logging.WARNING, logger="blobsdk.peer.trackers"):
        await client._hello(deployment.urls[0])  # the next heartbeat
    assert client.tenant == "default" and client.is_down(deployment.urls[0])
    what = "tenant 'mallory', but this peer serves tenant 'default'"
    assert warnings_of(caplog) == [f"tracker {deployment.urls[0]} answered nonsense, treated as down: {what}"]


@pytest.mark.parametrize("hold_s", [math.nan, math.inf, -1.0])
async def test_an_announce_answered_with_a_nonsense_hold_is_not_obeyed(deployment: Deployment, liar: Liar, hold_s: float) -> None:
    liar.announced = AnnounceResponse(keep=KEYS[:2], hold=KEYS[2:4], hold_s=hold_s)
    client = await deployment.peer(1)
    assert await client.announce(filled=KEYS[:2], evicting=KEYS[2:4]) == Announced()  # nothing kept or held
    assert client.is_down(deployment.urls[0]) and client.counts["nonsense"] == 1


async def test_an_announce_answer_is_cut_to_the_keys_announced_and_the_longest_hold(deployment: Deployment, liar: Liar) -> None:
    liar.announced = AnnounceResponse(keep=KEYS[:3], hold=KEYS[3:6], hold_s=1e12)
    client = await deployment.peer(1)
    answer = await client.announce(filled=KEYS[:2], evicting=KEYS[3:4])
    assert answer == Announced(keep=set(KEYS[:2]), hold={KEYS[3]}, hold_s=HOLD_MAX_S)
    assert not client.is_down(deployment.urls[0]) and client.counts["nonsense"] == 0


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_answer_past_its_bound_is_a_failure_never_read_whole(
    deployment: Deployment, liar: Liar, monkeypatch: pytest.MonkeyPatch, chunked: bool
) -> None:
    client = await deployment.peer(1)
    monkeypatch.setattr(trackers, "MAX_ANSWER_BYTES", 10_000)
    liar.sources = [source("http://127.0.0.1:7402")]
    liar.extra = [Located(key=f"{n:032x}", sources=liar.sources) for n in range(200)]  # ~20 kB
    liar.chunked = chunked
    assert await client.locate(REFS[:1]) == {KEYS[0]: []}
    assert client.is_down(deployment.urls[0]) and client.counts["errors"] == 1
