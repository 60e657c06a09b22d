"""servers/tracker_rules.py when many peers ask for many chunks at once (a job's start): a
source's children counted across keys, so that the first asker, sent to the origin for every
chunk, is not every chunk's tree's inner node too; and the extra roots a tracker may allow."""

from __future__ import annotations

from collections import Counter
from typing import Any

from blobsdk.auth import ServeKey
from blobsdk.wire import AnnounceRequest, PeerHello
from servers.tracker_rules import Tracker, TrackerConfig

SERVE_KEY = ServeKey.generate()
KEYS = [f"{k:040x}" for k in range(16)]  # p2p's read-ahead: 16 chunks asked at once


def pid(n: int) -> str:
    return f"{n:032x}"


def burst(peers: int, **config: Any) -> tuple[Tracker, Counter[str], Counter[str]]:
    """``peers`` peers each ask for ``KEYS`` in one locate, one after another, at one moment:
    (the tracker, children handed to each source, origin fetches of each peer)."""
    t = Tracker(TrackerConfig(**{"peer_ttl_s": 10_000, **config}), lambda: 1000.0)
    for n in range(1, peers + 1):
        t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(n), address=f"http://10.0.0.{n}:7400"))
    children, roots = Counter[str](), Counter[str]()
    for n in range(1, peers + 1):
        for located in t.locate("t", pid(n), KEYS).located:
            if located.sources:
                children[located.sources[0].peer_id] += 1
            else:
                roots[pid(n)] += 1
    return t, children, roots


def test_a_burst_does_not_pile_every_chunk_s_children_on_the_first_asker() -> None:
    # 8 peers x 16 chunks: the first asker is sent to the origin for all 16 and, before, was
    # then handed 56 of the 112 children (64 at 16 peers): 56 x 4 MiB through one uplink.
    for peers in (8, 16):
        t, children, roots = burst(peers)
        assert roots == {pid(1): 16} and t.counts["located_origin"] == 16  # one origin fetch a chunk, as before
        assert sum(children.values()) == (peers - 1) * 16
        assert max(children.values()) <= 36, children  # the first asker's: 56 and 64 before
        assert len(children) == peers - 1  # every asker but the last serves someone


def test_extra_roots_spread_the_origin_fetches_and_stay_bounded() -> None:
    # roots=2: a chunk whose best source is a fetcher past its load is fetched from the origin
    # once more, by the asker: it becomes a root of that chunk's tree.  Never a third time.
    for peers in (8, 16):
        t, children, roots = burst(peers, source_load=4, roots=2)
        assert roots[pid(1)] == 16 and len(roots) >= 3  # the second roots: several other peers
        assert t.counts["located_origin"] == sum(roots.values()) == 2 * 16  # two a chunk, never three
        assert sum(children.values()) + sum(roots.values()) == peers * 16
        assert max(children.values()) <= 40, children


def test_a_holder_past_its_load_is_never_passed_over_for_the_origin() -> None:
    # Extra roots are for chunks nobody holds yet: a complete copy is handed out, loaded or not.
    t, _, _ = burst(8, source_load=1, roots=4)
    before = t.counts["located_origin"]
    for n in range(1, 9):
        t.announce("t", AnnounceRequest(peer_id=pid(n), filled=KEYS))
    t.hello("t", PeerHello(serve_key=SERVE_KEY.hex, peer_id=pid(9), address="http://10.0.0.9:7400"))
    located = t.locate("t", pid(9), KEYS).located
    assert all(loc.sources and loc.sources[0].complete for loc in located)
    assert t.counts["located_origin"] == before
