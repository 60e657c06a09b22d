"""Partitions during reads and writes, on a cluster on hosts (servers/clusterhosts.py): each
server in a testbed host of its own, one of them cut off at its link (silent drops, so
connections time out, never refused) while a client puts and reads without pause.

Every test shows four things:
- no wrong byte: every read is checked against what was written;
- no acked write lost: every put that returned reads back byte-exact from a fresh client after;
- a bounded stall: the longest operation in flight while the link was down stays under a
  bound derived from the client's timeouts, set small here (each test's docstring says which
  and why; the factor ``SLACK`` covers a loaded 2-core machine: never a speed assertion);
- recovery: after the heal the partitioned server serves again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

import msgspec
import pytest

import blobsdk
from blobsdk.config import (
    ClientConfig,
    HedgeConfig,
    L1Config,
    L3Config,
    PeerConfig,
    ReadConfig,
    RepairConfig,
    Timeouts,
    WriteConfig,
)
from blobsdk.errors import BlobNotFound, TimedOut, Unreachable
from blobsdk.sources import ReplicatedBlockStore
from blobsdk.tiers import L4Tier
from servers._common import netns
from servers.cluster import Cluster, start_cluster
from servers.clusterplan import KINDS, ClusterOptions, Launch, with_service_token
from servers.redisd import redis_server_path
from servers.testbed import Link
from tests.helpers import ROOT
from tests.servers.test_testbed import connects

CHUNK = 64 << 10
BLOB = 2 * CHUNK + 1000  # three chunks, the last one short
TIMEOUT_S = 1.0  # [timeouts] connect, sock_read and stall: the longest wait on one silent server
HANG_S = 0.5  # [hedge] hang_max_ms: a target in service this long is hung, and failed over
SLACK = 3.0  # a loaded 2-core machine: every bound is its timeouts' sum times this
OPS_DURING = 6  # operations that must end while the link is down (so the timeouts are met)
SETTLE_S = 30.0  # the longest any recovery (or a cut) may take before the test fails (never reached when it works)

HEDGE = HedgeConfig(max_delay_ms=200.0, hang_min_ms=200.0, hang_max_ms=HANG_S * 1000, probe_after_s=0.2, probe_max_s=0.5)
WRITE = WriteConfig(chunk_size=CHUNK, block_size=4 * CHUNK)
NO_L1 = L1Config(capacity_bytes=0)  # every read goes past the client's memory, to the servers under test
TIMEOUTS = Timeouts(connect=TIMEOUT_S, sock_read=TIMEOUT_S, stall=TIMEOUT_S, total=30.0)


def small_timeouts(config: ClientConfig, **changes: Any) -> ClientConfig:
    """``config`` with the small timeouts every bound here is derived from."""
    return msgspec.structs.replace(config, **{"l1": NO_L1, "write": WRITE, "hedge": HEDGE, "timeouts": TIMEOUTS, **changes})


@asynccontextmanager
async def hosted(tmp_path: Any, testbed_unavailable: str | None, **options: Any) -> AsyncIterator[Cluster]:
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    async with start_cluster(tmp_path / "cluster", hosts=True, **options) as running:
        yield running


@dataclass
class Op:
    kind: str
    begun: float
    ended: float
    error: BaseException | None = None

    @property
    def took(self) -> float:
        return self.ended - self.begun


@dataclass
class Workload:
    """Puts and reads back-to-back on one client: each put's blob is recorded once it
    returned (acked), each read checked against the acked bytes of its path."""

    client: blobsdk.Client
    prefix: str
    puts: bool = True
    acked: dict[str, bytes] = field(default_factory=dict)
    unknown: dict[str, bytes] = field(default_factory=dict)  # puts that failed: committed or not
    ops: list[Op] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    async def seed(self, n: int) -> None:
        for i in range(n):
            path, data = f"{self.prefix}/seed-{i}", os.urandom(BLOB)
            await self.client.put(path, data)
            self.acked[path] = data

    async def run(self, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            if self.puts:
                path, data = f"{self.prefix}/{i}", os.urandom(BLOB)
                await self._timed("put", self._put(path, data))
            read = list(self.acked)[i % len(self.acked)]
            await self._timed("get", self._get(read))
            i += 1

    async def _put(self, path: str, data: bytes) -> None:
        try:
            await self.client.put(path, data)
        except blobsdk.BlobError:
            self.unknown[path] = data
            raise
        self.acked[path] = data

    async def _get(self, path: str) -> None:
        if bytes(await self.client.get(path)) != self.acked[path]:
            self.wrong.append(path)

    async def _timed(self, kind: str, op: Awaitable[None]) -> None:
        begun, error = time.monotonic(), None
        try:
            await op
        except blobsdk.BlobError as exc:
            error = exc
        self.ops.append(Op(kind, begun, time.monotonic(), error))
        self._progress.set()

    async def ended_since(self, t: float, n: int) -> None:
        """Return once ``n`` operations begun after ``t`` have ended."""
        while sum(op.begun >= t for op in self.ops) < n:
            self._progress.clear()
            await self._progress.wait()

    def in_flight(self, begun: float, ended: float) -> list[Op]:
        """The operations that overlapped [begun, ended]."""
        return [op for op in self.ops if op.ended >= begun and op.begun <= ended]


@asynccontextmanager
async def running(work: Workload) -> AsyncIterator[Workload]:
    stop = asyncio.Event()
    task = asyncio.create_task(work.run(stop))
    try:
        yield work
    finally:
        stop.set()
        await task


async def partitioned(
    cluster: Cluster,
    host: str,
    work: Workload,
    direction: str = "both",
    *,
    until_also: Callable[[], bool] = lambda: True,
    ops: int = OPS_DURING,
) -> tuple[float, float]:
    """Cut ``host`` off while ``work`` runs until ``ops`` operations begun after the cut have
    ended and ``until_also()`` holds; heal it.  The cut's (begun, ended) times."""
    bed = cluster.placement.testbed
    try:
        async with asyncio.timeout(SETTLE_S):
            await work.ended_since(time.monotonic(), 2)  # it runs before the cut
            await asyncio.to_thread(bed.partition, host, direction)
            begun = time.monotonic()  # the operations in flight now are in flight during the cut
            await work.ended_since(begun, ops)
            while not until_also():
                await work.ended_since(time.monotonic(), 1)
    except TimeoutError:
        pytest.fail(f"the workload did not go on through {host}'s cut (or the cut did what it should not) within {SETTLE_S:g} s")
    finally:
        await asyncio.to_thread(bed.heal, host)
    return begun, time.monotonic()


