"""The tracker's decisions, with no I/O (issue 11; DESIGN §2): who a peer fetches a chunk
from, which copies are kept, which last copies are held, which sources are demoted or banned.

servers/tracker.py serves a :class:`Tracker` over HTTP (its docstring gives the routes and
rules); benchmarks/swarm_sim.py drives the very same object on a simulated clock, thousands of
hosts at once.  Time comes only from the injected ``clock`` (ages and windows) and ``wall``
(ticket expiries).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from blobsdk.auth import TICKET_TTL_S, ServeKey
from blobsdk.errors import BadRequest, Forbidden, Overloaded, PeerNotFound
from blobsdk.net.serving import check_positive_fields
from blobsdk.runtime.ids import validate_hex32
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

HOT_KEYS = 20  # keys /stats shows


class TrackerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tracker's rules, in seconds and counts."""

    heartbeat_s: float = 5.0  # peers say hello this often
    peer_ttl_s: float = 15.0  # and are forgotten after this long unheard
    fanout: int = 4  # children per source per key
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
    holds: set[str] = field(default_factory=set)  # keys it holds
    fetches: set[str] = field(default_factory=set)  # keys it is fetching


@dataclass
class _Swarm:
    """One chunk key: who holds it, who fetches it (since when), who was sent where."""

    holders: set[str] = field(default_factory=set)
    fetchers: dict[str, float] = field(default_factory=dict)
    children: dict[str, dict[str, float]] = field(default_factory=dict)  # source -> {child: handed out at}
    asks: deque[float] = field(default_factory=deque)  # when peers asked for it, oldest first

    def idle(self) -> bool:
        return not (self.holders or self.fetchers or self.asks)


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
        self._swarms: dict[str, _Swarm] = {}
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
            self.counts["peers_registered"] += 1
        elif peer.tenant != tenant:
            raise Forbidden(f"peer {hello.peer_id} belongs to another tenant")
        peer.address, peer.serve_key, peer.seen = address, serve_key, now
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
        times a TTL if that is shorter)."""
        now = self._clock()
        if now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, self.config.peer_ttl_s / 4)
        for peer in [p for p in self._peers.values() if now - p.seen > self.config.peer_ttl_s]:
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
        swarm = self._swarms.setdefault(key, _Swarm())
        swarm.asks.append(now)
        self._trim_asks(swarm, now)
        if asker.peer_id in swarm.holders:
            return Located(key=key, sources=[])  # it has it: nothing to hand out, nothing to record
        sources = self._ranked_sources(key, swarm, asker, now)[: self.config.max_sources]
        if sources:
            swarm.children.setdefault(sources[0].peer_id, {})[asker.peer_id] = now  # the child tries it first
            self.counts["located_peer"] += 1
        else:
            self.counts["located_origin"] += 1
        swarm.fetchers.setdefault(asker.peer_id, now)
        asker.fetches.add(key)
        return Located(key=key, sources=sources)

    def _ranked_sources(self, key: str, swarm: _Swarm, asker: _Peer, now: float) -> list[Source]:
        """Holders (healthy before ranked-last, then fewest uploads, then fewest children of
        this key), then fetchers (earliest first), each with room for another child."""
        holders, fetchers = [], []
        for peer_id in swarm.holders:
            peer = self._peers.get(peer_id)
            if peer is not None and self._can_serve(peer, swarm, asker, now):
                rank = (peer.ranked_last_until > now, peer.uploads, self._children(swarm, peer_id, now), peer_id)
                holders.append((rank, peer))
        for peer_id, since in swarm.fetchers.items():
            peer = self._peers.get(peer_id)
            if peer is not None and self._can_serve(peer, swarm, asker, now):
                fetchers.append(((peer.ranked_last_until > now, since), peer))
        ordered = [p for _, p in sorted(holders, key=lambda h: h[0])] + [p for _, p in sorted(fetchers, key=lambda f: f[0])]
        expires = int(self._wall() + self.config.ticket_ttl_s)
        return [
            Source(
                peer_id=p.peer_id,
                address=p.address,
                complete=p.peer_id in swarm.holders,
                ticket=p.serve_key.ticket(asker.tenant, key, expires),
            )
            for p in ordered
        ]

    def _can_serve(self, peer: _Peer, swarm: _Swarm, asker: _Peer, now: float) -> bool:
        return (
            peer is not asker
            and not peer.banned
            and peer.tenant == asker.tenant
            and self._children(swarm, peer.peer_id, now) < self.config.fanout
        )

    def _children(self, swarm: _Swarm, source: str, now: float) -> int:
        """The source's children for this key handed out within ``child_ttl_s`` (older ones
        are dropped here)."""
        children = swarm.children.get(source)
        if not children:
            return 0
        for child in [c for c, at in children.items() if now - at > self.config.child_ttl_s]:
            del children[child]
        return len(children)

    def _trim_asks(self, swarm: _Swarm, now: float) -> None:
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
        swarm = self._swarms.setdefault(key, _Swarm())
        swarm.fetchers.pop(peer.peer_id, None)
        peer.fetches.discard(key)
        for children in swarm.children.values():
            children.pop(peer.peer_id, None)  # a child that filled frees its source's slot
        self._trim_asks(swarm, now)
        needed = max(1, math.ceil(len(swarm.asks) / self.config.fanout))
        if peer.peer_id not in swarm.holders and len(swarm.holders) >= needed:
            self.counts["fills_not_kept"] += 1
            self._drop_if_idle(key, swarm)
            return False
        swarm.holders.add(peer.peer_id)
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
            swarm.holders.discard(peer.peer_id)
            swarm.fetchers.pop(peer.peer_id, None)
            swarm.children.pop(peer.peer_id, None)
            self._drop_if_idle(key, swarm)

    def _drop_if_idle(self, key: str, swarm: _Swarm) -> None:
        if swarm.idle():
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
