"""The tracker's decisions, with no I/O (DESIGN §2): who a peer fetches a chunk
from, which copies are kept, which last copies are held, which sources are demoted or banned.

servers/tracker.py serves a :class:`Tracker` over HTTP (its docstring gives the routes and
rules); benchmarks/swarm_sim.py drives the very same object on a simulated clock, thousands of
hosts at once.  Each chunk key's swarm (holders, fetchers, hand-outs, the sources with room)
is a :class:`~servers.tracker_swarm.Swarm`.  Time comes only from the injected ``clock`` (ages
and windows) and ``wall`` (ticket expiries).
"""

from __future__ import annotations

import heapq
import math
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from blobsdk.auth import TICKET_TTL_S, ServeKey
from blobsdk.chunks import validate_hex32
from blobsdk.errors import BadRequest, Forbidden, Overloaded, PeerNotFound
from blobsdk.net import check_positive_fields
from blobsdk.wire import (
    TRACKER_MAX_KEYS,
    AnnounceRequest,
    AnnounceResponse,
    HelloResponse,
    Located,
    LocateResponse,
    PeerHello,
    Problem,
    ReportRequest,
    ReportResponse,
    Source,
)

from .tracker_swarm import SCAN, Swarm

HOT_KEYS = 20  # keys /stats shows


class TrackerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tracker's rules, in seconds and counts."""

    heartbeat_s: float = 5.0  # peers say hello this often
    peer_ttl_s: float = 15.0  # and are forgotten after this long unheard
    fanout: int = 4  # children per source per key
    source_load: int = 8  # children across keys past which a fetcher is ranked after those below it
    roots: int = 1  # origin fetches of a chunk nobody holds while a loaded fetcher could serve it (1: the first's only)
    stripes: int = 4  # a peer is an inner node of one key's tree in this many (1: of every key's)
    child_ttl_s: float = 30.0  # a hand-out counts against its source this long, or until the child fills
    max_sources: int = 4  # sources per key in a locate answer
    demand_window_s: float = 60.0  # how far back a key's askers count as its demand
    hold_s: float = 30.0  # how much longer a last copy in demand is kept
    busy_s: float = 1.0  # a source that refused is ranked last this long
    demote_s: float = 30.0  # a source that failed or served bad bytes is ranked last this long
    ban_after: int = 3  # failures that ban a source
    max_peers: int = 100_000  # peers registered at once (past it a new one is refused: 429)
    max_keys_per_peer: int = 1_000_000  # keys a peer holds or fetches (past it, 429: bounds memory)
    ticket_ttl_s: float = TICKET_TTL_S  # how long a serve ticket lets the asker fetch from a source

    def __post_init__(self) -> None:
        check_positive_fields(self)


@dataclass
class _Peer:
    peer_id: str
    tenant: str
    address: str
    serve_key: ServeKey
    seen: float
    uploads: int = 0
    budget_bytes: int = 0
    failures: int = 0
    ranked_last_until: float = 0.0
    banned: bool = False
    stripe: int = 0  # crc32 of its id: with a key's, which keys' trees it is an inner node of
    holds: set[str] = field(default_factory=set)  # keys it holds
    fetches: set[str] = field(default_factory=set)  # keys it is fetching