def stall(work: Workload, begun: float, ended: float, bound: float) -> float:
    """The longest operation in flight while the link was down (printed: ``pytest -s``
    shows each test's figure), asserted under ``bound``."""
    during = work.in_flight(begun, ended)
    longest = max(op.took for op in during)
    print(f"\nstall {longest:.2f} s (bound {bound:.2f} s): {len(during)} operations in the {ended - begun:.2f} s cut")
    assert longest < bound
    return longest


async def all_acked_read_back(config: ClientConfig, acked: dict[str, bytes]) -> None:
    """Every acked write, byte-exact, from a fresh client (no cache of the one that wrote)."""
    async with blobsdk.Client(config) as fresh:
        for path, data in acked.items():
            assert bytes(await fresh.get(path)) == data, path


async def until(done: Callable[[], Awaitable[bool]], what: str, within: float = SETTLE_S) -> None:
    """Return once ``done()`` holds (asked every 50 ms); fail saying ``what`` after ``within`` s."""
    try:
        async with asyncio.timeout(within):
            while not await done():
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not within {within:g} s: {what}")


def server_json(url: str, route: str) -> Any:
    with urllib.request.urlopen(url + route, timeout=10) as reply:
        return json.loads(reply.read())


def avoided(c: blobsdk.Client, tier: str = "l3") -> int:
    """Reads that left a server of ``tier`` for another: hedges won, hung ones failed over."""
    stats = c.stats()[tier]
    return int(stats["hedge_hedges_won"] + stats["hedge_hung_failovers"] + stats["hedge_failovers"])


# --- one block server ----------------------------------------------------------------------


BLOCK_BOUND_S = SLACK * (TIMEOUT_S + HANG_S)


def block_parts(c: blobsdk.Client) -> tuple[ReplicatedBlockStore, L4Tier]:
    store, l4 = c._open.blocks, c._open.readpath.tiers[-1]
    assert isinstance(store, ReplicatedBlockStore) and isinstance(l4, L4Tier)
    return store, l4


