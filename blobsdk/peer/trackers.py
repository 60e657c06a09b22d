"""A peer's side of its trackers (servers/tracker.py): the peer tier's control plane, seen
from a client.

``Trackers(session, urls, token, peer_id=..., address=..., serve_key=...)``, entered with
``async with``, says hello to every tracker (handing it the peer's serve key, which it signs
the peer's serve tickets with, and learning the tenant the peer serves) and then heartbeats
each every ``heartbeat_s`` (as the tracker asks), with the peer's current upload count.
Each chunk key belongs to one tracker, chosen by rendezvous hashing over ``urls``
(``blobsdk/chunks/names.py``), so trackers shard the key space and never talk to each other.
``locate``, ``announce`` and ``report`` batch their keys per tracker and ask the trackers
concurrently.

A tracker is never in the way of a read: a call that takes longer than ``timeout_s`` is
given up (its keys get no sources: the read path goes on to L3/L4; its announcements are
dropped).  A tracker that fails (refused, 5xx) or is slow ``SLOW_CALLS`` times in a row is
marked down for ``down_s``: its keys are not even asked for, and the next heartbeat after
``down_s`` tries it again.  (One slow call is no outage: on the p2p benchmark's loaded 2-core
machine, marking a tracker down for one 250 ms stall sent 5 s of a reader's chunks to the origin:
2.6x the dataset instead of 1.4x.)  A tracker that forgot the peer (restarted, or the peer aged out) answers
``PeerNotFound``: the peer says hello again and retries once.  A hello the tracker answers
``registered`` (it knew nothing of this peer: it restarted, or the peer aged out) calls
``forgotten(url)``: the peer tier announces again what it serves.

**A tracker is not trusted with the client's own health.**  Every answer is checked where it
enters (here): a source whose address is no ``http://HOST:PORT`` (another scheme, a port out
of range, a path, credentials), whose peer id is no hex32, whose ticket is not one (a CR or
LF would be a header of its own), that is this peer itself or an address already listed is
dropped and counted (``bad_sources``), and at most ``MAX_SOURCES`` are kept per key.  An
answer longer than ``MAX_ANSWER_BYTES`` is a failure, never read whole.  Keys
the peer did not ask about or announce are ignored.  A number that makes no sense (a
heartbeat or TTL that is not a positive finite number, a negative or non-finite hold, a
tenant that is empty or changes) makes the answer a failure: logged, the tracker marked down
for ``down_s`` like one that refused, nothing of it obeyed.  A heartbeat shorter than
``HEARTBEAT_MIN_S`` is obeyed at that, a hold longer than ``HOLD_MAX_S`` cut to it.

The peer tier sees its trackers only as a :class:`TrackerClient` (locate, announce, report,
``tracker_of``, ``tenant``, ``counts``), made by a :data:`ConnectTrackers` from the peer's
:class:`Registration` once its server listens: :func:`tracker_servers` makes a
:class:`Trackers`, and the tier's conformance tests an in-process fake.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp
import msgspec

from ..auth import ServeKey
from ..chunks import is_hex32, rank
from ..errors import BlobError, PeerNotFound, Unavailable
from ..net import TRACKER, HttpEndpoint
from ..runtime import AsyncResource
from ..tail import Reason, TargetHealth
from ..wire import (
    MAX_BODY_BYTES,
    TRACKER_MAX_KEYS,
    AnnounceRequest,
    AnnounceResponse,
    ChunkRef,
    HelloResponse,
    LocateRequest,
    LocateResponse,
    PeerHello,
    Problem,
    ReportRequest,
    ReportResponse,
    Source,
)

TIMEOUT_S = 1.0  # a tracker call longer than this is skipped: the read goes on to L3/L4
DOWN_S = 5.0  # a tracker that failed is left alone this long
SLOW_CALLS = 3  # calls in a row past the timeout that count as a failure
HEARTBEAT_S = 5.0  # until a tracker says otherwise
HEARTBEAT_MIN_S = 0.05  # a tracker asking for hellos more often gets them this often
HOLD_MAX_S = 600.0  # a tracker asking to hold a last copy longer gets it held this long
MAX_SOURCES = 8  # sources kept per key, whatever a tracker hands out
MAX_TENANT = 256  # characters of a tenant name
MAX_ANSWER_BYTES = MAX_BODY_BYTES  # a tracker's answer past this is a failure, never read whole
_TICKET = re.compile(r"[0-9]{1,12}\.[A-Za-z0-9_-]{1,128}={0,2}")  # blobsdk.auth.ServeKey.ticket
logger = logging.getLogger("blobsdk.peer.trackers")

T = TypeVar("T")


@dataclass
class Announced:
    """What the trackers answered to an announcement, merged."""

    keep: set[str] = field(default_factory=set)  # filled keys to keep serving
    hold: set[str] = field(default_factory=set)  # evicting keys to hold a while longer
    hold_s: float = 0.0


class TrackerClient(Protocol):
    """What a peer asks of its trackers: :class:`Trackers` (the tracker servers), or a test's
    in-process fake.  ``counts`` has at least ``errors``, ``timeouts``, ``nonsense`` and
    ``bad_sources`` (the peer tier's ``tracker_*`` stats)."""

    counts: Counter[str]
    tenant: str | None  # as the trackers say, once one has answered a hello

    def tracker_of(self, key: str) -> str:
        """The tracker that ``key`` belongs to."""
        ...

    async def locate(self, refs: Iterable[ChunkRef]) -> dict[str, list[Source]]:
        """Each chunk key's sources worth contacting, best first (none: from the origin)."""
        ...

    async def announce(
        self,
        *,
        filled: Iterable[str] = (),
        failed: Iterable[str] = (),
        evicting: Iterable[str] = (),
        evicted: Iterable[str] = (),
    ) -> Announced:
        """Tell the trackers; which filled keys to keep and which evicting ones to hold."""
        ...

    async def report(self, source: str, key: str, problem: Problem) -> bool:
        """Report peer ``source`` for ``key``; whether it is banned now."""
        ...


@dataclass(frozen=True)
class Registration:
    """What a peer tells its trackers at hello, and how they reach back into it."""

    peer_id: str
    address: str  # where its peer server answers
    serve_key: ServeKey  # the secret its serve tickets are signed with
    budget_bytes: int  # its serving cache's budget
    uploads: Callable[[], int]  # uploads sending now (sent with every heartbeat)
    forgotten: Callable[[str], None]  # tracker URL answered ``registered``: announce again


# Connects a peer, once its server listens, to its trackers; entering the result says hello.
ConnectTrackers = Callable[[Registration], AbstractAsyncContextManager[TrackerClient]]


class Trackers(AsyncResource):
    """See the module docstring."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Sequence[str],
        token: str | None = None,
        *,
        peer_id: str,
        address: str,
        serve_key: ServeKey,
        uploads: Callable[[], int] = lambda: 0,
        forgotten: Callable[[str], None] = lambda url: None,
        budget_bytes: int = 0,
        timeout_s: float = TIMEOUT_S,
        down_s: float = DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("Trackers needs at least one tracker URL")
        self._endpoints = {url.rstrip("/"): HttpEndpoint(session, url, token, role=TRACKER) for url in urls}
        self.peer_id, self.address, self._serve_key = peer_id, address, serve_key
        self.tenant: str | None = None  # as the trackers say, once one has answered a hello
        self._uploads, self._budget, self._forgotten = uploads, budget_bytes, forgotten
        self._timeout_s = timeout_s
        self._health = TargetHealth(clock=clock, down_seconds=down_s)  # down trackers (blobsdk/tail/health.py)
        self._slow: Counter[str] = Counter()  # calls in a row past the timeout, per tracker
        self._heartbeat_s = HEARTBEAT_S
        self._heartbeat: asyncio.Task[None] | None = None
        self.counts: Counter[str] = Counter()

    async def _start(self) -> None:
        await asyncio.gather(*(self._hello(url) for url in self._endpoints))
        self._heartbeat = asyncio.create_task(self._beat(), name="blobsdk-tracker-heartbeat")

    async def aclose(self) -> None:
        """Stop the heartbeat; idempotent."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None

    def tracker_of(self, key: str) -> str:
        """The tracker that ``key`` belongs to."""
        return rank(key, list(self._endpoints))[0]

    def is_down(self, url: str) -> bool:
        return self._health.has(url.rstrip("/"), Reason.DOWN)

    # --- the calls --------------------------------------------------------------------------------

    async def locate(self, refs: Iterable[ChunkRef]) -> dict[str, list[Source]]:
        """Each chunk key's sources, best first (none: fetch from the origin, or its tracker is
        down).  The refs carry their grants: the tracker checks them."""
        wanted: dict[str, ChunkRef] = {ref.key: ref for ref in refs}
        found: dict[str, list[Source]] = {key: [] for key in wanted}

        async def ask(url: str, batch: list[str]) -> None:
            def request() -> LocateRequest:
                return LocateRequest(peer_id=self.peer_id, refs=[wanted[key] for key in batch])

            answer = await self._call(url, "/v1/locate", request, LocateResponse)
            if answer is not None:
                asked = set(batch)
                for located in answer.located:
                    if located.key in asked:
                        found[located.key] = self._checked_sources(url, located.sources)

        await self._per_tracker(wanted, ask)
        return found

    async def announce(
        self,
        *,
        filled: Iterable[str] = (),
        failed: Iterable[str] = (),
        evicting: Iterable[str] = (),
        evicted: Iterable[str] = (),
    ) -> Announced:
        """Tell each key's tracker; what they answered (a down tracker: nothing kept or held)."""
        lists = {"filled": set(filled), "failed": set(failed), "evicting": set(evicting), "evicted": set(evicted)}
        merged = Announced()

        async def tell(url: str, batch: list[str]) -> None:
            mine = set(batch)

            def request() -> AnnounceRequest:
                return AnnounceRequest(peer_id=self.peer_id, **{name: sorted(keys & mine) for name, keys in lists.items()})

            answer = await self._call(url, "/v1/announce", request, AnnounceResponse, self._checked_announced)
            if answer is not None:
                merged.keep.update(key for key in answer.keep if key in mine)
                merged.hold.update(key for key in answer.hold if key in mine)
                merged.hold_s = max(merged.hold_s, min(answer.hold_s, HOLD_MAX_S))

        await self._per_tracker(set().union(*lists.values()), tell)
        return merged

    async def report(self, source: str, key: str, problem: Problem) -> bool:
        """Report ``source`` to ``key``'s tracker; whether it is banned now (False if unknown)."""
        request = ReportRequest(peer_id=self.peer_id, source=source, key=key, problem=problem)
        answer = await self._call(self.tracker_of(key), "/v1/report", lambda: request, ReportResponse)
        return answer is not None and answer.banned

    # --- plumbing ---------------------------------------------------------------------------------

    async def _per_tracker(self, keys: Iterable[str], call: Callable[[str, list[str]], Awaitable[None]]) -> None:
        """``call(tracker, its keys)`` for every tracker at once, at most TRACKER_MAX_KEYS keys a call."""
        batches: defaultdict[str, list[str]] = defaultdict(list)
        for key in keys:
            batches[self.tracker_of(key)].append(key)
        step = TRACKER_MAX_KEYS
        await asyncio.gather(
            *(call(url, batch[i : i + step]) for url, batch in batches.items() for i in range(0, len(batch), step))
        )

    async def _call(
        self,
        url: str,
        route: str,
        body: Callable[[], object],
        kind: type[T],
        check: Callable[[str, T], None] = lambda url, answer: None,
    ) -> T | None:
        """One call to tracker ``url``, again after a hello if it forgot this peer; None if it is
        down, fails, is slow or answers nonsense (``check`` raises: see the module docstring)."""
        if self.is_down(url):
            self.counts["skipped_down"] += 1
            return None

        async def call() -> T:
            try:
                answer = await self._endpoints[url].call("POST", route, body(), kind, max_bytes=MAX_ANSWER_BYTES)
            except PeerNotFound:
                self.counts["hellos_again"] += 1
                await self._say_hello(url)
                answer = await self._endpoints[url].call("POST", route, body(), kind, max_bytes=MAX_ANSWER_BYTES)
            check(url, answer)
            return answer

        return await self._guarded(url, call)

    async def _hello(self, url: str) -> None:
        await self._guarded(url, lambda: self._say_hello(url))

    async def _guarded(self, url: str, work: Callable[[], Awaitable[T]]) -> T | None:
        """``work()``'s result, or None if it failed (the tracker is down for ``down_s``) or
        took over ``timeout_s`` (the ``SLOW_CALLS``-th such call in a row: down too)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await work()
        except TimeoutError:
            self.counts["timeouts"] += 1
            self._slow[url] += 1
            if self._slow[url] >= SLOW_CALLS:
                self._mark_down(url)
            return None
        except BlobError:
            self._mark_down(url)
            return None
        self._slow.pop(url, None)
        self._health.clear(url, Reason.DOWN)
        return result

    async def _say_hello(self, url: str) -> None:
        hello = PeerHello(
            peer_id=self.peer_id,
            address=self.address,
            serve_key=self._serve_key.hex,
            uploads=self._uploads(),
            budget_bytes=self._budget,
        )
        answer = await self._endpoints[url].call("POST", "/v1/peers", hello, HelloResponse, max_bytes=MAX_ANSWER_BYTES)
        self._check_hello(url, answer)
        if answer.heartbeat_s < HEARTBEAT_MIN_S:
            logger.warning(
                "tracker %s asks for a heartbeat every %g s: sent every %g s", url, answer.heartbeat_s, HEARTBEAT_MIN_S
            )
        self._heartbeat_s = min(self._heartbeat_s, max(answer.heartbeat_s, HEARTBEAT_MIN_S))
        self.tenant = answer.tenant
        self.counts["hellos"] += 1
        if answer.registered:  # it knows none of this peer's copies
            self.counts["registered"] += 1
            self._forgotten(url)

    # --- what a tracker answers is checked, not trusted ---------------------------------------------

    def _nonsense(self, url: str, what: str) -> Unavailable:
        """The error that makes a nonsense answer a failed call (the tracker is marked down)."""
        self.counts["nonsense"] += 1
        logger.warning("tracker %s answered nonsense, treated as down: %s", url, what)
        return Unavailable(f"tracker {url} answered nonsense: {what}")

    def _check_hello(self, url: str, answer: HelloResponse) -> None:
        for name in ("heartbeat_s", "ttl_s"):
            value = getattr(answer, name)
            if not (math.isfinite(value) and value > 0):
                raise self._nonsense(url, f"{name} {value!r} is not a positive number of seconds")
        tenant = answer.tenant
        if not (0 < len(tenant) <= MAX_TENANT and tenant.isprintable()):
            raise self._nonsense(url, f"tenant {tenant[:MAX_TENANT]!r} is no tenant name")
        if self.tenant is not None and tenant != self.tenant:
            raise self._nonsense(url, f"tenant {tenant!r}, but this peer serves tenant {self.tenant!r}")

    def _checked_announced(self, url: str, answer: AnnounceResponse) -> None:
        if not (math.isfinite(answer.hold_s) and answer.hold_s >= 0):
            raise self._nonsense(url, f"hold_s {answer.hold_s!r} is not a number of seconds")
        if answer.hold_s > HOLD_MAX_S:
            logger.warning("tracker %s asks to hold copies %g s: held %g s", url, answer.hold_s, HOLD_MAX_S)

    def _checked_sources(self, url: str, sources: list[Source]) -> list[Source]:
        """The sources worth contacting, at most MAX_SOURCES (see the module docstring)."""
        kept: list[Source] = []
        seen = {self.address}
        bad: list[str] = []
        for source in sources:
            if len(kept) == MAX_SOURCES:
                break
            address = _source_address(source.address)
            if address is None or address in seen or not is_hex32(source.peer_id) or source.peer_id == self.peer_id:
                bad.append(source.address[:100])
            elif _TICKET.fullmatch(source.ticket) is None:
                bad.append(f"{address} (malformed ticket)")
            else:
                seen.add(address)
                kept.append(source if address == source.address else msgspec.structs.replace(source, address=address))
        if bad:
            self.counts["bad_sources"] += len(bad)
            logger.warning("tracker %s handed out %d bad sources, skipped: %s", url, len(bad), ", ".join(bad[:3]))
        return kept

    def _mark_down(self, url: str) -> None:
        self.counts["errors"] += 1
        self._slow.pop(url, None)
        self._health.mark(url, Reason.DOWN)

    async def _beat(self) -> None:
        """Heartbeat every tracker; a down one only once its ``down_s`` has passed."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            await asyncio.gather(*(self._hello(url) for url in self._endpoints if not self.is_down(url)))


def tracker_servers(
    session: aiohttp.ClientSession, urls: Sequence[str], token: str | None = None, *, timeout_s: float = TIMEOUT_S
) -> ConnectTrackers:
    """Connects a peer to the tracker servers at ``urls`` (a :class:`Trackers`)."""
    if not urls:
        raise ValueError("the peer tier needs at least one tracker URL")
    urls = tuple(urls)

    def connect(peer: Registration) -> Trackers:
        return Trackers(
            session,
            urls,
            token,
            peer_id=peer.peer_id,
            address=peer.address,
            serve_key=peer.serve_key,
            uploads=peer.uploads,
            forgotten=peer.forgotten,
            budget_bytes=peer.budget_bytes,
            timeout_s=timeout_s,
        )

    return connect


def _source_address(address: str) -> str | None:
    """``address`` as ``http://HOST:PORT`` (no trailing slash), or None if it is none."""
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError:  # a port out of range or not a number, a bad IPv6 literal
        return None
    plain = not (parts.username or parts.password or parts.query or parts.fragment) and parts.path in ("", "/")
    if parts.scheme != "http" or not parts.hostname or port is None or port == 0 or not plain:
        return None
    if not address.isascii() or not address.isprintable():
        return None
    return address.rstrip("/")
