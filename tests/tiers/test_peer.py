"""The peer tier (blobsdk/tiers/_peer.py, blobsdk/peer/server.py): real clients, each with its
own peer server, over a real cluster (API and block server processes) and a real tracker
(in-loop, so each test has a fresh one and can look at its state)."""

from __future__ import annotations

import asyncio
import math
import mmap
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import aiohttp
import msgspec
import pytest

import blobsdk
from blobsdk.auth import TICKET_HEADER, ServeKey
from blobsdk.config import ClientConfig, L1Config, PeerConfig, ReadConfig, WriteConfig
from blobsdk.net.serving import listening
from blobsdk.peer.trackers import Trackers, tracker_servers
from blobsdk.runtime.buffers import MAPPED_FROM
from blobsdk.tiers import PeerTier
from blobsdk.wire import PROGRESS_HEADER, ErrorBody, chunk_query
from servers.cluster import Cluster, start_cluster
from servers.tracker import TRACKER, make_app
from servers.tracker_rules import Tracker, TrackerConfig
from tests.helpers import ROOT, running_app
from tests.peer.test_trackers import Liar, source

CHUNK = 64 << 10
WRITE = WriteConfig(chunk_size=CHUNK, block_size=1 << 20)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("cluster"), block_servers=1, l3_nodes=0, trackers=0) as running:
        yield running


class Swarm:
    """A fresh in-loop tracker and the clients of one test, all closed at its end."""

    def __init__(self, stack: AsyncExitStack, cluster: Cluster, tracker_url: str, tracker: Tracker) -> None:
        self.stack, self.cluster, self.url, self.tracker = stack, cluster, tracker_url, tracker

    def config(self, peer: PeerConfig | None = None, **changes: object) -> ClientConfig:
        return msgspec.structs.replace(
            self.cluster.config, tracker_urls=(self.url,), write=WRITE, peer=peer or PeerConfig(), **changes
        )

    async def client(self, peer: PeerConfig | None = None, **changes: object) -> blobsdk.Client:
        return await self.stack.enter_async_context(blobsdk.Client(self.config(peer, **changes)))


@pytest.fixture
async def swarm(cluster: Cluster, request: pytest.FixtureRequest) -> AsyncIterator[Swarm]:
    config = getattr(request, "param", None) or TrackerConfig()
    app = make_app(config)
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(running_app(app))
        yield Swarm(stack, cluster, url, app[TRACKER])


def peer_of(client: blobsdk.Client) -> PeerTier:
    return next(t for t in client._open.readpath.tiers if isinstance(t, PeerTier))


def hits(client: blobsdk.Client) -> dict[str, int]:
    stats = client.stats()
    return {tier: int(stats[tier]["hits"]) for tier in ("peer", "l4")}


async def written(client: blobsdk.Client, path: str, chunks: int) -> bytes:
    data = os.urandom(chunks * CHUNK)
    await client.put(path, data)
    return data


async def announced(*clients: blobsdk.Client) -> None:
    """Long enough for the peers' batched announcements to reach the tracker."""
    await asyncio.sleep(0.15)


async def test_a_second_client_reads_every_chunk_from_the_first(swarm: Swarm) -> None:
    a, b = await swarm.client(), await swarm.client()
    data = await written(a, "/p/one", 6)
    assert await a.get("/p/one") == data
    await announced()
    assert await b.get("/p/one") == data
    assert hits(a) == {"peer": 0, "l4": 6} and hits(b) == {"peer": 6, "l4": 0}
    assert b.stats()["l1"]["hits"] == 0 and a.stats()["peer"]["uploads"] == 6
    assert a.stats()["peer"]["bytes_served"] == len(data)
    assert swarm.tracker.stats()["counts"]["located_peer"] == 6


async def test_chunks_a_deep_prefetch_brought_are_served_to_peers(swarm: Swarm) -> None:
    a, b = await swarm.client(), await swarm.client()
    data = await written(a, "/p/warm", 5)
    await a.prefetch("/p/warm", tier="l1").wait()
    await announced()
    assert await b.get("/p/warm") == data
    assert hits(b) == {"peer": 5, "l4": 0} and a.stats()["peer"]["uploads"] == 5