async def test_a_partitioned_block_server_stalls_no_read_or_write_past_its_timeouts_and_catches_up(testbed_unavailable, tmp_path):
    """One of three block servers cut off (both ways) while a client puts and reads.

    Bound: ``SLACK x (TIMEOUT_S + HANG_S)`` = 4.5 s.  A put needs 2 of 3 replicas, so it never
    waits on the silent one (its write lags and fails at its connect or sock_read timeout,
    TIMEOUT_S, recorded for repair); a read already sent to it is hung after ``hang_max_ms``
    (HANG_S) and sent to another replica, and a new connection to it is given up at ``connect``
    (TIMEOUT_S) while a hedge goes elsewhere: at most one of each per operation.
    Recovery: after the heal the repairer copies every block it missed
    to it, and a new write reaches all three replicas."""
    repair = RepairConfig(retry_seconds=0.2, retry_max_seconds=0.5)
    async with hosted(tmp_path, testbed_unavailable, block_servers=3, l3_nodes=0, trackers=0) as cluster:
        config = small_timeouts(cluster.config, repair=repair)
        async with blobsdk.Client(config) as c:
            store, _ = block_parts(c)
            work = Workload(c, "/part/block")
            await work.seed(3)
            async with running(work):
                before = avoided(c, "l4")

                def met() -> bool:  # a lagging write to block-1 timed out, and a read left it for another
                    return len(store.under_replicated) > 0 and avoided(c, "l4") > before

                begun, ended = await partitioned(cluster, "block-1", work, until_also=met)
            assert work.wrong == [] and [op.error for op in work.ops if op.error] == []
            stall(work, begun, ended, BLOCK_BOUND_S)
            blocks = {b for p in work.acked for b in (await c._open.plans.get_plan(p)).block_ids()}

            async def caught_up() -> bool:
                held = {info.block_id async for info in store.replicas[1].list_blocks()}
                return len(store.under_replicated) == 0 and blocks <= held

            await until(caught_up, "the repairer copies what block-1 missed")  # ...and has them all now
            await c.put("/part/block/after", os.urandom(BLOB))
            await store.settle()
            assert len(store.under_replicated) == 0  # a new write reached all three
        await all_acked_read_back(config, work.acked)


# --- one L3 node ---------------------------------------------------------------------------


L3_BOUND_S = SLACK * (TIMEOUT_S + HANG_S)


def url_of(cluster: Cluster, name: str) -> str:
    return next(p.url for p in cluster.processes if p.name == name)


def served(url: str) -> int:
    """The chunk GETs an L3 node answered (from flash or read through)."""
    requests = server_json(url, "/stats")["requests"]
    return int(requests["hits"] + requests["misses"])


async def test_a_partitioned_l3_node_costs_a_read_its_hang_deadline_then_the_other_node_serves(testbed_unavailable, tmp_path):
    """One of two L3 nodes cut off (both ways) while a client puts and reads.

    Bound: ``SLACK x (TIMEOUT_S + HANG_S)`` = 4.5 s.  Puts do not touch L3.  A read sent to
    the silent node is hedged to the other after ``max_delay_ms`` (0.2 s), or at worst hung
    after ``hang_max_ms`` (HANG_S) or its connect given up at TIMEOUT_S, and goes to the other
    node (each chunk has 2 of 2 nodes) or to L4; the node is then skipped for ``[l3]
    down_seconds``.  Recovery: after the heal, reads reach the node
    again (its own count of chunks served grows)."""
    async with hosted(tmp_path, testbed_unavailable, block_servers=1, l3_nodes=2, trackers=0) as cluster:
        config = small_timeouts(cluster.config, l3=L3Config(down_seconds=0.5))
        node = url_of(cluster, "l3-0")
        async with blobsdk.Client(config) as c:
            work = Workload(c, "/part/l3")
            await work.seed(3)
            async with running(work):
                begun, ended = await partitioned(cluster, "l3-0", work, until_also=lambda: avoided(c) >= 3)
            assert work.wrong == [] and [op.error for op in work.ops if op.error] == []
            stall(work, begun, ended, L3_BOUND_S)
            before = await asyncio.to_thread(served, node)
            fresh = 0

            async def serves_again() -> bool:
                nonlocal fresh
                fresh += 1
                path, data = f"/part/l3/after-{fresh}", os.urandom(BLOB)
                await c.put(path, data)
                work.acked[path] = data
                assert bytes(await c.get(path)) == data
                return await asyncio.to_thread(served, node) > before

            await until(serves_again, "l3-0 serves reads again")
        await all_acked_read_back(config, work.acked)


