"""servers/tracker.py: the peer tier's control plane.  Its rules on a fake clock, then over
HTTP (in-loop, with signed tenant tokens) and as a real process."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from blobsdk.auth import ServeKey
from blobsdk.errors import BadRequest, Forbidden, Overloaded, PeerNotFound
from blobsdk.wire import (
    AnnounceRequest,
    AnnounceResponse,
    ChunkRef,
    ErrorBody,
    LocateRequest,
    LocateResponse,
    PeerHello,
    ReportRequest,
    ReportResponse,
)
from servers._common.metrics import sample_sum, sample_values
from servers.tracker import make_app
from servers.tracker_rules import Tracker, TrackerConfig
from tests.helpers import ROOT, Tenancy, auth_headers, running_app, server_process

KEY = "c" * 40
SERVE_KEY = ServeKey.generate()
REF = ChunkRef(block_id="ab" * 16, offset=0, length=10, raw_length=10, checksum=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pid(n: int) -> str:
    return f"{n:032x}"


def tracker(**config: object) -> tuple[Tracker, Clock]:
    clock = Clock()
    t = Tracker(TrackerConfig(**{"stripes": 1, **config}), clock)  # ranking without stripes: see test_stripes_*  # type: ignore[arg-type]
    for n in range(1, 9):
        t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(n), address=f"http://10.0.0.{n}:7400"))
    return t, clock


def sources(t: Tracker, asker: int, key: str = KEY) -> list[tuple[str, bool]]:
    """Whom ``asker`` is sent to for ``key``: (peer id, complete) best first."""
    (located,) = t.locate("t", pid(asker), [key]).located
    return [(s.peer_id, s.complete) for s in located.sources]


def demand(t: Tracker, asks: int, key: str = KEY) -> None:
    """``asks`` more asks for ``key`` (by peer 8), so that more copies are kept."""
    for _ in range(asks):
        sources(t, 8, key)


def fill(t: Tracker, peer: int, key: str = KEY) -> AnnounceResponse:
    return t.announce("t", AnnounceRequest(peer_id=pid(peer), filled=[key]))


# --- locate: origin, then a tree --------------------------------------------------------------


def test_the_first_asker_goes_to_the_origin_and_later_ones_to_it() -> None:
    t, _ = tracker()
    assert sources(t, 1) == []  # nobody has it: the origin
    assert sources(t, 2) == [(pid(1), False)]  # 1 is fetching it: it streams what it has
    assert fill(t, 1).keep == [KEY]
    assert sources(t, 3) == [(pid(1), True), (pid(2), False)]  # holders first, then fetchers
    assert sources(t, 1) == []  # a holder asking again is sent nowhere
    assert t.counts["located_origin"] == 1 and t.counts["located_peer"] == 2


def test_a_source_gets_at_most_fanout_children_of_a_key() -> None:
    t, clock = tracker(fanout=2, peer_ttl_s=1000)
    sources(t, 1)
    fill(t, 1)
    assert sources(t, 2)[0] == (pid(1), True)
    assert sources(t, 3)[0] == (pid(1), True)
    assert pid(1) not in [p for p, _ in sources(t, 4)]  # 1 has its two children: 4 goes to them
    assert sources(t, 5)[0] == (pid(2), False)  # fetchers, earliest first; 2 now has a child too
    fill(t, 2)  # a child that filled frees its source's slot
    assert sources(t, 6)[0][0] == pid(1)
    clock.now += 31  # hand-outs older than child_ttl_s no longer count
    assert sources(t, 7)[0] == (pid(1), True)


def test_holders_are_ranked_least_loaded_first() -> None:
    t, _ = tracker()
    for n in (1, 2, 3):
        sources(t, n)
    demand(t, 9)  # 12 asks / fanout 4: three copies kept
    assert [fill(t, n).keep for n in (1, 2, 3)] == [[KEY]] * 3
    t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://10.0.0.1:7400", uploads=5))
    t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(2), address="http://10.0.0.2:7400", uploads=1))
    assert sources(t, 4) == [(pid(3), True), (pid(2), True), (pid(1), True), (pid(8), False)]


# --- caching and eviction -----------------------------------------------------------------------


def test_copies_are_kept_as_the_demand_needs() -> None:
    t, clock = tracker(fanout=2, peer_ttl_s=1000)
    for n in range(1, 6):
        sources(t, n)  # 5 askers in the window: 5 / fanout 2 -> 3 copies needed
    assert [fill(t, n).keep for n in range(1, 6)] == [[KEY]] * 3 + [[]] * 2
    assert t.stats()["hot"] == [{"key": KEY, "demand": 5, "copies": 3, "fetchers": 0}]
    clock.now += 61  # demand forgotten: one copy is enough
    sources(t, 6)
    assert fill(t, 6).keep == []


def test_the_last_copy_in_demand_is_held_and_others_let_go() -> None:
    t, clock = tracker(fanout=1, demand_window_s=10)
    sources(t, 1)
    sources(t, 2)
    fill(t, 1)
    fill(t, 2)  # two copies (demand 2, fanout 1)
    evicting = t.announce("t", AnnounceRequest(peer_id=pid(1), evicting=[KEY]))
    assert evicting.hold == []  # not the last copy: let go
    last = t.announce("t", AnnounceRequest(peer_id=pid(2), evicting=[KEY]))
    assert last.hold == [KEY] and last.hold_s == 30.0  # the last one, asked for: hold it
    clock.now += 11
    assert t.announce("t", AnnounceRequest(peer_id=pid(2), evicting=[KEY])).hold == []  # demand gone
    assert sources(t, 3) == []  # nobody holds it now: the origin


def test_failed_and_evicted_keys_forget_the_peer() -> None:
    t, _ = tracker()
    sources(t, 1)
    t.announce("t", AnnounceRequest(peer_id=pid(1), failed=[KEY]))
    assert sources(t, 2) == []  # 1 gave up: not a source
    fill(t, 2)
    t.announce("t", AnnounceRequest(peer_id=pid(2), evicted=[KEY]))
    assert sources(t, 3) == []


# --- reports -------------------------------------------------------------------------------------


def two_holders(t: Tracker) -> None:
    for n in (1, 2):
        sources(t, n)
    demand(t, 4)  # 6 asks / fanout 4: two copies kept
    assert [fill(t, 1).keep, fill(t, 2).keep] == [[KEY], [KEY]]


def report(t: Tracker, source: int, problem: str, reporter: int = 5) -> ReportResponse:
    return t.report("t", ReportRequest(peer_id=pid(reporter), source=pid(source), key=KEY, problem=problem))  # type: ignore[arg-type]


def test_a_busy_source_is_ranked_last_for_a_moment() -> None:
    t, clock = tracker()
    two_holders(t)
    assert [p for p, _ in sources(t, 3)][:2] == [pid(2), pid(1)]  # 1 has a child already (8)
    assert report(t, 2, "refused").banned is False
    assert [p for p, _ in sources(t, 4)][:2] == [pid(1), pid(2)]  # 2 refused: ranked last
    clock.now += 1.1
    t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://10.0.0.1:7400", uploads=3))
    assert [p for p, _ in sources(t, 6)][:2] == [pid(2), pid(1)]  # 2 is back, 1 is busier
    assert t._peers[pid(2)].failures == 0  # busy is no failure


def test_bad_bytes_drop_the_copy_and_repeated_failures_ban_the_peer() -> None:
    t, _ = tracker(ban_after=3)
    two_holders(t)
    assert report(t, 1, "bad_bytes").banned is False
    assert pid(1) not in [p for p, _ in sources(t, 3)]  # its copy of this key is gone
    report(t, 2, "failed")
    assert sources(t, 4)[0] == (pid(2), True)  # demoted, but the only holder
    report(t, 2, "failed")
    assert report(t, 2, "bad_bytes").banned is True
    assert pid(2) not in [p for p, _ in sources(t, 6)]
    assert t.stats()["banned"] == 1 and t.counts["peers_banned"] == 1


def test_a_missing_copy_is_dropped_without_a_penalty() -> None:
    t, _ = tracker(ban_after=1)
    two_holders(t)
    assert report(t, 1, "missing").banned is False  # a stale entry: 404
    assert pid(1) not in [p for p, _ in sources(t, 3)]
    assert t._peers[pid(1)].failures == 0 and t._peers[pid(1)].ranked_last_until == 0.0


# --- peers' lives and tenants ------------------------------------------------------------------


def test_a_peer_unheard_for_its_ttl_is_forgotten_with_its_copies() -> None:
    t, clock = tracker(peer_ttl_s=15)
    sources(t, 1)
    fill(t, 1)
    clock.now += 10
    for n in range(2, 9):
        t.hello(
            "t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(n), address=f"http://10.0.0.{n}:7400")
        )  # heartbeats; 1 is silent
    clock.now += 6
    assert sources(t, 2) == []  # 1 aged out, and its copy with it
    with pytest.raises(PeerNotFound, match="say hello first"):
        fill(t, 1)
    assert t.counts["peers_expired"] == 1


def test_a_hello_says_whether_it_registered_the_peer() -> None:
    t, clock = tracker(peer_ttl_s=15)
    hello = PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(9), address="http://10.0.0.9:7400")
    assert t.hello("t", hello).registered is True  # new: it must announce what it serves
    assert t.hello("t", hello).registered is False  # a heartbeat
    clock.now += 16
    assert t.hello("t", hello).registered is True  # aged out and forgotten: new again


def test_a_peer_id_belongs_to_its_tenant_and_tenants_never_share_sources() -> None:
    t, _ = tracker()
    sources(t, 1)
    fill(t, 1)
    other = pid(99)
    t.hello("u", PeerHello(serve_key=SERVE_KEY.hex, peer_id=other, address="http://10.0.1.1:7400"))
    with pytest.raises(Forbidden, match="belongs to another tenant"):
        t.hello("u", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://10.0.1.2:7400"))
    with pytest.raises(Forbidden, match="belongs to another tenant"):
        t.locate("u", pid(1), [KEY])
    (located,) = t.locate("u", other, [KEY]).located
    assert located.sources == []  # tenant t's copy is not handed to tenant u


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda t: t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id="nope", address="http://h:1")),
            BadRequest,
            "invalid peer id 'nope'",
        ),
        (
            lambda t: t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="ftp://h:1")),
            BadRequest,
            "expected http://HOST:PORT",
        ),
        (
            lambda t: t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://h")),
            BadRequest,
            "expected http://HOST:PORT",
        ),
        (
            lambda t: t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://h:1/x")),
            BadRequest,
            "expected http://HOST:PORT",
        ),
        *(
            (
                lambda t, address=address: t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address=address)),
                BadRequest,
                re.escape(f"invalid peer address {address!r}: expected http://HOST:PORT"),
            )
            for address in ("http://h:0", "http://u:p@h:1", "http://h:1#x", "http://h:1?x", "http://h\n:1")
        ),
        (
            lambda t: t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://h:99999")),
            BadRequest,
            "invalid peer address",
        ),
        (
            lambda t: t.hello("t", PeerHello(serve_key="ab" * 8, peer_id=pid(1), address="http://h:1")),
            BadRequest,
            "a serve key is 8 bytes; at least 32",
        ),
        (
            lambda t: t.hello("t", PeerHello(serve_key="zz", peer_id=pid(1), address="http://h:1")),
            BadRequest,
            "invalid serve key: non-hexadecimal",
        ),
        (lambda t: t.locate("t", pid(50), [KEY]), PeerNotFound, "unknown peer"),
        (lambda t: t.locate("t", pid(1), [""]), BadRequest, "keys: invalid chunk key ''"),
        (lambda t: t.locate("t", pid(1), ["k"] * 4097), BadRequest, "at most 4096 keys"),
        (lambda t: report(t, 50, "failed"), PeerNotFound, "unknown peer"),
    ],
)
def test_bad_requests_are_refused_with_what_was_wrong(call: object, error: type[Exception], message: str) -> None:
    t, _ = tracker()
    with pytest.raises(error, match=message):
        call(t)  # type: ignore[operator]


def test_the_tracker_bounds_its_peers_and_each_peer_s_keys() -> None:
    t, clock = tracker(max_peers=8, max_keys_per_peer=3, peer_ttl_s=15)
    with pytest.raises(Overloaded, match="the tracker has its 8 peers"):
        t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(9), address="http://10.0.0.9:7400"))
    t.locate("t", pid(1), ["k1", "k2"])
    with pytest.raises(Overloaded, match="holds or fetches too many keys"):
        t.locate("t", pid(1), ["k3", "k4"])
    t.announce("t", AnnounceRequest(peer_id=pid(1), failed=["k1", "k2"]))
    t.locate("t", pid(1), ["k3", "k4"])  # room again
    clock.now += 16  # every peer aged out: room for new ones
    t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(9), address="http://10.0.0.9:7400"))


def test_the_config_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fanout must be positive, not 0"):
        TrackerConfig(fanout=0)


# --- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, Tenancy]]:
    tenancy = Tenancy()
    async with running_app(make_app(auth=tenancy.auth())) as url:
        yield url, tenancy


async def post(session: aiohttp.ClientSession, url: str, body: object, token: str | None, kind: type[object]) -> object:
    async with session.post(url, data=msgspec.msgpack.encode(body), headers=auth_headers(token)) as resp:
        raw = await resp.read()
        if resp.status != 200:
            return resp.status, msgspec.msgpack.decode(raw, type=ErrorBody)
        return msgspec.msgpack.decode(raw, type=kind)


async def test_peers_use_it_over_http_with_their_tenants_tokens(served: tuple[str, Tenancy]) -> None:
    url, tenancy = served
    alice, bob = tenancy.token("alice"), tenancy.token("bob")
    ref = tenancy.granted(REF, "alice")
    key = REF.key
    async with aiohttp.ClientSession() as s:
        hello_1 = PeerHello(peer_id=pid(1), address="http://127.0.0.1:7401", serve_key=SERVE_KEY.hex)
        assert await post(s, f"{url}/v1/peers", hello_1, None, object) == (
            401,
            ErrorBody(code="unauthorized", message="missing bearer token (want 'Authorization: Bearer TOKEN')"),
        )
        for n in (1, 2):
            hello = PeerHello(peer_id=pid(n), address=f"http://127.0.0.1:740{n}", serve_key=SERVE_KEY.hex)
            assert await post(s, f"{url}/v1/peers", hello, alice, dict) == {
                "heartbeat_s": 5.0,
                "ttl_s": 15.0,
                "tenant": "alice",
                "registered": True,
            }
        first = await post(s, f"{url}/v1/locate", LocateRequest(peer_id=pid(1), refs=[ref]), alice, LocateResponse)
        assert isinstance(first, LocateResponse) and first.located[0].sources == []
        kept = await post(s, f"{url}/v1/announce", AnnounceRequest(peer_id=pid(1), filled=[key]), alice, AnnounceResponse)
        assert isinstance(kept, AnnounceResponse) and kept.keep == [key]
        second = await post(s, f"{url}/v1/locate", LocateRequest(peer_id=pid(2), refs=[ref]), alice, LocateResponse)
        assert isinstance(second, LocateResponse)
        (source,) = second.located[0].sources
        assert (source.peer_id, source.address, source.complete) == (pid(1), "http://127.0.0.1:7401", True)
        SERVE_KEY.verify(source.ticket, "alice", key, time.time())  # the ticket peer 1 will want
        with pytest.raises(Forbidden, match="not this peer's for tenant 'bob'"):
            SERVE_KEY.verify(source.ticket, "bob", key, time.time())
        stolen = await post(s, f"{url}/v1/locate", LocateRequest(peer_id=pid(1), refs=[ref]), bob, LocateResponse)
        assert stolen == (
            403,
            ErrorBody(
                code="forbidden", message=f"the chunk grant is not for tenant 'bob' and bytes 0+10 of block {REF.block_id}"
            ),
        )
        ungranted = await post(s, f"{url}/v1/locate", LocateRequest(peer_id=pid(2), refs=[REF]), alice, LocateResponse)
        assert ungranted == (
            403,
            ErrorBody(code="forbidden", message=f"a chunk grant (header X-Blobsdk-Grant) is needed to read block {REF.block_id}"),
        )
        bobs = await post(s, f"{url}/v1/locate", LocateRequest(peer_id=pid(1), refs=[tenancy.granted(REF, "bob")]), bob, dict)
        assert bobs == (403, ErrorBody(code="forbidden", message=f"peer {pid(1)} belongs to another tenant"))
        missing = await post(s, f"{url}/v1/announce", AnnounceRequest(peer_id=pid(9)), alice, AnnounceResponse)
        assert isinstance(missing, tuple) and missing[0] == 404 and missing[1].code == "peer_not_found"
        bad = ReportRequest(peer_id=pid(2), source=pid(1), key=key, problem="bad_bytes")
        assert await post(s, f"{url}/v1/report", bad, alice, ReportResponse) == ReportResponse(banned=False)
        async with s.get(f"{url}/stats", headers=auth_headers(alice)) as resp:
            assert resp.status == 403  # every tenant's keys: not for a tenant
        async with s.get(f"{url}/stats", headers=auth_headers(tenancy.token("ops", admin=True))) as resp:
            stats = await resp.json()
        assert stats["peers"] == 2 and stats["counts"]["reports_bad_bytes"] == 1
        async with s.get(f"{url}/metrics") as resp:
            text = await resp.text()
        assert sample_sum(text, "blobsdk_tracker_peers") == 2
        assert sample_values(text, "blobsdk_tracker_events_total", event="reports_bad_bytes") == [
            ({"event": "reports_bad_bytes"}, 1.0)
        ]


def test_help_exits_zero_and_the_process_serves(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "servers.tracker", "--help"], cwd=ROOT, capture_output=True, check=True)
    assert b"--fanout" in out.stdout and b"--peer-ttl-seconds" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "servers.tracker", "--fanout", "0"], cwd=ROOT, capture_output=True)
    assert bad.returncode == 2 and b"invalid positive int value: '0'" in bad.stderr
    with server_process("servers.tracker", "--fanout", "2", tmp=tmp_path) as (url, _):
        import urllib.request

        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
            assert resp.status == 200
