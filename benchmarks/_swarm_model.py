"""The peer tier at thousands of hosts, simulated: a discrete-event model of hosts
fetching one blob through the peer tier, that drives the real tracker
(:class:`servers.tracker_rules.Tracker`, on the simulated clock) and models only the clients
and the network.  ``benchmarks/swarm_sim.py`` builds the scenarios and reports.

A simulated host behaves as a real client (``blobsdk/tiers/_peer.py``,
``blobsdk/peer/sharing.py``, ``blobsdk/peer/server.py``):

- it fetches the blob's chunks in order, ``readahead`` at once; each fetch asks the tracker
  (``locate``; the asks started at one moment go in one request) and tries the sources in the
  order given: a source at ``max_uploads`` sends refuses (429: ``refused`` reported, next
  source), one that does not have the chunk answers 404 (``missing``), a dead one is silent
  for ``timeout_s`` (``failed``), a left one refuses the connection (``failed``).  Every
  source failed, not all refused, with budget left: the tracker is asked once more and its
  complete copies not tried yet are tried (``asked_again``); every one refused (busy): the
  same ones again after a pause, 50 ms doubling to 1 s (``busy_waits``).  No source left, or
  the fetch's ``fetch_budget_s`` spent: the origin (L3/L4);
- a source still fetching the chunk keeps the child waiting until it lands (at most
  ``wait_s``, then 404; it says ``102 Processing`` meanwhile, so only a dead one is silent,
  and left after ``timeout_s``), then sends it: the real server serves a chunk once it has it
  all, so a child never finishes before its source (store and forward per chunk, as the real
  code);
- a landed chunk enters the serving cache (an LRU of ``budget_bytes``) and is announced as
  filled on the next 50 ms announce tick; a fill the tracker says not to keep leaves the cache
  2 s later; an evicted chunk is announced as evicting, held ``hold_s`` if the tracker says so,
  then announced as evicted;  heartbeats (``hello``) every ``heartbeat_s`` carry the uploads
  in flight.

The network (``benchmarks/_swarm_loop.py``): each host has an up and a down link, the origin
one link of ``origin_Bps`` (reached after ``origin_latency_s``), and flows share them by
processor sharing, simplified: a flow runs at the smaller of its two links' equal shares.  A
send whose chunk fits ``sndbuf_bytes`` frees its upload slot at once (the kernel took it);
a larger one holds it to its last byte, and ``max_uploads`` then refuses children.  Time is
the loop's; the tracker's CPU is measured with ``time.process_time`` around each call
(:class:`~benchmarks._swarm_loop.Metered`), the cyclic collector's passes within apart.
Cost: 10,000 hosts x 48 chunks, 4.1 M events, took 156 s of this machine (the tracker's
share 58 s).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from blobsdk.auth import ServeKey
from blobsdk.config import PeerConfig
from blobsdk.errors import BlobError, PeerNotFound
from blobsdk.peer.sharing import _ANNOUNCE_S, _DROP_GRACE_S, _MAX_HELD
from blobsdk.tiers._peer import _BUSY_PAUSE_MAX_S, _BUSY_PAUSE_S
from blobsdk.wire import TRACKER_MAX_KEYS, AnnounceRequest, PeerHello, Problem, ReportRequest, Source
from servers.tracker_rules import Tracker, TrackerConfig

from ._swarm_loop import Flow, Link, Loop, Metered, Network

TENANT = "sim"
_PEER = PeerConfig()
GB = 10**9


@dataclass(frozen=True, kw_only=True)
class Params:
    """One scenario.  Rates in bytes per second; times in seconds."""

    hosts: int
    blob_bytes: int = 3 << 30
    chunk_bytes: int = 4 << 20
    down_Bps: float = 10 * GB / 8  # a host's link, down and up: 10 Gb/s
    up_Bps: float = 10 * GB / 8
    rtt_s: float = 0.0005
    readahead: int = 8  # chunks a host fetches at once
    max_uploads: int = _PEER.max_uploads
    wait_s: float = _PEER.wait_s
    timeout_s: float = _PEER.timeout_s
    budget_bytes: int = _PEER.budget_bytes
    origin_Bps: float = 10 * GB / 8
    origin_latency_s: float = 0.0
    # All peer sends share this many bytes/s, not each host's up link: the validation's one
    # machine, whose cores (not links) bound the real p2p benchmark's readers.
    shared_up_Bps: float | None = None
    # Every flow into a host also shares this many bytes/s with all the others: the one
    # machine's cores that a testbed's emulated hosts share (``Network``'s pool); None: none.
    cpu_Bps: float | None = None
    # A send whose chunk fits the socket's send buffer leaves the server's hands at once (the
    # kernel takes it whole: the real server's upload slot is freed then, the bytes still on
    # their way); 0: a send holds its upload slot until its last byte left.
    sndbuf_bytes: int = 0
    peers: bool = True  # False: every host reads the origin (no tracker)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    late_fraction: float = 0.0  # hosts joining at a uniform time in [0, late_by_s]; the rest at 0
    late_by_s: float = 0.0
    die_fraction: float = 0.0  # hosts dying (silent from then on) at a uniform time in die_window_s
    die_window_s: tuple[float, float] = (0.0, 0.0)
    leave_after_s: float = math.inf  # a host leaves (says goodbye) this long after completing
    seed: int = 0
    record: bool = False  # keep every tracker call (``Metered.log``), for ``replay``

    @property
    def chunks(self) -> int:
        return -(-self.blob_bytes // self.chunk_bytes)

    @property
    def fetch_budget_s(self) -> float:
        return self.wait_s + 1.0  # PeerConfig.fetch_budget_s None: wait_s + 1 s


@dataclass(eq=False)
class Host:
    index: int
    id: str
    address: str
    serve_key: str
    up: Link
    down: Link
    joins_at: float = 0.0
    alive: bool = False
    left: bool = False
    dead: bool = False
    joined: float = math.nan
    done: float = math.nan
    next_chunk: int = 0
    inflight: int = 0
    landed: int = 0
    landing: dict[int, list[Transfer]] = field(default_factory=dict)  # chunk fetched -> children waiting
    serving: OrderedDict[int, None] = field(default_factory=OrderedDict)  # the serving cache, LRU first
    held: dict[int, float] = field(default_factory=dict)  # evicted but held -> until
    sending: int = 0
    queue: deque[Transfer] = field(default_factory=deque)  # children that waited, queued for a send
    serving_to: dict[Transfer, None] = field(default_factory=dict)  # children waiting, queued or sent to (in order)
    filled: set[int] = field(default_factory=set)  # to announce
    evicting: set[int] = field(default_factory=set)
    evicted: set[int] = field(default_factory=set)
    announce_due: bool = False


@dataclass(eq=False)
class Fetch:
    host: Host
    chunk: int
    deadline: float
    sources: list[Source] = field(default_factory=list)
    tried: int = 0
    stale: bool = False  # a source answered 404 or failed (not only refused: busy)
    asked_again: bool = False
    pause: float = _BUSY_PAUSE_S  # before the busy sources are tried again


@dataclass(eq=False)
class Transfer:
    """One child's request at one source."""

    fetch: Fetch
    source: Host
    live: bool = True
    flow: Flow | None = None
    slot: bool = True  # holds one of its source's upload slots while sent