# --- the tracker ---------------------------------------------------------------------------


TRACKER_S = 0.5  # [peer] tracker_timeout_s
TRACKER_BOUND_S = SLACK * (TRACKER_S + TIMEOUT_S)


def peer_hits(c: blobsdk.Client) -> int:
    return int(c.stats()["peer"]["hits"])


async def test_a_partitioned_tracker_costs_a_read_its_tracker_timeout_then_l4_and_peers_share_after_the_heal(
    testbed_unavailable, tmp_path
):
    """The peer tier's one tracker cut off (both ways) while a client puts and reads.

    Bound: ``SLACK x (tracker_timeout_s + TIMEOUT_S)`` = 4.5 s.  A read asks the tracker for
    its chunks' sources; a call silent past ``tracker_timeout_s`` (TRACKER_S) is given up
    and the read goes on to L4 (TIMEOUT_S covers that read's own wait, though L4 is fine);
    after 3 such calls the tracker is skipped outright for 5 s.  Puts never wait on it (what
    they announce is sent in the background and dropped).  Recovery: after the heal, a
    second client reads the first one's chunks from it through the tracker again."""
    peer = PeerConfig(tracker_timeout_s=TRACKER_S, timeout_s=TIMEOUT_S, wait_s=TIMEOUT_S)
    async with hosted(tmp_path, testbed_unavailable, block_servers=1, l3_nodes=0, trackers=1) as cluster:
        config = small_timeouts(cluster.config, peer=msgspec.structs.replace(cluster.config.peer, **msgspec.structs.asdict(peer)))
        async with blobsdk.Client(config) as a, blobsdk.Client(config) as b:
            work = Workload(a, "/part/tracker")
            await work.seed(3)
            timeouts = lambda: a.stats()["peer"]["tracker_timeouts"] >= 1  # noqa: E731
            async with running(work):
                begun, ended = await partitioned(cluster, "tracker", work, until_also=timeouts)
            assert work.wrong == [] and [op.error for op in work.ops if op.error] == []
            stall(work, begun, ended, TRACKER_BOUND_S)
            fresh = 0

            async def shared_again() -> bool:
                nonlocal fresh
                fresh += 1
                path, data = f"/part/tracker/after-{fresh}", os.urandom(BLOB)
                await a.put(path, data)
                work.acked[path] = data
                assert bytes(await a.get(path)) == data
                await asyncio.sleep(0.2)  # a's announcement is batched (0.05 s); if it missed, the next blob
                assert bytes(await b.get(path)) == data
                return peer_hits(b) > 0

            await until(shared_again, "b reads a's chunks through the tracker again")
        await all_acked_read_back(config, work.acked)


# --- a peer in the middle of serving a chunk -----------------------------------------------


BIG_CHUNK = 1 << 20
SERVING_MBIT = 4.0  # the serving peer's uplink: a 1 MiB chunk takes about 2 s to send
CUT_AFTER = 128 << 10  # bytes the serving peer has sent of the chunk when it is cut off (the cut has 1.9 s to land)
FETCH_BUDGET_S = 5.0  # [peer] fetch_budget_s: above the chunk's time on the link
PEER_TIMEOUT_S = 3.0  # [peer] timeout_s, which also bounds each upload: above the chunk's time on the link
# A peer sending a chunk for 2 s is not hung on this link: the hang deadline is above it, so the
# cut, not the deadline, is what ends the transfer.
BIG_WRITE = WriteConfig(chunk_size=BIG_CHUNK, block_size=4 * BIG_CHUNK)
PEER_HEDGE = msgspec.structs.replace(HEDGE, hang_min_ms=4000.0, hang_max_ms=4000.0)
PEER_BOUND_S = SLACK * (FETCH_BUDGET_S + TIMEOUT_S)


