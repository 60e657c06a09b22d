"""The tracker: the control plane of the Owl-style peer tier (DESIGN §2).

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
  — holders first (the demoted after the healthy, then fewest children across keys), then
  peers still fetching it (healthy first; those on the key's stripe, so that a peer is an inner
  node of the trees of one key in ``stripes`` and the uploads spread over the swarm; those
  with fewer than ``source_load`` children across keys; fewest hops from a copy; earliest:
  bytes flow down a shallow tree) — at most ``max_sources``,
  leaving out any source that already has ``fanout`` children for that key.
  A locate ranks only the first ``SCAN`` (32) holders and fetchers with room, so its cost does
  not grow with the swarm (servers/tracker_rules.py).  The asker is recorded as a fetcher of
  each key, a source for later askers.  No source: the asker fetches from the origin (L3/L4),
  and the next askers are sent to it; with ``roots`` above 1, an asker whose best source
  is such a fetcher past ``source_load`` is sent to the origin too (another root of that
  chunk's tree), up to ``roots`` origin fetches of a chunk nobody holds yet.
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

The decisions are :class:`~servers.tracker_rules.Tracker`'s (no I/O); this module only serves
them.  Several trackers shard the key space: clients pick a key's tracker by rendezvous hashing
(``blobsdk/chunks/names.py``), so each tracker is independent.  Like every server: ``make_app``,
``--help``, ``/healthz``, ``/metrics``, bearer auth, fault injection, bounded clients.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence

from aiohttp import web

from blobsdk.cli import ArgumentParser
from blobsdk.errors import BadRequest
from blobsdk.net import limits_of_args
from blobsdk.wire import TRACKER_MAX_KEYS, AnnounceRequest, LocateRequest, PeerHello, ReportRequest, validate_ref

from ._common import prog
from ._common.auth import AUTH_KEY, ServerAuth, claims_of, require_admin
from ._common.faults import FAULTS_ENV, FaultConfig, config_of_args, fault_extensions
from ._common.http import METRICS_KEY, add_serve_args, auth_of_args, base_app, positive, read_body, reply, serve
from ._common.logs import setup_logging
from .tracker_rules import Tracker, TrackerConfig

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
    ("--source-load", "source_load", "children across keys past which a fetching source is ranked after others"),
    ("--roots", "roots", "origin fetches of a chunk nobody holds while a loaded fetcher could serve it"),
    ("--stripes", "stripes", "a peer is an inner node of one chunk's tree in this many (1: of all)"),
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
    parser = ArgumentParser(prog=prog(f"{__package__}.tracker"), description="The peer tier's tracker (Owl's control plane).")
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