async def test_the_last_copy_of_a_chunk_in_demand_is_held_past_the_budget(swarm: Swarm) -> None:
    a = await swarm.client(PeerConfig(budget_bytes=2 * CHUNK))
    data = await written(a, "/p/held", 4)
    assert await a.get("/p/held") == data  # its serving cache keeps 2 chunks: 2 are evicted
    await announced()
    stats = a.stats()["peer"]
    assert stats["held"] == 2 and stats["serving_entries"] == 4  # the tracker: hold them (asked for within its demand window)
    assert swarm.tracker.stats()["counts"]["last_copies_held"] == 2
    b = await swarm.client()
    assert await b.get("/p/held") == data
    assert hits(b) == {"peer": 4, "l4": 0}


async def test_concurrent_readers_take_each_chunk_from_the_origin_once(swarm: Swarm) -> None:
    clients = [await swarm.client() for _ in range(5)]
    data = await written(clients[0], "/p/many", 24)
    results = await asyncio.gather(*(c.get("/p/many") for c in clients))
    assert all(r == data for r in results)
    assert sum(hits(c)["l4"] for c in clients) == 24  # the others got every chunk from a peer
    assert sum(hits(c)["peer"] for c in clients) == 4 * 24
    assert all(c.stats()["peer"]["uploads_refused"] == 0 for c in clients)


@pytest.mark.parametrize("swarm", [TrackerConfig(fanout=2)], indirect=True)
async def test_many_children_on_one_source_keep_to_the_fan_out_bound(swarm: Swarm) -> None:
    holder = await swarm.client()
    data = await written(holder, "/p/fan", 4)
    assert await holder.get("/p/fan") == data
    await announced()
    children = [await swarm.client() for _ in range(6)]
    assert all(r == data for r in await asyncio.gather(*(c.get("/p/fan") for c in children)))
    assert sum(hits(c)["l4"] for c in children) == 0  # a tree: every chunk from a peer
    assert sum(hits(c)["peer"] for c in children) == 6 * 4
    assert holder.stats()["peer"]["uploads"] <= 2 * 4  # at most 2 children per chunk; the rest from them


@pytest.mark.parametrize("swarm", [TrackerConfig(ban_after=3)], indirect=True)
async def test_a_peer_serving_wrong_bytes_is_rejected_reported_then_banned(swarm: Swarm) -> None:
    bad, victim, later = await swarm.client(), await swarm.client(), await swarm.client()
    data = await written(bad, "/p/bad", 3)
    assert await bad.get("/p/bad") == data
    serving = peer_of(bad).sharing.serving
    for key in list(serving):
        serving[key] = memoryview(bytes(len(serving[key])))  # its memory went bad
    await announced()
    assert await victim.get("/p/bad") == data  # every bad copy rejected: read from L4
    assert victim.stats()["peer"]["corrupt"] == 3 and hits(victim) == {"peer": 0, "l4": 3}
    await asyncio.sleep(0.1)  # the reports are sent in the background
    counts = swarm.tracker.stats()["counts"]
    assert counts["reports_bad_bytes"] == 3 and counts["peers_banned"] == 1
    await announced()
    assert await later.get("/p/bad") == data
    assert later.stats()["peer"]["corrupt"] == 0 and hits(later) == {"peer": 3, "l4": 0}  # from the victim


async def test_a_stale_entry_is_a_404_and_the_read_goes_on(swarm: Swarm) -> None:
    a, b = await swarm.client(), await swarm.client()
    data = await written(a, "/p/stale", 4)
    assert await a.get("/p/stale") == data
    await announced()
    peer_of(a).sharing.serving.clear()  # evicted without telling the tracker
    assert await b.get("/p/stale") == data
    assert hits(b) == {"peer": 0, "l4": 4} and a.stats()["peer"]["uploads_missing"] == 4
    await asyncio.sleep(0.1)
    assert swarm.tracker.stats()["counts"]["reports_missing"] == 4
    assert b.stats()["peer"]["errors"] == 0  # no fault of a's: not counted as a failure