@dataclass
class Result:
    params: Params
    completion_s: list[float]  # per host that completed, from its join
    died: int
    origin_bytes: int
    events: int
    tracker: Metered
    peer_chunks: int = 0
    origin_chunks: int = 0
    problems: dict[str, int] = field(default_factory=dict)


class Swarm:
    """One run of ``params`` (:meth:`run`)."""

    def __init__(self, params: Params) -> None:
        self.p = params
        self.loop = Loop()
        self.tracker = Tracker(params.tracker, clock=self.loop.clock, wall=self.loop.wall)
        self.meter = Metered(record=self.loop.clock if params.record else None)
        rng = random.Random(params.seed)
        self.net = Network(self.loop, None if params.cpu_Bps is None else Link(params.cpu_Bps))
        self.origin = Link(params.origin_Bps)
        shared = None if params.shared_up_Bps is None else Link(params.shared_up_Bps)
        self.hosts = [_host(i, params, shared) for i in range(params.hosts)]
        self.by_id = {h.id: h for h in self.hosts}
        self._keys = [f"{params.seed:08x}-chunk-{c:07d}" for c in range(params.chunks)]
        self._chunk_of = {key: c for c, key in enumerate(self._keys)}
        self._capacity = params.budget_bytes // params.chunk_bytes  # chunks the serving cache holds
        self.result = Result(params, [], 0, 0, 0, self.meter)
        self._remaining = params.hosts
        for h in rng.sample(self.hosts, round(params.late_fraction * params.hosts)):
            h.joins_at = rng.uniform(0.0, params.late_by_s)
        for h in rng.sample(self.hosts, round(params.die_fraction * params.hosts)):
            self.loop.at(rng.uniform(*params.die_window_s), self._die, h)

    def run(self) -> Result:
        for h in self.hosts:
            self.loop.at(h.joins_at, self._join, h)
        with self.meter.watching_gc():
            self.loop.run(stop=lambda: self._remaining == 0)
        self.result.events = self.loop.events
        return self.result

    # --- lifecycle ------------------------------------------------------------------------------

    def _join(self, h: Host) -> None:
        if h.left:  # died before it joined
            return
        h.alive, h.joined = True, self.loop.now
        if self.p.peers:
            self._heartbeat(h)
        self._fill(h)

    def _heartbeat(self, h: Host) -> None:
        if h.alive:
            hello = PeerHello(
                peer_id=h.id, address=h.address, serve_key=h.serve_key, uploads=h.sending, budget_bytes=self.p.budget_bytes
            )
            self.meter.call("hello", self.tracker.hello, TENANT, hello)
            self.loop.after(self.p.tracker.heartbeat_s, self._heartbeat, h)

    def _completed(self, h: Host) -> None:
        h.done = self.loop.now
        self.result.completion_s.append(h.done - h.joined)
        self._remaining -= 1
        if self.p.leave_after_s < math.inf:
            self.loop.after(self.p.leave_after_s, self._leave, h)

    def _die(self, h: Host) -> None:
        """Silent from now on: its children learn it after ``timeout_s``."""
        if h.left:
            return
        if math.isnan(h.done):
            self.result.died += 1
            self._remaining -= 1
        h.alive, h.left, h.dead = False, True, True
        self._cut_downloads(h)
        self._stop_serving(h, lambda t: self._fail_after(t, self._silence(t), "failed"))

    def _silence(self, t: Transfer) -> float:
        """How long a child waits on a silent source: ``timeout_s``, or to its budget's end."""
        return min(self.p.timeout_s, max(0.0, t.fetch.deadline - self.loop.now))

    def _leave(self, h: Host) -> None:
        """Goodbye: every copy announced as evicted, the server closed (children cut off)."""
        if not h.alive:
            return
        gone = [*h.serving, *h.held, *h.evicting, *h.evicted]
        h.serving.clear()
        h.held.clear()
        if gone:
            goodbye = AnnounceRequest(peer_id=h.id, evicted=self._key_list(gone))
            self.meter.call("announce", self.tracker.announce, TENANT, goodbye)
        h.alive, h.left = False, True
        self._stop_serving(h, lambda t: self._fail_after(t, self.p.rtt_s / 2, "failed"))

    def _cut_downloads(self, h: Host) -> None:
        """A dead host's downloads stop: its sources' sends end (their slots freed)."""
        for flow in list(h.down.flows):
            self.net.cancel(flow)
            if isinstance(flow.args[0], Transfer):
                self._release(flow.args[0])

    def _stop_serving(self, h: Host, fail: Callable[[Transfer], None]) -> None:
        children, h.serving_to = h.serving_to, {}
        h.landing.clear()
        h.queue.clear()
        for t in children:
            if t.flow is not None:
                self.net.cancel(t.flow)
            if t.live:
                t.live = False
                fail(t)

    # --- fetching -------------------------------------------------------------------------------

    def _fill(self, h: Host) -> None:
        """Start fetches up to the read-ahead; one locate for those started now."""
        started = []
        while h.inflight < self.p.readahead and h.next_chunk < self.p.chunks:
            chunk, h.next_chunk = h.next_chunk, h.next_chunk + 1
            h.inflight += 1
            h.landing[chunk] = []
            started.append(Fetch(h, chunk, self.loop.now + self.p.fetch_budget_s))
        if not self.p.peers:
            for f in started:
                self._origin(f)
            return
        for i in range(0, len(started), TRACKER_MAX_KEYS):
            batch = started[i : i + TRACKER_MAX_KEYS]
            keys = [self._keys[f.chunk] for f in batch]
            try:
                answer = self.meter.call("locate", self.tracker.locate, TENANT, h.id, keys)
            except BlobError:  # a tracker error: a miss, as the real client's
                self._count("tracker_errors")
                answer = None
            for j, f in enumerate(batch):
                f.sources = [] if answer is None else answer.located[j].sources
                self.loop.after(self.p.rtt_s, self._try_next, f)

    def _try_next(self, f: Fetch) -> None:
        if not f.host.alive:
            return
        if f.tried >= len(f.sources) or self.loop.now >= f.deadline:
            if f.stale and not f.asked_again and self.loop.now < f.deadline:
                self._ask_again(f)
                return
            if f.sources and not f.stale and self.loop.now + f.pause < f.deadline:  # every source busy
                self._busy_wait(f)
                return
            tried = f.sources or f.asked_again
            self._count("over_budget" if f.tried < len(f.sources) else "no_source_left" if tried else "no_source")
            self._origin(f)
            return
        source = self.by_id.get(f.sources[f.tried].peer_id)
        f.tried += 1
        if source is None:
            self._try_next(f)
            return
        self.loop.after(self.p.rtt_s / 2, self._arrive, Transfer(f, source))

    def _busy_wait(self, f: Fetch) -> None:
        """Every source refused (busy) with budget left: the same ones again after a pause,
        doubling (as the real client, ``PeerTier._from_sources``)."""
        f.tried = 0
        self._count("busy_waits")
        self.loop.after(f.pause, self._try_next, f)
        f.pause = min(2 * f.pause, _BUSY_PAUSE_MAX_S)

    def _ask_again(self, f: Fetch) -> None:
        """Every source failed with budget left, not all of them busy: the list may be stale
        (a source silent for seconds, the rest dropped the chunk since), so ask once more and
        try the complete copies not tried yet (a fetcher named now may be waiting for this
        host), as the real client (``PeerTier._from_peers``)."""
        tried = {s.peer_id for s in f.sources}
        f.asked_again, f.tried = True, 0
        self._count("asked_again")
        try:
            answer = self.meter.call("locate", self.tracker.locate, TENANT, f.host.id, [self._keys[f.chunk]])
            f.sources = [s for s in answer.located[0].sources if s.complete and s.peer_id not in tried]
        except BlobError:
            self._count("tracker_errors")
            f.sources = []
        self.loop.after(self.p.rtt_s, self._try_next, f)

    def _arrive(self, t: Transfer) -> None:
        """The child's request reaches its source: the server's rules, in order."""
        src, chunk = t.source, t.fetch.chunk
        if not src.alive:  # a dead host is silent (timeout_s); a left or unstarted one refuses the connection
            self._fail_after(t, self._silence(t) if src.dead else self.p.rtt_s / 2, "failed")
        elif src.sending >= self.p.max_uploads:
            self._fail_after(t, self.p.rtt_s / 2, "refused")
        elif chunk in src.serving or chunk in src.held:
            if chunk in src.serving:
                src.serving.move_to_end(chunk)  # a get refreshes the LRU
            src.serving_to[t] = None
            self._send(t)
        elif chunk in src.landing:
            src.serving_to[t] = None
            src.landing[chunk].append(t)
            self.loop.after(self.p.wait_s, self._waited_too_long, t)
        else:
            self._fail_after(t, self.p.rtt_s / 2, "missing")

    def _waited_too_long(self, t: Transfer) -> None:
        waiting = t.source.landing.get(t.fetch.chunk)
        if t.live and waiting is not None and t in waiting:
            waiting.remove(t)
            t.source.serving_to.pop(t, None)
            t.live = False
            self._count("waited_too_long")
            self._fail_after(t, self.p.rtt_s / 2, "missing")

    def _count(self, what: str) -> None:
        self.result.problems[what] = self.result.problems.get(what, 0) + 1

    def _fail_after(self, t: Transfer, delay: float, problem: Problem) -> None:
        t.live = False
        self.loop.after(delay, self._failed, t, problem)

    def _failed(self, t: Transfer, problem: Problem) -> None:
        f = t.fetch
        if not f.host.alive:
            return
        self._count(problem)
        f.stale = f.stale or problem != "refused"
        request = ReportRequest(peer_id=f.host.id, source=t.source.id, key=self._keys[f.chunk], problem=problem)
        with contextlib.suppress(PeerNotFound):  # the source was forgotten: the real client's report fails too
            self.meter.call("report", self.tracker.report, TENANT, request)
        self._try_next(f)

    def _send(self, t: Transfer) -> None:
        src = t.source
        if src.sending >= self.p.max_uploads:
            src.queue.append(t)
            return
        t.flow = self.net.start(src.up, t.fetch.host.down, self.p.chunk_bytes, self._sent, t)
        if self.p.chunk_bytes > self.p.sndbuf_bytes:
            src.sending += 1
        else:  # the kernel took it whole: the slot is free again
            t.slot = False
            src.serving_to.pop(t, None)

    def _sent(self, t: Transfer) -> None:
        """The last byte left the source (the flow ends only if both ends lived)."""
        t.live = False
        self._release(t)
        self.result.peer_chunks += 1
        self.loop.after(self.p.rtt_s / 2, self._received, t.fetch)

    def _release(self, t: Transfer) -> None:
        if not t.slot:
            return
        src = t.source
        src.sending -= 1
        src.serving_to.pop(t, None)
        if src.queue and src.alive:
            self._send(src.queue.popleft())

    def _received(self, f: Fetch) -> None:
        if f.host.alive:
            self._land(f.host, f.chunk)

    def _origin(self, f: Fetch) -> None:
        self.loop.after(self.p.rtt_s / 2 + self.p.origin_latency_s, self._origin_sends, f)

    def _origin_sends(self, f: Fetch) -> None:
        if f.host.alive:
            self.result.origin_bytes += self.p.chunk_bytes
            self.result.origin_chunks += 1
            self.net.start(self.origin, f.host.down, self.p.chunk_bytes, self.loop.after, self.p.rtt_s / 2, self._received, f)

    # --- landing and sharing --------------------------------------------------------------------

    def _land(self, h: Host, chunk: int) -> None:
        for t in h.landing.pop(chunk, []):
            if t.live:
                self._send(t)
        h.inflight -= 1
        h.landed += 1
        if self.p.peers and self._capacity > 0:
            h.serving[chunk] = None
            h.filled.add(chunk)
            while len(h.serving) > self._capacity:
                old, _ = h.serving.popitem(last=False)
                h.evicting.add(old)
            self._announce_soon(h)
        if h.landed == self.p.chunks:
            self._completed(h)
        self._fill(h)

    def _announce_soon(self, h: Host) -> None:
        if not h.announce_due:
            h.announce_due = True
            ticks = math.floor((self.loop.now - h.joined) / _ANNOUNCE_S) + 1
            self.loop.at(h.joined + ticks * _ANNOUNCE_S, self._announce, h)

    def _announce(self, h: Host) -> None:
        h.announce_due = False
        if not h.alive:
            return
        filled, evicting, evicted = h.filled, h.evicting - set(h.serving), h.evicted
        h.filled, h.evicting, h.evicted = set(), set(), set()
        request = AnnounceRequest(
            peer_id=h.id, filled=self._key_list(filled), evicting=self._key_list(evicting), evicted=self._key_list(evicted)
        )
        answer = self.meter.call("announce", self.tracker.announce, TENANT, request)
        keep = {self._chunk_of[k] for k in answer.keep}
        for chunk in filled - keep:
            self.loop.after(_DROP_GRACE_S, self._drop, h, chunk)
        for key in answer.hold:
            chunk = self._chunk_of[key]
            if len(h.held) < _MAX_HELD:
                h.held[chunk] = self.loop.now + answer.hold_s
                self.loop.after(answer.hold_s, self._unhold, h, chunk)
            else:
                h.evicted.add(chunk)
                self._announce_soon(h)

    def _drop(self, h: Host, chunk: int) -> None:
        h.serving.pop(chunk, None)

    def _unhold(self, h: Host, chunk: int) -> None:
        if h.alive and h.held.pop(chunk, None) is not None:
            h.evicted.add(chunk)
            self._announce_soon(h)

    def _key_list(self, chunks: Iterable[int]) -> list[str]:
        return [self._keys[c] for c in sorted(chunks)]


def _host(i: int, p: Params, shared_up: Link | None) -> Host:
    address = f"http://10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:7400"
    return Host(i, f"{i + 1:032x}", address, ServeKey.generate().hex, shared_up or Link(p.up_Bps), Link(p.down_Bps))