class Tracker:
    """The tracker's state and rules (no I/O); ``clock`` (ages and windows) and ``wall``
    (unix time: ticket expiries) are injectable for tests."""

    def __init__(
        self,
        config: TrackerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or TrackerConfig()
        self._clock, self._wall = clock, wall
        self._peers: dict[str, _Peer] = {}
        self._swarms: dict[str, Swarm] = {}
        self._load: Counter[str] = Counter()  # source -> its children across keys (every swarm's, summed)
        self._next_expiry = 0.0
        self.counts: Counter[str] = Counter()

    # --- peers ----------------------------------------------------------------------------

    def hello(self, tenant: str, hello: PeerHello) -> HelloResponse:
        validate_hex32(hello.peer_id, "peer id")
        address = _checked_address(hello.address)
        try:
            serve_key = ServeKey.from_hex(hello.serve_key)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        now = self._clock()
        self._expire()  # a peer unheard for its TTL is forgotten, even if this is its hello
        peer = self._peers.get(hello.peer_id)
        registered = peer is None
        if peer is None:
            if len(self._peers) >= self.config.max_peers:
                raise Overloaded(f"the tracker has its {self.config.max_peers} peers: try another or later")
            peer = self._peers[hello.peer_id] = _Peer(hello.peer_id, tenant, address, serve_key, now)
            peer.stripe = zlib.crc32(hello.peer_id.encode())
            self.counts["peers_registered"] += 1
        elif peer.tenant != tenant:
            raise Forbidden(f"peer {hello.peer_id} belongs to another tenant")
        peer.address, peer.serve_key, peer.seen = address, serve_key, now
        del self._peers[peer.peer_id]  # to the end: the peers stay in the order they were heard
        self._peers[peer.peer_id] = peer
        peer.uploads, peer.budget_bytes = max(0, hello.uploads), max(0, hello.budget_bytes)
        return HelloResponse(
            heartbeat_s=self.config.heartbeat_s, ttl_s=self.config.peer_ttl_s, tenant=tenant, registered=registered
        )

    def _peer(self, tenant: str, peer_id: str) -> _Peer:
        self._expire()
        peer = self._peers.get(peer_id)
        if peer is None:
            raise PeerNotFound(f"unknown peer {peer_id!r}: say hello first (POST /v1/peers)")
        if peer.tenant != tenant:
            raise Forbidden(f"peer {peer_id} belongs to another tenant")
        return peer

    def _expire(self) -> None:
        """Forget peers unheard for ``peer_ttl_s`` (checked at most once a second, or four
        times a TTL if that is shorter).  ``_peers`` is in the order they were last heard
        (a hello moves its peer to the end), so this looks at the expired ones and one more,
        not at every peer (a sweep of all of them grew the CPU per host with N)."""
        now = self._clock()
        if now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, self.config.peer_ttl_s / 4)
        while self._peers:
            peer = next(iter(self._peers.values()))
            if now - peer.seen <= self.config.peer_ttl_s:
                break
            self._forget(peer)
            self.counts["peers_expired"] += 1

    def _forget(self, peer: _Peer) -> None:
        del self._peers[peer.peer_id]
        for key in list(peer.holds | peer.fetches):
            self._let_go(peer, key)

    # --- locate ---------------------------------------------------------------------------

    def locate(self, tenant: str, peer_id: str, keys: list[str]) -> LocateResponse:
        """Sources for each key (whose refs' grants the caller checked: see ``make_app``)."""
        asker = self._peer(tenant, peer_id)
        keys = _checked_keys(keys, "keys")
        if len(asker.holds) + len(asker.fetches) + len(keys) > self.config.max_keys_per_peer:
            raise Overloaded(
                f"peer {asker.peer_id} holds or fetches too many keys (at most {self.config.max_keys_per_peer}):"
                " announce what it filled, failed or evicted"
            )
        return LocateResponse(located=[self._locate(asker, key) for key in keys])

    def _locate(self, asker: _Peer, key: str) -> Located:
        now = self._clock()
        swarm = self._swarm(key)
        swarm.asks.append(now)
        self._trim_asks(swarm, now)
        if asker.peer_id in swarm.holders:
            return Located(key=key, sources=[])  # it has it: nothing to hand out, nothing to record
        fanout, ttl = self.config.fanout, self.config.child_ttl_s
        swarm.reopen_due(now, fanout, ttl)
        sources = self._ranked_sources(key, swarm, asker, now)
        if sources and self._another_root(swarm, sources[0]):
            sources = []
        if not swarm.holders and not sources:
            swarm.rooted += 1
        if sources:
            swarm.hand_out(sources[0].peer_id, asker.peer_id, now, fanout, ttl)  # the child tries it first
            swarm.depth[asker.peer_id] = swarm.depth.get(sources[0].peer_id, 0) + 1
            self.counts["located_peer"] += 1
        else:
            swarm.depth[asker.peer_id] = 1
            self.counts["located_origin"] += 1
        if asker.peer_id not in swarm.fetchers:
            swarm.fetchers[asker.peer_id] = now
            if swarm.children_of(asker.peer_id, now, ttl) < fanout:
                swarm.open(asker.peer_id)
        asker.fetches.add(key)
        return Located(key=key, sources=sources)

    def _another_root(self, swarm: Swarm, best: Source) -> bool:
        """Whether the asker should fetch from the origin although a peer fetching it could
        serve it: the best source already has ``source_load`` children across keys (its
        uplink's queue) and the chunk has fewer than ``roots`` origin fetches.  At a job's
        start every peer asks for the same chunks at once; the first asker, sent to the
        origin for all of them, would otherwise be every chunk's only root, its uplink the
        whole swarm's bottleneck."""
        return not best.complete and swarm.rooted < self.config.roots and self._load[best.peer_id] >= self.config.source_load

    def _swarm(self, key: str) -> Swarm:
        swarm = self._swarms.get(key)
        if swarm is None:
            swarm = self._swarms[key] = Swarm(load=self._load, stripe=zlib.crc32(key.encode()))
        return swarm

    def _ranked_sources(self, key: str, swarm: Swarm, asker: _Peer, now: float) -> list[Source]:
        """The best ``max_sources`` of the first ``SCAN`` open holders (healthy before
        ranked-last, then fewest children across keys, uploads, children of this key), then of
        the first ``SCAN`` open fetchers (healthy first; on the key's stripe before off it;
        below ``source_load`` children across keys before past it; fewest hops from a copy: one
        more than its source's, a holder's 0; earliest): each with room for another child of
        this key.

        The stripes spread the uploads: at a job's start every peer asks for the
        same chunks at once and nobody holds them, so their trees were one tree whose inner
        quarter sent ``fanout`` children of every chunk while the rest sent nothing.  A fetcher
        is ranked first for one key in ``stripes`` (crc32 of its id and of the key), a leaf
        of the others' trees.  Hops keep trees shallow: a fresh fetcher of a fetcher is not
        chosen over one fed by a holder or the origin.  The load across keys spreads them further:
        the first asker of a burst, sent to the origin for every chunk, was handed about half of
        every later asker's children (56 of 112 at 8 peers x 16 chunks), as each key's tree
        counted only its own."""
        ttl, stripes = self.config.child_ttl_s, self.config.stripes

        def off(p: _Peer) -> bool:
            return (p.stripe - swarm.stripe) % stripes != 0

        def loaded(p: _Peer) -> bool:
            return self._load[p.peer_id] >= self.config.source_load

        holders = [
            (p.ranked_last_until > now, self._load[p.peer_id], p.uploads, here, p.peer_id, p)
            for p in self._open_peers(swarm.open_holders, asker)
            for here in [swarm.children_of(p.peer_id, now, ttl)]
        ]
        fetchers = [
            (p.ranked_last_until > now, off(p), loaded(p), swarm.depth.get(p.peer_id, 1), swarm.fetchers[p.peer_id], p.peer_id, p)
            for p in self._open_peers(swarm.open_fetchers, asker)
        ]
        best = [c[-1] for c in heapq.nsmallest(self.config.max_sources, holders, key=lambda c: c[:-1])]
        best += [c[-1] for c in heapq.nsmallest(self.config.max_sources - len(best), fetchers, key=lambda c: c[:-1])]
        expires = int(self._wall() + self.config.ticket_ttl_s)
        return [
            Source(
                peer_id=p.peer_id,
                address=p.address,
                complete=p.peer_id in swarm.holders,
                ticket=p.serve_key.ticket(asker.tenant, key, expires),
            )
            for p in best
        ]

    def _open_peers(self, open_ids: dict[str, None], asker: _Peer) -> list[_Peer]:
        """The first ``SCAN`` of ``open_ids`` that may serve ``asker``."""
        found: list[_Peer] = []
        for peer_id in open_ids:
            peer = self._peers.get(peer_id)
            if peer is not None and peer is not asker and not peer.banned and peer.tenant == asker.tenant:
                found.append(peer)
                if len(found) == SCAN:
                    break
        return found

    def _trim_asks(self, swarm: Swarm, now: float) -> None:
        while swarm.asks and now - swarm.asks[0] > self.config.demand_window_s:
            swarm.asks.popleft()

    # --- announce ---------------------------------------------------------------------------

    def announce(self, tenant: str, request: AnnounceRequest) -> AnnounceResponse:
        peer = self._peer(tenant, request.peer_id)
        now = self._clock()
        keep = [key for key in _checked_keys(request.filled, "filled") if self._filled(peer, key, now)]
        for key in [*_checked_keys(request.failed, "failed"), *_checked_keys(request.evicted, "evicted")]:
            self._let_go(peer, key)
        hold = [key for key in _checked_keys(request.evicting, "evicting") if self._evicting(peer, key, now)]
        return AnnounceResponse(keep=keep, hold=hold, hold_s=self.config.hold_s)

    def _filled(self, peer: _Peer, key: str, now: float) -> bool:
        """Record ``peer``'s verified copy; whether it should keep serving it."""
        swarm = self._swarm(key)
        swarm.fetchers.pop(peer.peer_id, None)
        swarm.depth.pop(peer.peer_id, None)
        swarm.open_fetchers.pop(peer.peer_id, None)
        peer.fetches.discard(key)
        # a child that filled frees its source's slot
        swarm.release(peer.peer_id, now, self.config.fanout, self.config.child_ttl_s)
        self._trim_asks(swarm, now)
        needed = max(1, math.ceil(len(swarm.asks) / self.config.fanout))
        if peer.peer_id not in swarm.holders and len(swarm.holders) >= needed:
            self.counts["fills_not_kept"] += 1
            self._drop_if_idle(key, swarm)
            return False
        swarm.holders.add(peer.peer_id)
        if swarm.children_of(peer.peer_id, now, self.config.child_ttl_s) < self.config.fanout:
            swarm.open(peer.peer_id)
        peer.holds.add(key)
        return True

    def _evicting(self, peer: _Peer, key: str, now: float) -> bool:
        """Whether ``peer`` must hold its copy of ``key`` a while longer: the last one, and in
        demand.  Otherwise it is let go."""
        swarm = self._swarms.get(key)
        if swarm is not None and swarm.holders == {peer.peer_id}:
            self._trim_asks(swarm, now)
            if swarm.asks or swarm.fetchers:
                self.counts["last_copies_held"] += 1
                return True
        self._let_go(peer, key)
        return False

    def _let_go(self, peer: _Peer, key: str) -> None:
        peer.holds.discard(key)
        peer.fetches.discard(key)
        swarm = self._swarms.get(key)
        if swarm is not None:
            swarm.forget(peer.peer_id)
            self._drop_if_idle(key, swarm)

    def _drop_if_idle(self, key: str, swarm: Swarm) -> None:
        if swarm.idle():
            for source in list(swarm.children):
                swarm.drop_children(source)
            self._swarms.pop(key, None)

    # --- report -----------------------------------------------------------------------------

    def report(self, tenant: str, request: ReportRequest) -> ReportResponse:
        self._peer(tenant, request.peer_id)
        (key,) = _checked_keys([request.key], "key")
        source = self._peers.get(request.source)
        if source is None or source.tenant != tenant:
            raise PeerNotFound(f"unknown peer {request.source!r}")
        self._penalise(source, key, request.problem, self._clock())
        return ReportResponse(banned=source.banned)

    def _penalise(self, source: _Peer, key: str, problem: Problem, now: float) -> None:
        self.counts[f"reports_{problem}"] += 1
        if problem == "missing":
            self._let_go(source, key)
            return
        if problem == "refused":
            source.ranked_last_until = max(source.ranked_last_until, now + self.config.busy_s)
            return
        source.failures += 1
        source.ranked_last_until = now + self.config.demote_s
        if problem == "bad_bytes":
            self._let_go(source, key)
        if source.failures >= self.config.ban_after and not source.banned:
            source.banned = True
            self.counts["peers_banned"] += 1
            for held in list(source.holds | source.fetches):
                self._let_go(source, held)

    # --- stats ------------------------------------------------------------------------------

    def peer_count(self) -> int:
        return len(self._peers)

    def swarm_count(self) -> int:
        return len(self._swarms)

    def event_counts(self) -> dict[tuple[str, ...], float]:
        """``counts`` keyed for the /metrics ``events`` family."""
        return {(event,): n for event, n in self.counts.items()}

    def stats(self) -> dict[str, object]:
        self._expire()
        now = self._clock()
        for swarm in self._swarms.values():
            self._trim_asks(swarm, now)
        hot = heapq.nlargest(HOT_KEYS, self._swarms.items(), key=lambda item: len(item[1].asks))
        return {
            "peers": len(self._peers),
            "banned": sum(p.banned for p in self._peers.values()),
            "swarms": len(self._swarms),
            "hot": [{"key": key, "demand": len(s.asks), "copies": len(s.holders), "fetchers": len(s.fetchers)} for key, s in hot],
            "counts": dict(self.counts),
        }


def _checked_address(address: str) -> str:
    """``http://host:port`` with nothing after it; BadRequest otherwise."""
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as exc:
        raise BadRequest(f"invalid peer address {address!r}: {exc}") from exc
    plain = parts.path in ("", "/") and not (parts.query or parts.fragment or parts.username or parts.password)
    if parts.scheme != "http" or not parts.hostname or not port or not plain or not address.isprintable():
        raise BadRequest(f"invalid peer address {address!r}: expected http://HOST:PORT")
    return address.rstrip("/")


def _checked_keys(keys: list[str], what: str) -> list[str]:
    if len(keys) > TRACKER_MAX_KEYS:
        raise BadRequest(f"{what}: at most {TRACKER_MAX_KEYS} keys a request, got {len(keys)}")
    for key in keys:
        if not key or len(key) > 256:
            raise BadRequest(f"{what}: invalid chunk key {key!r}")
    return keys