async def test_with_the_tracker_down_reads_go_to_the_origin_without_an_error(cluster: Cluster) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = msgspec.structs.replace(cluster.config, tracker_urls=(dead,), write=WRITE)
    async with blobsdk.Client(config) as a, blobsdk.Client(config) as b:
        data = await written(a, "/p/down", 3)
        assert await a.get("/p/down") == data and await b.get("/p/down") == data
        assert hits(b) == {"peer": 0, "l4": 3} and b.stats()["peer"]["tracker_errors"] >= 1


async def test_a_source_outside_the_allowed_networks_is_never_contacted(swarm: Swarm) -> None:
    a = await swarm.client()
    b = await swarm.client(PeerConfig(allowed_networks=("10.0.0.0/8",)))
    data = await written(a, "/p/far", 3)
    assert await a.get("/p/far") == data
    await announced()
    assert await b.get("/p/far") == data
    assert hits(b) == {"peer": 0, "l4": 3} and b.stats()["peer"]["disallowed"] == 3
    assert a.stats()["peer"]["uploads"] == 0


async def test_the_peer_server_serves_only_against_a_valid_ticket(swarm: Swarm) -> None:
    a, b = await swarm.client(), await swarm.client()
    data = await written(a, "/p/guarded", 2)
    assert await a.get("/p/guarded") == data
    await announced()
    ref, other = (await b.plan("/p/guarded")).chunks
    tier = peer_of(a)
    url = f"{tier.address}/v1/chunks/{ref.key}?{chunk_query(ref)}"
    good = tier.sharing.serve_key.ticket("default", ref.key, int(time.time()) + 60)

    async def get(session: aiohttp.ClientSession, url: str, ticket: str | None) -> tuple[int, object]:
        async with session.get(url, headers={TICKET_HEADER: ticket} if ticket else {}) as resp:
            body = await resp.read()
            return resp.status, body if resp.status == 200 else msgspec.msgpack.decode(body, type=ErrorBody)

    async with aiohttp.ClientSession() as s:
        assert await get(s, url, good) == (200, data[:CHUNK])
        assert await get(s, url, None) == (
            401,
            ErrorBody(
                code="unauthorized",
                message=f"a serve ticket from the tracker (header {TICKET_HEADER}) is needed to fetch chunk {ref.key}",
            ),
        )
        refused = ErrorBody(
            code="forbidden", message=f"the serve ticket is not this peer's for tenant 'default' and chunk {ref.key}"
        )
        assert await get(s, url, ServeKey.generate().ticket("default", ref.key, int(time.time()) + 60)) == (403, refused)
        assert await get(s, url, tier.sharing.serve_key.ticket("bob", ref.key, int(time.time()) + 60)) == (403, refused)
        assert await get(s, url, tier.sharing.serve_key.ticket("default", other.key, int(time.time()) + 60)) == (403, refused)
        expired = await get(s, url, tier.sharing.serve_key.ticket("default", ref.key, int(time.time()) - 120))
        assert expired[0] == 403 and "serve ticket expired at" in expired[1].message  # type: ignore[union-attr]
        wrong_key = f"{tier.address}/v1/chunks/{other.key}?{chunk_query(ref)}"
        assert await get(s, wrong_key, good) == (
            400,
            ErrorBody(code="bad_request", message=f"the chunk reference in the query is not that of chunk {other.key}"),
        )
        async with s.get(url, headers={TICKET_HEADER: good, PROGRESS_HEADER: "5"}) as resp:  # a 102 every 5 ms
            assert resp.status == 400 and msgspec.msgpack.decode(await resp.read(), type=ErrorBody) == ErrorBody(
                code="bad_request", message="X-Blobsdk-Progress must be 10 to 60000 ms, got '5'"
            )
        tier.sharing.serving.clear()
        assert await get(s, url, good) == (
            404,
            ErrorBody(code="not_found", message=f"chunk {ref.key}: this peer does not hold it (any more)"),
        )
        tier.sharing.server.uploads = tier.config.max_uploads  # as if that many were sending
        assert await get(s, url, good) == (
            429,
            ErrorBody(code="peer_busy", message="peer busy: 8 uploads in flight, at most 8"),
        )
        tier.sharing.server.uploads = 0