class PeerProcess:
    """tests/servers/peer_process.py in a client host: ``get`` asks it to read a blob."""

    def __init__(self, cluster: Cluster, name: str, link: Link) -> None:
        host = cluster.add_client_host(name, link)
        peer = msgspec.structs.replace(
            host.config.peer,
            timeout_s=PEER_TIMEOUT_S,
            wait_s=TIMEOUT_S,
            fetch_budget_s=FETCH_BUDGET_S,
            tracker_timeout_s=TRACKER_S,
        )
        config = small_timeouts(host.config, peer=peer, hedge=PEER_HEDGE, write=BIG_WRITE)
        path = host.dir / "partition.toml"
        path.write_text(config.to_toml())
        self.host = host
        argv = [sys.executable, "-m", "tests.servers.peer_process", str(path)]
        self.proc = host.popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    async def answer(self) -> dict[str, Any]:
        async with asyncio.timeout(SETTLE_S):
            line = await asyncio.to_thread(self.proc.stdout.readline)
        assert line, f"{self.host.host.name}'s client ended"
        return json.loads(line)  # type: ignore[no-any-return]

    def ask(self, path: str) -> None:
        self.proc.stdin.write(f"get {path}\n")
        self.proc.stdin.flush()

    async def get(self, path: str) -> dict[str, Any]:
        self.ask(path)
        return await self.answer()

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=SETTLE_S)
        finally:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdout.close()


def sent(cluster: Cluster, host: str) -> int:
    """Bytes ``host`` has sent on its link (its uplink's qdisc counter)."""
    h = cluster.placement.testbed.host(host)
    shown = netns.run([netns.TC, "-n", h.namespace, "-s", "qdisc", "show", "dev", h.inner])
    return int(re.search(r"Sent (\d+) bytes", shown)[1])  # type: ignore[index]


async def tracker_knows(cluster: Cluster, key: str) -> None:
    url = url_of(cluster, "tracker")

    async def held() -> bool:
        hot = (await asyncio.to_thread(server_json, url, "/stats"))["hot"]
        return any(entry["key"] == key and entry["copies"] >= 1 for entry in hot)

    await until(held, f"the tracker knows a peer holds {key}")


async def test_a_peer_cut_off_mid_chunk_costs_its_child_at_most_the_fetch_budget_then_l4(testbed_unavailable, tmp_path):
    """Two client hosts with the peer tier: ``peer-0`` holds a 1 MiB chunk and serves it to
    ``peer-1`` over a 4 Mbit/s uplink; once it has sent 128 KiB of it, it is cut off (both
    ways).

    Bound: ``SLACK x (fetch_budget_s + TIMEOUT_S)`` = 18 s from the cut to the read's end.  The
    child leaves the peer at the first of: ``[peer] timeout_s`` (PEER_TIMEOUT_S) without its
    next bytes, the hang deadline (``hang_max_ms``, 4 s from the request), or one chunk's
    ``fetch_budget_s`` (FETCH_BUDGET_S) on peers in all; then it reads the chunk from L4
    (TIMEOUT_S covers that read's own waits).  The peer's timeouts are above the chunk's 2 s
    on the link (``timeout_s`` also bounds each upload), or no transfer could end whole.  Recovery: after the heal the
    peer serves again: ``peer-1`` reads another blob ``peer-0`` holds from it."""
    async with hosted(tmp_path, testbed_unavailable, block_servers=1, l3_nodes=0, trackers=1) as cluster:
        writer = small_timeouts(cluster.config, write=BIG_WRITE)
        serving = PeerProcess(cluster, "peer-0", Link(up=SERVING_MBIT))
        child = PeerProcess(cluster, "peer-1", Link())
        try:
            assert (await serving.answer(), await child.answer()) == ({"ready": True}, {"ready": True})
            async with blobsdk.Client(writer) as a:
                acked = {"/part/peer/cut": os.urandom(BIG_CHUNK)}
                for path, data in acked.items():
                    await a.put(path, data)
                key = (await a.plan("/part/peer/cut")).chunks[0].key
            first = next(iter(acked))
            assert (await serving.get(first))["sha256"] == sha256(acked[first]).hexdigest()
            await tracker_knows(cluster, key)
            before = await asyncio.to_thread(sent, cluster, "peer-0")
            child.ask(first)
            async with asyncio.timeout(SETTLE_S):
                while await asyncio.to_thread(sent, cluster, "peer-0") < before + CUT_AFTER:
                    await asyncio.sleep(0.01)
            cut = time.monotonic()
            await asyncio.to_thread(cluster.placement.testbed.partition, "peer-0")
            read = await child.answer()
            print(f"\nstall {read['ended'] - cut:.2f} s (bound {PEER_BOUND_S:.2f} s) from the cut to the read's end")
            assert (read["sha256"], read["error"]) == (sha256(acked[first]).hexdigest(), None)
            assert read["hits"] == {"peer": 0, "l4": 1} and read["ended"] - cut < PEER_BOUND_S
            gave_up = sum(read["peer"].get(name, 0) for name in ("errors", "over_budget", "hedge_hung_failovers"))
            assert read["peer"]["misses"] == 1 and gave_up >= 1  # it was at peer-0, and left it
            await asyncio.to_thread(cluster.placement.testbed.heal, "peer-0")
            healed, fresh = time.monotonic(), 0

            async def serves_again() -> bool:
                nonlocal fresh
                fresh += 1
                path, data = f"/part/peer/after-{fresh}", os.urandom(BIG_CHUNK)
                async with blobsdk.Client(writer) as a:
                    await a.put(path, data)
                    key = (await a.plan(path)).chunks[0].key
                acked[path] = data
                assert (await serving.get(path))["sha256"] == sha256(data).hexdigest()
                await tracker_knows(cluster, key)
                again = await child.get(path)
                assert again["sha256"] == sha256(data).hexdigest()
                return bool(again["hits"]["peer"] > read["hits"]["peer"])

            await until(serves_again, "peer-1 reads from peer-0 again")
            print(f"served again {time.monotonic() - healed:.2f} s after the heal")
        finally:
            serving.close()
            child.close()
        await all_acked_read_back(writer, acked)


