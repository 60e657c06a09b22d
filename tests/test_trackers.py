"""blobsdk/trackers.py against real trackers (servers/tracker.py, in-loop on port 0)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from blobsdk.auth import ServeKey
from blobsdk.trackers import Announced, Trackers
from blobsdk.wire import ChunkRef
from servers._common.faults import FaultConfig, FaultRule
from servers.tracker import TRACKER, Tracker, TrackerConfig, make_app
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
    begun = time.perf_counter()
    found = await client.locate(REFS)
    assert time.perf_counter() - begun < 0.2 and all(s == [] for s in found.values())
    assert client.counts["skipped_down"] == 1  # its keys skipped, not asked


async def test_a_slow_tracker_is_skipped_within_the_timeout_and_down_after_three_slow_calls(deployment: Deployment) -> None:
    slow = FaultConfig(rules=(FaultRule(route="/v1/locate", latency_ms=1000.0),))
    await deployment.start(1, faults=slow)
    client = await deployment.peer(1, timeout_s=0.1, down_s=0.3)
    for n in range(1, 4):
        begun = time.perf_counter()
        assert await client.locate(REFS[:1]) == {KEYS[0]: []}
        assert 0.1 <= time.perf_counter() - begun < 0.5
        assert client.is_down(deployment.urls[0]) == (n == 3)  # one stall is no outage; three in a row are
    assert client.counts["timeouts"] == 3 and client.counts["errors"] == 1
    begun = time.perf_counter()
    assert await client.announce(filled=KEYS[:1]) == Announced()  # dropped at once while down
    assert time.perf_counter() - begun < 0.05
    await asyncio.sleep(0.35)
    assert not client.is_down(deployment.urls[0])


async def test_a_tracker_that_forgot_the_peer_gets_a_hello_again(deployment: Deployment) -> None:
    await deployment.start(1, TrackerConfig(peer_ttl_s=0.2, heartbeat_s=60))
    client = await deployment.peer(1)
    await asyncio.sleep(0.25)  # aged out: the heartbeat is a minute away
    assert (await client.announce(filled=KEYS[:1])).keep == {KEYS[0]}
    assert client.counts["hellos_again"] == 1 and client.counts["errors"] == 0


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