PEER_SCRIPT = """
import asyncio, sys
import blobsdk

async def main():
    config = blobsdk.ClientConfig.from_toml(sys.argv[1])
    async with blobsdk.Client(config) as client:
        await client.get(sys.argv[2])
        await asyncio.sleep(0.2)  # announced
        print("ready", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


@asynccontextmanager
async def peer_process(swarm: Swarm, tmp_path: Path, path: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """A client in a process of its own that has read ``path`` (so it holds its chunks)."""
    config = tmp_path / "client.toml"
    config.write_text(swarm.config().to_toml())
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER_SCRIPT, str(config), path, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert peer.stdout is not None
        assert await asyncio.wait_for(peer.stdout.readline(), 30) == b"ready\n"
        yield peer
    finally:
        if peer.returncode is None:
            peer.send_signal(signal.SIGCONT)
            peer.kill()
        await peer.wait()


async def test_a_peer_killed_mid_transfer_costs_its_children_nothing_but_time(swarm: Swarm, tmp_path: Path) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/killed", 160)
    async with peer_process(swarm, tmp_path, "/p/killed") as peer:
        child = await swarm.client(read=ReadConfig(parallel_chunks=2))
        reading = asyncio.create_task(child.get("/p/killed"))
        while hits(child)["peer"] < 10:
            await asyncio.sleep(0.001)
        peer.send_signal(signal.SIGKILL)
        assert await reading == data  # every byte verified, whatever was cut off
    got = hits(child)
    assert got["peer"] >= 10 and got["l4"] >= 1 and got["peer"] + got["l4"] == 160
    assert child.stats()["peer"]["errors"] >= 1  # it did try the dead peer


async def test_a_stopped_holder_is_failed_over_within_its_hang_deadline(swarm: Swarm, tmp_path: Path) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/stopped", 20)
    async with peer_process(swarm, tmp_path, "/p/stopped") as peer:
        peer.send_signal(signal.SIGSTOP)  # the kernel still accepts its connections
        child = await swarm.client()
        begun = time.perf_counter()
        assert await child.get("/p/stopped") == data
        elapsed = time.perf_counter() - begun
    assert elapsed < 3.0  # one hang deadline (<= 1 s), not a 10 s socket timeout per chunk
    assert hits(child) == {"peer": 0, "l4": 20} and child.stats()["peer"]["hedge_hung_failovers"] >= 1


async def test_a_source_whose_chunk_never_lands_answers_404_after_its_wait(swarm: Swarm) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/never", 1)
    (ref,) = (await writer.plan("/p/never")).chunks
    stuck = peer_of(await swarm.client(PeerConfig(wait_s=0.3)))
    expected = time.perf_counter()
    stuck.sharing.expect(ref.key)  # as if its fetch from the origin never ended
    assert stuck._trackers is not None and await stuck._trackers.locate([ref]) == {ref.key: []}  # the first asker
    child = await swarm.client()
    begun = time.perf_counter()
    assert await child.get("/p/never") == data
    # The source gives up 0.3 s after its fetch began (its announce loop frees the waiters) or
    # after the child's request came, whichever is first: the lower bound counts from the
    # former (the setup between them takes long on a loaded machine), the upper from the read.
    assert time.perf_counter() - expected >= 0.3 and time.perf_counter() - begun < 1.3
    assert hits(child) == {"peer": 0, "l4": 1} and child.stats()["peer"]["errors"] == 0  # a 404 is no fault
    assert stuck.extra_stats()["uploads_missing"] == 1


async def test_a_fetcher_that_never_answers_costs_a_child_its_wait_and_a_second(swarm: Swarm) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/silent", 1)
    (ref,) = (await writer.plan("/p/silent")).chunks
    with socket.socket() as silent:  # a stopped peer: the kernel accepts, nobody answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        async with aiohttp.ClientSession() as session:
            fetcher = Trackers(session, [swarm.url], peer_id="f" * 32, address=address, serve_key=ServeKey.generate())
            async with fetcher:
                assert await fetcher.locate([ref]) == {ref.key: []}  # recorded as fetching it
                child = await swarm.client(PeerConfig(wait_s=0.3))
                begun = time.perf_counter()
                assert await child.get("/p/silent") == data
                elapsed = time.perf_counter() - begun
    assert 1.3 <= elapsed < 2.5  # its wait_s plus a second for the answer, then the origin
    assert hits(child) == {"peer": 0, "l4": 1} and child.stats()["peer"]["errors"] == 1


async def test_a_silent_fetcher_is_left_after_the_timeout_not_the_whole_wait(swarm: Swarm) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/hushed", 1)
    (ref,) = (await writer.plan("/p/hushed")).chunks
    with silent_peers(1) as (address,):  # a stopped peer: the kernel accepts, nobody answers
        async with aiohttp.ClientSession() as session:
            fetcher = Trackers(session, [swarm.url], peer_id="f" * 32, address=address, serve_key=ServeKey.generate())
            async with fetcher:
                assert await fetcher.locate([ref]) == {ref.key: []}  # recorded as fetching it
                child = await swarm.client(PeerConfig(wait_s=60.0, timeout_s=0.5))
                async with asyncio.timeout(20):  # its wait (61 s) would end far later
                    assert await child.get("/p/hushed") == data
    # No 102 Processing and no byte for timeout_s: stopped or cut off, reported, then the origin.
    assert hits(child) == {"peer": 0, "l4": 1} and child.stats()["peer"]["errors"] == 1


async def test_a_child_waits_past_its_timeout_at_a_fetcher_that_says_processing(swarm: Swarm) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/patient", 1)
    (ref,) = (await writer.plan("/p/patient")).chunks
    fetching = peer_of(await swarm.client(PeerConfig(wait_s=60.0)))
    fetching.sharing.expect(ref.key)  # as if its fetch from the origin were on a slow link
    assert fetching._trackers is not None and await fetching._trackers.locate([ref]) == {ref.key: []}
    child = await swarm.client(PeerConfig(wait_s=60.0, timeout_s=2.0))  # a 102 every 0.5 s asked
    reading = asyncio.create_task(child.get("/p/patient"))
    server = fetching.sharing.server
    await until(lambda: server.counts["beats"] >= 6, within=20)  # 3 s of 102s: past the child's timeout_s
    assert not reading.done()
    fetching.sharing.landed(ref.key, memoryview(bytearray(data)))
    assert await reading == data
    assert hits(child) == {"peer": 1, "l4": 0} and child.stats()["peer"]["errors"] == 0


async def test_a_child_whose_sources_are_all_busy_tries_them_again_rather_than_the_origin(swarm: Swarm) -> None:
    a = await swarm.client()
    data = await written(a, "/p/busy", 1)
    assert await a.get("/p/busy") == data
    await announced()
    server = peer_of(a).sharing.server
    server.uploads = peer_of(a).config.max_uploads  # as if that many were sending: it refuses (429)
    child = await swarm.client()
    reading = asyncio.create_task(child.get("/p/busy"))
    await until(lambda: server.counts["refused"] >= 2)  # refused, and asked again after a pause
    server.uploads = 0
    assert await reading == data
    assert hits(child) == {"peer": 1, "l4": 0} and child.stats()["peer"]["busy_waits"] >= 1


async def test_a_malformed_source_address_is_skipped_and_the_read_goes_on(cluster: Cluster) -> None:
    liar = Liar()  # a tracker that hands out addresses no peer has
    liar.sources = [source("ftp://127.0.0.1:7402"), source("http://127.0.0.1:99999"), source("http://127.0.0.1:7402:1")]
    async with running_app(liar.app()) as url:
        config = msgspec.structs.replace(cluster.config, tracker_urls=(url,), write=WRITE)
        async with blobsdk.Client(config) as client:
            data = await written(client, "/p/malformed", 2)
            assert await client.get("/p/malformed") == data
            stats = client.stats()["peer"]
    assert stats["bad_sources"] == 2 * 3 and stats["misses"] == 2 and stats["tracker_errors"] == 0


@contextmanager
def silent_peers(count: int) -> Iterator[list[str]]:
    """``count`` addresses where the kernel accepts and nobody ever answers: stopped peers."""
    with ExitStack() as stack:
        addresses = []
        for _ in range(count):
            silent = stack.enter_context(socket.socket())
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            addresses.append(f"http://127.0.0.1:{silent.getsockname()[1]}")
        yield addresses


@pytest.mark.parametrize("swarm", [TrackerConfig(max_sources=8)], indirect=True)
async def test_many_silent_sources_cost_a_chunk_one_budget_not_one_wait_each(swarm: Swarm) -> None:
    writer = await swarm.client()
    data = await written(writer, "/p/liars", 1)
    (ref,) = (await writer.plan("/p/liars")).chunks
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        for n, address in enumerate(stack.enter_context(silent_peers(8))):
            liar = Trackers(session, [swarm.url], peer_id=f"{n + 1:032x}", address=address, serve_key=ServeKey.generate())
            await stack.enter_async_context(liar)
            await liar.locate([ref])  # "still fetching it": sent to every later asker
            if n < 2:
                await liar.announce(filled=[ref.key])  # and two say they hold it
        child = await swarm.client(PeerConfig(wait_s=0.3))  # its budget: 0.3 + 1 s
        begun = time.perf_counter()
        assert await child.get("/p/liars") == data
        elapsed = time.perf_counter() - begun
    # Before: each source cost its wait (1.3 s, or a hang deadline), one after the other: 8 of
    # them took 7.8 s.  Now the chunk's budget, then the origin (generous for a loaded machine).
    assert 1.0 <= elapsed < 3.9
    stats = child.stats()["peer"]
    assert hits(child) == {"peer": 0, "l4": 1} and stats["over_budget"] == 1


async def until(done: Callable[[], bool], within: float = 15.0) -> None:
    """Wait for ``done()`` (looked at every 10 ms), at most ``within`` seconds."""
    async with asyncio.timeout(within):
        while not done():
            await asyncio.sleep(0.01)


def copies(tracker: Tracker) -> int:
    """The copies the tracker knows of (of its 20 hottest keys)."""
    hot: list[dict[str, int]] = tracker.stats()["hot"]  # type: ignore[assignment]
    return sum(entry["copies"] for entry in hot)


async def test_a_restarted_tracker_learns_again_what_the_peers_hold(cluster: Cluster) -> None:
    tracker_config = TrackerConfig(heartbeat_s=0.05)
    async with AsyncExitStack() as clients:
        before = make_app(tracker_config)
        async with running_app(before) as url:
            config = msgspec.structs.replace(cluster.config, tracker_urls=(url,), write=WRITE)
            a = await clients.enter_async_context(blobsdk.Client(config))
            data = await written(a, "/p/restart", 5)
            assert await a.get("/p/restart") == data  # a holds its 5 chunks
            await until(lambda: copies(before[TRACKER]) == 5)  # announced
        after = make_app(tracker_config)  # the tracker starts again on its port, knowing nothing
        async with listening(after, "127.0.0.1", int(url.rsplit(":", 1)[1])):
            # a's next heartbeat registers it again (at most DOWN_S later, if one hit the
            # stopped tracker): it announces what it serves.
            await until(lambda: copies(after[TRACKER]) == 5)
            b = await clients.enter_async_context(blobsdk.Client(config))
            assert await b.get("/p/restart") == data
            assert hits(b) == {"peer": 5, "l4": 0} and a.stats()["peer"]["reannounced"] == 5
            await clients.aclose()  # while the tracker still answers their goodbyes


def test_the_peer_tier_needs_a_tracker() -> None:
    with pytest.raises(ValueError, match=r"^the peer tier needs at least one tracker URL$"):
        tracker_servers(None, [])  # type: ignore[arg-type]


def test_peer_config_errors_name_the_setting() -> None:
    cases = [
        ({"port": 70000}, "peer.port must be from 0 to 65535, got 70000"),
        ({"max_uploads": 0}, "peer.max_uploads must be >= 1, got 0"),
        ({"wait_s": 0}, "peer.wait_s must be > 0, got 0"),
        ({"fetch_budget_s": -1.0}, "peer.fetch_budget_s must be > 0, got -1.0"),
        ({"fetch_budget_s": math.nan}, "peer.fetch_budget_s must be finite, got nan"),
        ({"host": "0.0.0.0"}, "[peer] host '0.0.0.0' listens everywhere: set advertise"),
        (
            {"allowed_networks": ("10.0.0.0/33",)},
            "[peer] allowed_networks: '10.0.0.0/33' does not appear to be an IPv4 or IPv6 network",
        ),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
            PeerConfig(**fields)  # type: ignore[arg-type]


async def test_a_chunk_an_l1_less_client_serves_is_never_its_readers_nor_reused(swarm: Swarm) -> None:
    """The serving cache keeps what the peer tier fetched: no reader gets that buffer as its
    result (to write to), and no read gives it to the buffer pool for the next fetch."""
    a = await swarm.client()
    b = await swarm.client(l1=L1Config(capacity_bytes=0))
    one, two = await written(a, "/p/one", 1), await written(a, "/p/two", 2)
    assert await a.get("/p/one") == one and await a.get("/p/two") == two
    await announced()
    mine = await b.get("/p/one")  # a whole chunk, from a
    assert mine == one and await b.get("/p/two") == two  # copied out of 2 chunks from a
    assert hits(b) == {"peer": 3, "l4": 0}
    mine[:] = bytes(len(mine))
    async with blobsdk.Client(swarm.cluster.config) as plain:  # no peers: /p/more is on L4 only
        more = await written(plain, "/p/more", 2)
    assert await b.get("/p/more") == more  # from L4, into whatever buffers the pool holds
    served = peer_of(b).sharing.serving
    plans = [await b._open.plans.get_plan(path) for path in ("/p/one", "/p/two")]
    assert [bytes(served[ref.key]) for plan in plans for ref in plan.chunks] == [one, two[:CHUNK], two[CHUNK:]]


async def test_a_chunk_fetched_from_a_peer_lands_in_a_mapping_of_its_own_that_the_serving_cache_keeps(swarm: Swarm) -> None:
    big = WriteConfig(chunk_size=MAPPED_FROM, block_size=4 * MAPPED_FROM)

    async def client(peer: PeerConfig | None = None) -> blobsdk.Client:
        config = msgspec.structs.replace(swarm.config(peer), write=big)
        return await swarm.stack.enter_async_context(blobsdk.Client(config))

    a, b, small = await client(), await client(), await client(PeerConfig(budget_bytes=MAPPED_FROM - 1))
    data = os.urandom(2 * MAPPED_FROM)
    await a.put("/p/big", data)
    assert await a.get("/p/big") == data
    await announced()
    assert await b.get("/p/big") == data and await small.get("/p/big") == data
    assert hits(b) == {"peer": 2, "l4": 0} and hits(small) == {"peer": 2, "l4": 0}
    served = list(peer_of(b).sharing.serving.values())
    assert len(served) == 2 and all(isinstance(raw.obj, mmap.mmap) for raw in served)
    assert len(peer_of(small).sharing.serving) == 0  # too big for its budget: a transient buffer, not a mapping