# --- the API server ------------------------------------------------------------------------


API_BOUND_S = SLACK * 2 * TIMEOUT_S


def timed_out(api: str) -> str:
    """The message of a call to the API server at ``api`` that timed out: connecting (no answer
    to the SYN: Unreachable, naming the server), or waiting for its answer (TimedOut)."""
    route = r"/v1/(commit|plans)"
    address = re.escape(api.removeprefix("http://"))
    connect = rf"cannot reach the API server at {address} \(POST {route}\): no answer to connect \(.*\)"
    return rf"({connect}|POST {re.escape(api)}{route}: SocketTimeoutError: Timeout on reading data from socket)"


@pytest.mark.parametrize("direction", ["both", "out"])
async def test_a_partitioned_api_server_fails_operations_within_its_timeout_and_serves_again_after_the_heal(
    testbed_unavailable, tmp_path, direction
):
    """The one API server cut off while a client puts and reads (every read asks it for the
    plan: no plan cache).  With one API server the metadata has no other way (two: the last
    test).

    Bound: ``SLACK x 2 x TIMEOUT_S`` = 6 s for each operation, failed or not.  Each makes one
    call to the API server (a plan lookup, or a put's commit after its blocks are written to
    healthy block servers, well under TIMEOUT_S), and that call fails at ``connect`` or
    ``sock_read`` (TIMEOUT_S): the SDK does not retry it, so it fails with ``Unreachable`` (no
    answer to connect) or ``TimedOut`` (no answer to the request), naming the call.  "out":
    requests on connections already open still arrive, so a commit may be applied while its
    reply is lost: that put failed, its outcome unknown, and afterwards it
    is either absent or exactly what was written.  Recovery: after the heal, puts and reads
    work again, with no error."""
    async with hosted(tmp_path, testbed_unavailable, block_servers=1, l3_nodes=0, trackers=0) as cluster:
        config = small_timeouts(cluster.config, read=ReadConfig(plan_cache_ttl_seconds=0))
        async with blobsdk.Client(config) as c:
            work = Workload(c, "/part/api")
            await work.seed(3)
            async with running(work):
                begun, ended = await partitioned(cluster, "api", work, direction, ops=4)
                healed = time.monotonic()
                await work.ended_since(healed, 4)
            assert work.wrong == []
            stall(work, begun, ended, API_BOUND_S)
            api = url_of(cluster, "api")
            cut = [op for op in work.ops if begun <= op.begun and op.ended <= ended]
            assert len(cut) >= 3 and {type(op.error) for op in cut} <= {TimedOut, Unreachable}  # each one failed
            for op in cut:
                assert re.fullmatch(timed_out(api), str(op.error)), op.error
            assert [op.error for op in work.ops if op.begun >= healed and op.error is not None] == []
            applied = 0
            for path, data in work.unknown.items():  # committed or not, never another blob
                with suppress(BlobNotFound):
                    assert bytes(await c.get(path)) == data
                    applied += 1
            print(f"{applied} of {len(work.unknown)} failed puts were applied")
        await all_acked_read_back(config, work.acked)


