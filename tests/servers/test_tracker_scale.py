"""servers/tracker_rules.py at swarm sizes past ``SCAN``: a locate ranks a bounded number of
sources, whatever the swarm's size (issue 27), and hand-outs still reach every source."""

from __future__ import annotations

from collections import Counter
from typing import Any

from blobsdk.auth import ServeKey
from blobsdk.wire import AnnounceRequest, PeerHello
from servers.tracker_rules import SCAN, Tracker, TrackerConfig

KEY = "c" * 40
SERVE_KEY = ServeKey.generate()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingPeers(dict[str, Any]):
    """The tracker's peer table, counting the lookups a locate makes."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def pid(n: int) -> str:
    return f"{n:032x}"


def tracker(peers: int, **config: Any) -> tuple[Tracker, Clock, CountingPeers]:
    clock = Clock()
    t = Tracker(TrackerConfig(**{"peer_ttl_s": 10_000, "stripes": 1, **config}), clock)
    for n in range(1, peers + 1):
        t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(n), address=f"http://10.0.{n // 250}.{n % 250}:7400"))
    counting = CountingPeers(t._peers)
    t._peers = counting
    return t, clock, counting


def first_source(t: Tracker, asker: int) -> str | None:
    (located,) = t.locate("t", pid(asker), [KEY]).located
    return located.sources[0].peer_id if located.sources else None


def test_a_locate_looks_at_a_bounded_number_of_sources_in_a_swarm_of_thousands() -> None:
    t, _, peers = tracker(3000)
    for n in range(1, 2001):
        first_source(t, n)  # 2,000 fetchers of one chunk
    before, tickets = peers.lookups, Counter[str]()
    sign = ServeKey.ticket

    def counted(key: ServeKey, *args: Any) -> str:
        tickets["signed"] += 1
        return sign(key, *args)

    ServeKey.ticket = counted  # type: ignore[method-assign]
    try:
        (located,) = t.locate("t", pid(2001), [KEY]).located
    finally:
        ServeKey.ticket = sign  # type: ignore[method-assign]
    assert peers.lookups - before <= 2 * SCAN  # the old locate looked up all 2,000
    assert tickets["signed"] == len(located.sources) == 4  # and signed a ticket for each


def test_fetchers_form_a_tree_earliest_first_each_with_at_most_fanout_children() -> None:
    t, _, _ = tracker(100, fanout=4)
    parents = [first_source(t, n) for n in range(1, 86)]
    assert parents[0] is None and t.counts["located_origin"] == 1  # one origin fetch, whatever the crowd
    assert Counter(parents[1:]) == {pid(n): 4 for n in range(1, 22)}  # 84 children: 21 sources, earliest first


def test_hand_outs_rotate_over_more_holders_than_a_locate_ranks() -> None:
    holders = SCAN + 8
    t, clock, _ = tracker(holders * 6, fanout=2)
    for n in range(1, holders * 3):
        first_source(t, n)  # demand for every copy
    for n in range(1, holders + 1):
        assert t.announce("t", AnnounceRequest(peer_id=pid(n), filled=[KEY])).keep == [KEY]
    clock.now += 31  # every hand-out aged out
    children = [first_source(t, holders * 3 + n) for n in range(holders)]
    assert sorted(children) == [pid(n) for n in range(1, holders + 1)]  # each holder once, not the first SCAN twice


def test_a_full_source_is_offered_again_once_its_child_fills_or_its_hand_out_ages_out() -> None:
    t, clock, _ = tracker(10, fanout=1, child_ttl_s=30)
    first_source(t, 1)
    assert first_source(t, 2) == pid(1)
    assert first_source(t, 3) == pid(2)  # 1 is full: its fetcher child is next
    t.announce("t", AnnounceRequest(peer_id=pid(2), filled=[KEY]))  # 2 filled (and holds it): 1 is free again
    assert first_source(t, 4) == pid(1)
    assert first_source(t, 5) == pid(4)  # 1 and 2 are full: the fetcher fewest hops from a copy (4: 1 holds)
    clock.now += 31  # every hand-out aged out: the holder is free again
    assert first_source(t, 6) == pid(2)


def test_peers_starting_together_share_the_uploads_across_keys() -> None:
    """64 peers ask for the same 8 keys at once (a job's start): without stripes the trees of
    the 8 keys are the same tree, whose 16 inner peers send 4 children x 8 keys each while 48
    send nothing; with them a peer is an inner node of about one key in four."""
    keys = [f"{k:040x}" for k in range(8)]
    t, _, _ = tracker(64, stripes=4)  # the default
    sent = Counter[str]()
    for n in range(1, 65):
        for located in t.locate("t", pid(n), keys).located:
            if located.sources:
                sent[located.sources[0].peer_id] += 1
    assert sum(sent.values()) == 63 * 8  # every later asker was handed a peer, for every key
    assert len(sent) >= 40  # peers sending: 16 before the stripes


def test_the_expiry_looks_at_the_expired_peers_not_at_every_peer() -> None:
    t, clock, _ = tracker(0, peer_ttl_s=10)
    examined = CountingValues(t._peers)
    t._peers = examined
    for n in range(1, 2001):
        t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(n), address="http://10.0.0.1:7400"))
    clock.now += 5
    t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://10.0.0.1:7400"))  # heard again
    before = examined.seen
    for _ in range(20):  # 20 expiry passes, a second apart: 1 is heard, the others not
        clock.now += 1.0
        t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(1), address="http://10.0.0.1:7400"))
    assert t.peer_count() == 1 and t.counts["peers_expired"] == 1999
    assert examined.seen - before <= 1999 + 20  # each expired one, and one live peer a pass; 40,000 before


class CountingValues(dict[str, Any]):
    """The tracker's peer table, counting the peers an iteration over its values yields."""

    seen = 0

    def values(self) -> Any:
        for value in super().values():
            self.seen += 1
            yield value
