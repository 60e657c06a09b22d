"""The tracker: the control plane of the Owl-style peer tier (issue 11; DESIGN §2).

Peers (the clients' embedded peer servers) say hello (register, then heartbeat), ask where
chunks are, announce what they filled and evicted, and report peers that served them badly.
The tracker never sees a byte of data.  Routes (msgpack bodies, ``blobsdk.wire``):

- ``POST /v1/peers`` ``PeerHello`` -> ``HelloResponse``: register or heartbeat.  A peer id is
  bound to the tenant that registered it: another tenant's call for it is 403.  A peer not
  heard from for ``peer_ttl_s`` is forgotten, with every copy it held.  The answer says
  ``registered`` when the hello registered the peer (the tracker knew nothing of it: it
  restarted, or the peer aged out): the peer then announces what it serves again.  The hello carries the
  peer's serve key, which the tracker signs its serve tickets with (``blobsdk.auth``).
- ``POST /v1/locate`` ``LocateRequest`` -> ``LocateResponse``: the asker sends the chunk refs
  of its plans with their grants, and every grant must verify for its tenant (else 403, as a
  block server would answer): so a source is only ever handed to someone who may read the
  bytes from L4.  For each chunk key, ranked sources, each with a serve ticket for the asker
  — holders first (least loaded, the demoted after the healthy), then peers still fetching it
  (earliest first: they stream what they have, so bytes flow down a tree) — at most
  ``max_sources``, leaving out any source that already has ``fanout`` children for that key.
  The asker is recorded as a fetcher of each key, a source for later askers.  No source: the
  asker fetches from the origin (L3/L4), and the next askers are sent to it.
- ``POST /v1/announce`` ``AnnounceRequest`` -> ``AnnounceResponse``: ``filled`` keys become
  the peer's copies, and the tracker decides **caching**: a copy is kept while the key's copies
  are fewer than its recent demand needs (askers in the last ``demand_window_s`` ÷ ``fanout``,
  at least one); the answer's ``keep`` lists those, the peer may drop the others.  ``evicting``
  keys are let go, except the **last copy** of a key asked for within ``demand_window_s``: the
  answer's ``hold`` tells the peer to keep it ``hold_s`` longer.  ``failed`` and ``evicted``
  forget the peer as fetcher and holder.
- ``POST /v1/report`` ``ReportRequest`` -> ``ReportResponse``: ``refused`` (busy) demotes the
  source for ``busy_s``; ``failed`` and ``bad_bytes`` count as failures and demote it for
  ``demote_s`` (``bad_bytes`` also drops its copy of that key); ``ban_after`` failures ban it:
  it is never handed out again and holds nothing.  ``missing`` (it answered 404: it evicted
  the chunk unannounced) drops that copy, with no penalty.
- ``GET /stats`` (admin only: it shows every tenant's keys): peers, banned peers, swarms, the
  hottest keys with their copies and fetchers, and the counters.

Memory is bounded: at most ``max_peers`` peers and ``max_keys_per_peer`` keys each held or
fetched (past either, 429 ``Overloaded``), every list in a request at most 4096 keys.

Several trackers shard the key space: clients pick a key's tracker by rendezvous hashing
(``blobsdk.read.placement``), so each tracker is independent.  Like every server: ``make_app``,
``--help``, ``/healthz``, ``/metrics``, bearer auth, fault injection, bounded clients.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from blobsdk.auth import TICKET_TTL_S, ServeKey
from blobsdk.errors import BadRequest, Forbidden, Overloaded, PeerNotFound
from blobsdk.net.serving import check_positive_fields, limits_of_args
from blobsdk.runtime.ids import validate_hex32
from blobsdk.wire import (
    TRACKER_MAX_KEYS,
    AnnounceRequest,
    AnnounceResponse,
    HelloResponse,
    Located,
    LocateRequest,
    LocateResponse,
    PeerHello,
    Problem,
    ReportRequest,
    ReportResponse,
    Source,
    validate_ref,
)

from ._common import prog
from ._common.auth import AUTH_KEY, ServerAuth, claims_of, require_admin
from ._common.faults import FAULTS_ENV, FaultConfig, config_of_args, fault_extensions
from ._common.http import METRICS_KEY, add_serve_args, auth_of_args, base_app, positive, read_body, reply, serve
from ._common.logs import setup_logging

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


# --- HTTP ---------------------------------------------------------------------------------------

TRACKER = web.AppKey("tracker", Tracker)


def make_app(
    config: TrackerConfig | None = None,
    *,
    auth: ServerAuth | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    faults: FaultConfig | None = None,
    admin_token: str | None = None,
) -> web.Application:
    """The tracker for ``config`` (default: TrackerConfig()); ``auth``: who may call (default: anyone); ``clock`` drives
    ages and windows (tests); ``faults`` and ``admin_token``: see servers/_common/faults.py."""
    tracker = Tracker(config, clock, wall)
    app = base_app("blobsdk_tracker", auth, extensions=fault_extensions(faults, admin_token))
    app[TRACKER] = tracker

    async def hello(request: web.Request) -> web.Response:
        return reply(request, tracker.hello(claims_of(request).tenant, await read_body(request, PeerHello)))

    async def locate(request: web.Request) -> web.Response:
        body = await read_body(request, LocateRequest)
        claims = claims_of(request)
        if len(body.refs) > TRACKER_MAX_KEYS:
            raise BadRequest(f"refs: at most {TRACKER_MAX_KEYS} a request, got {len(body.refs)}")
        for ref in body.refs:
            validate_ref(ref)
            request.app[AUTH_KEY].check_grant(claims, ref.grant, ref.block_id, ref.offset, ref.length)
        return reply(request, tracker.locate(claims.tenant, body.peer_id, [ref.key for ref in body.refs]))

    async def announce(request: web.Request) -> web.Response:
        return reply(request, tracker.announce(claims_of(request).tenant, await read_body(request, AnnounceRequest)))

    async def report(request: web.Request) -> web.Response:
        return reply(request, tracker.report(claims_of(request).tenant, await read_body(request, ReportRequest)))

    async def stats(request: web.Request) -> web.Response:
        require_admin(request)  # every tenant's keys and peers: the operator's view
        return web.json_response(tracker.stats())

    app.router.add_post("/v1/peers", hello)
    app.router.add_post("/v1/locate", locate)
    app.router.add_post("/v1/announce", announce)
    app.router.add_post("/v1/report", report)
    app.router.add_get("/stats", stats, allow_head=False)
    metrics = app[METRICS_KEY]
    metrics.gauge("peers", "Peers registered now.", tracker.peer_count)
    metrics.gauge(
        "swarms", "Chunks the tracker follows now (each with its holders, fetchers and recent asks).", tracker.swarm_count
    )
    metrics.labelled("counter", "events", _EVENTS_HELP, ("event",), tracker.event_counts)
    return app


_EVENTS_HELP = (
    "What the tracker did, by event: peers_registered, peers_expired, peers_banned, located_peer "
    "(a chunk located at a peer), located_origin (sent to the origin), fills_not_kept, last_copies_held, "
    "reports_<problem> (peers' reports of bad sources)."
)

# The flags that set TrackerConfig fields: (flag, field, what it sets).
_FLAGS = (
    ("--heartbeat-seconds", "heartbeat_s", "peers say hello this often"),
    ("--peer-ttl-seconds", "peer_ttl_s", "forget a peer unheard this long"),
    ("--fanout", "fanout", "children per source per chunk"),
    ("--max-sources", "max_sources", "sources per chunk in an answer"),
    ("--demand-window-seconds", "demand_window_s", "how far back askers count as demand"),
    ("--hold-seconds", "hold_s", "how much longer a last copy in demand is kept"),
    ("--ban-after", "ban_after", "failures that ban a peer"),
    ("--ticket-ttl-seconds", "ticket_ttl_s", "how long a serve ticket lasts"),
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    setup_logging("tracker", args.log_level)
    try:
        faults = config_of_args(args, os.environ.get(FAULTS_ENV))
        auth = auth_of_args(args)
        config = TrackerConfig(**{name: getattr(args, name) for _, name, _ in _FLAGS})
    except ValueError as exc:
        parser.error(str(exc))
    app = make_app(config, auth=auth, faults=faults, admin_token=args.admin_token)
    serve(app, args.host, args.port, args.port_file, limits_of_args(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog(f"{__package__}.tracker"), description="The peer tier's tracker (Owl's control plane)."
    )
    defaults = TrackerConfig()
    for flag, name, what in _FLAGS:
        default = getattr(defaults, name)
        kind = type(default)
        metavar = "N" if kind is int else "S"
        parser.add_argument(
            flag, dest=name, type=positive(kind), default=default, metavar=metavar, help=f"{what} (default {default:g})"
        )
    add_serve_args(parser)
    return parser


if __name__ == "__main__":
    main()