# --- one of two API servers ----------------------------------------------------------------


FAILOVER_S = 1.0  # [timeouts] api_failover: an API server silent this long is left for the next
API_PAIR_BOUND_S = SLACK * (FAILOVER_S + TIMEOUT_S)


@asynccontextmanager
async def two_api_servers(tmp_path: Any, testbed_unavailable: str | None) -> AsyncIterator[Cluster]:
    """A cluster on hosts with two API servers (``api-0``, ``api-1``) over one Redis.  The
    Redis runs in the root namespace, listening on every address, so the hosts reach it at
    the testbed's driver address, known once the cluster has made its testbed: the API
    servers' arguments are built then."""
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    made: list[Cluster] = []
    with redis_on_every_address(tmp_path) as port:

        def api_args(launch: Launch, i: int) -> list[str]:
            assert made[0].placement is not None
            return ["--metadata", f"redis://{made[0].placement.testbed.driver_address}:{port}/0"]

        kinds = tuple(dataclasses.replace(k, args=api_args) if k.name == "api" else k for k in KINDS)
        metadata = f"redis://127.0.0.1:{port}/0"  # the API servers' own arguments name the driver's address instead
        options = ClusterOptions(hosts=True, api_servers=2, metadata=metadata, block_servers=1, l3_nodes=0, trackers=0)
        made.append(Cluster(tmp_path / "cluster", with_service_token(options), kinds=kinds))
        async with made[0] as running:
            yield running


@contextmanager
def redis_on_every_address(dir: Any) -> Iterator[int]:
    """A redis-server of this test's (no persistence) on every address of the root namespace;
    its port, once it accepts connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    argv = [redis_server_path(), "--port", str(port), "--bind", "0.0.0.0", "--protected-mode", "no"]
    redis = subprocess.Popen([*argv, "--save", "", "--appendonly", "no", "--dir", str(dir)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SETTLE_S
        while not connects("127.0.0.1", port, 1.0):
            assert redis.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield port
    finally:
        redis.kill()
        redis.wait()


async def test_with_one_of_two_api_servers_partitioned_puts_and_reads_go_on_through_the_other(testbed_unavailable, tmp_path):
    """``api-0`` of two API servers over one Redis cut off (both ways) while a client of both
    (``api_urls``) puts and reads (every read asks for the plan: no plan cache).

    Bound: ``SLACK x (api_failover + TIMEOUT_S)`` = 6 s.  A call to the silent server is left
    for the other once it has been silent ``[timeouts] api_failover`` (FAILOVER_S), and the
    other answers it well within TIMEOUT_S; a connect to it fails at TIMEOUT_S.  No operation
    fails.  Recovery: after the heal, a client given only ``api-0`` puts through it."""
    async with two_api_servers(tmp_path, testbed_unavailable) as cluster:
        config = cluster.config
        assert config is not None and len(config.api_urls) == 2
        timeouts = msgspec.structs.replace(TIMEOUTS, api_failover=FAILOVER_S)
        config = small_timeouts(config, timeouts=timeouts, read=ReadConfig(plan_cache_ttl_seconds=0))
        async with blobsdk.Client(config) as c:
            work = Workload(c, "/part/apis")
            await work.seed(3)
            async with running(work):
                begun, ended = await partitioned(cluster, "api-0", work)
            assert work.wrong == [] and [op.error for op in work.ops if op.error] == []
            stall(work, begun, ended, API_PAIR_BOUND_S)
        alone = msgspec.structs.replace(config, api_urls=(), api_url=url_of(cluster, "api-0"))
        async with blobsdk.Client(alone) as c:
            data = os.urandom(BLOB)
            await c.put("/part/apis/after", data)
            work.acked["/part/apis/after"] = data
        await all_acked_read_back(config, work.acked)
