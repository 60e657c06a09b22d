"""The part of a peer that shares (DESIGN §2): what a client with trackers gives the other
clients of its tenant.  The peer tier (``blobsdk/tiers/_peer.py``) fetches; this serves.

:class:`Sharing` owns three things, all started by :meth:`Sharing.open` on the peer tier's
exit stack and stopped with it:

- the *serving cache*: the chunks this peer has told its trackers it holds, a byte-budgeted
  LRU (``[peer] budget_bytes``) of the very buffers the read path filled into L1, so a chunk
  in both costs its memory once;
- a :class:`~blobsdk.peer.server.PeerServer` that serves them (and the chunks this peer is
  still fetching, once they land) against the trackers' serve tickets;
- the announce loop, which tells the trackers what was filled, given up and evicted.

**Landing.** While the peer tier fetches a chunk (``expect``: an :class:`Expecting`),
children the trackers sent here wait for it at the server: they get it the moment it lands
(``landed``: a fetch from a peer, or a fill from L3/L4), and go on to their own children.
An :class:`Expecting` ends once, in ``landed`` or ``failed``, and is tied to the task that
fetches: a fetch that ends without landing (its tiers below failed, its reader was
cancelled) frees its waiters at once, with a miss (the server's 404), and the key is
announced as ``failed``, so the trackers send no more children here for it.  A child waits
at most ``wait_s``; a fetch that never ends frees its waiters then.

**Caching.** Every landed chunk is announced as filled; the trackers answer which to keep
(hot chunks on enough peers for the fan-out) and the rest leave the serving cache
``_DROP_GRACE_S`` later.  A chunk the LRU evicts is announced as evicting; if it is the last
copy others still ask for, the tracker says hold, and it is kept ``hold_s`` more outside the
budget (at most ``_MAX_HELD`` chunks) before it is announced as evicted.  Announcements are
batched every ``_ANNOUNCE_S``.  A tracker that forgot this peer (restarted) gets the serving
cache's keys announced again.  On close, every chunk still served is announced as evicted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import cachetools

from ..auth import ServeKey
from ..config import PeerConfig
from ..wire import ChunkRef
from .server import PeerServer
from .trackers import ConnectTrackers, Registration, TrackerClient

_ANNOUNCE_S = 0.05  # announcements wait this long to be batched
logger = logging.getLogger("blobsdk.peer")
_MAX_HELD = 1024  # chunks kept past the budget because a tracker said hold
# A fill the trackers said not to keep is served this much longer: children it was handed to
# before the announcement may still be on their way (dropping it at once cost the p2p
# benchmark ~17 404s an epoch).
_DROP_GRACE_S = 2.0


class ServingCache(cachetools.LRUCache[str, memoryview]):
    """The serving cache's LRU; what it evicts is collected for the next announcement."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(maxsize=budget_bytes, getsizeof=len)
        self.evicted: list[tuple[str, memoryview]] = []

    def popitem(self) -> tuple[str, memoryview]:
        key, raw = super().popitem()
        self.evicted.append((key, raw))
        return key, raw


class _Landing:
    """A chunk this peer is fetching: what its waiting children share (``lands``: the bytes,
    or None for a miss), since when, and how many fetches of this peer expect it."""

    __slots__ = ("fetches", "lands", "since")

    def __init__(self) -> None:
        self.lands: asyncio.Future[memoryview | None] = asyncio.get_running_loop().create_future()
        self.since = time.monotonic()
        self.fetches = 0

    def end(self, raw: memoryview | None) -> None:
        if not self.lands.done():
            self.lands.set_result(raw)

    @property
    def landed(self) -> bool:
        return self.lands.done() and self.lands.result() is not None


class Expecting:
    """One fetch of ``key`` by this peer, which children sent here wait for (made by
    :meth:`Sharing.expect`).  It ends once: :meth:`landed` hands them the bytes,
    :meth:`failed` a miss at once (unless another fetch of the key by this peer still runs);
    what comes after its end is ignored.  Given the task that fetches (``fetch``), it fails
    when that task ends first, so no way out of a fetch (an error, a cancellation, a return
    that does not land) leaves the children waiting."""

    __slots__ = ("_landing", "_sharing", "_task", "key")

    def __init__(self, sharing: Sharing, key: str, landing: _Landing, fetch: asyncio.Task[Any] | None) -> None:
        self._sharing, self.key = sharing, key
        self._landing: _Landing | None = landing
        self._task = fetch
        if fetch is not None:
            fetch.add_done_callback(self._fetch_ended)

    @property
    def ended(self) -> bool:
        return self._landing is None

    def landed(self, raw: memoryview) -> None:
        """The chunk's verified bytes are here (as :meth:`Sharing.landed`)."""
        if self._end() is not None:
            self._sharing.landed(self.key, raw)

    def failed(self) -> None:
        """This fetch ended without the chunk."""
        landing = self._end()
        if landing is not None:
            self._sharing._gave_up(self.key, landing)

    def _end(self) -> _Landing | None:
        """The landing, the first time; None once ended."""
        landing, self._landing = self._landing, None
        if landing is not None and self._task is not None:
            self._task.remove_done_callback(self._fetch_ended)
        return landing

    def _fetch_ended(self, task: asyncio.Task[Any]) -> None:
        self.failed()


class Sharing:
    """See the module docstring.  ``counts``: ``not_kept``, ``held``, ``reannounced``."""

    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        self.serve_key = ServeKey.generate()
        self.server = PeerServer(config, self.serve_key, self.lookup, self._tenant)
        self.serving = ServingCache(config.budget_bytes)
        self.counts: Counter[str] = Counter()
        self._trackers: TrackerClient | None = None
        self._held: dict[str, tuple[memoryview, float]] = {}  # key -> (bytes, held until)
        self._dropping: dict[str, float] = {}  # key the trackers said not to keep -> when it leaves
        self._landing: dict[str, _Landing] = {}  # keys this peer is fetching
        self._filled: set[str] = set()
        self._failed: set[str] = set()  # fetches given up, for the next announcement
        self._evicting: set[str] = set()
        self._evicted: set[str] = set()

    async def open(self, stack: AsyncExitStack, connect: ConnectTrackers, peer_id: str) -> TrackerClient:
        """Listen, register with the trackers (``connect``), start announcing; ``stack`` stops
        all of it (the waiters freed, the serving cache announced as evicted, the server closed)."""
        stack.push_async_callback(self.server.aclose)
        address = await self.server.start()
        me = Registration(
            peer_id=peer_id,
            address=address,
            serve_key=self.serve_key,
            budget_bytes=self.config.budget_bytes,
            uploads=lambda: self.server.uploads,
            forgotten=self._forgotten,
        )
        trackers = await stack.enter_async_context(connect(me))
        self._trackers = trackers
        stack.push_async_callback(self._goodbye, trackers)
        stack.callback(self._free_waiters)
        announcer = asyncio.create_task(self._announce_loop(trackers), name="blobsdk-peer-announcer")
        stack.push_async_callback(_cancel, announcer)
        return trackers

    def _tenant(self) -> str | None:
        return None if self._trackers is None else self._trackers.tenant

    def stats(self) -> dict[str, int | float]:
        """The serving cache's size and the server's counters (keys of the peer tier's stats)."""
        served = self.server.counts
        return {
            "serving_entries": len(self.serving) + len(self._held),
            "serving_bytes": self.serving.currsize + sum(raw.nbytes for raw, _ in list(self._held.values())),
            "uploads": served["uploads"],
            "bytes_served": served["bytes_served"],
            "uploads_refused": served["refused"],
            "uploads_missing": served["missing"],
        }

    # --- landing: what the peer tier fetches -------------------------------------------------------

    def expect(self, key: str, fetch: asyncio.Task[Any] | None = None) -> Expecting:
        """This peer is fetching ``key`` (in the task ``fetch``): children sent here meanwhile
        wait for it, until the :class:`Expecting` returned ends."""
        landing = self._landing.get(key)
        if landing is None:
            landing = self._landing[key] = _Landing()
        landing.fetches += 1
        self._failed.discard(key)  # this fetch is the trackers' news now
        return Expecting(self, key, landing, fetch)

    def landed(self, key: str, raw: memoryview) -> None:
        """``key``'s verified bytes are here: hand them to the waiting children, serve them
        from now on, and announce them."""
        landing = self._landing.pop(key, None)
        if landing is not None:
            landing.end(raw)
        self._failed.discard(key)
        if self.config.budget_bytes and key not in self.serving and raw.nbytes <= self.config.budget_bytes:
            self.serving[key] = raw
            self._filled.add(key)

    async def lookup(self, ref: ChunkRef) -> memoryview | None:
        """What the peer server serves for ``ref``: the serving cache's copy, or the chunk this
        peer is fetching once it lands (waiting at most ``wait_s``), or None."""
        raw = self.serving.get(ref.key)
        if raw is None and ref.key in self._held:
            raw = self._held[ref.key][0]
        if raw is not None:
            return raw
        landing = self._landing.get(ref.key)
        if landing is None:
            return None
        try:
            async with asyncio.timeout(self.config.wait_s):
                return await asyncio.shield(landing.lands)
        except TimeoutError:
            return None

    def _gave_up(self, key: str, landing: _Landing) -> None:
        """A fetch that expected ``landing`` ended without it: once no other fetch of it is
        left, its waiters get a miss now, and the trackers hear that this peer no longer
        fetches it (unless it landed meanwhile, or a fetch begun since runs)."""
        landing.fetches -= 1
        if landing.fetches > 0 or landing.landed:
            return
        if self._landing.get(key) is landing:
            del self._landing[key]
        landing.end(None)
        if key not in self._landing:
            self._failed.add(key)

    def _free_waiters(self) -> None:
        """Closing: the chunks still expected never land here."""
        for landing in self._landing.values():
            landing.end(None)
        self._landing.clear()

    # --- announcements ----------------------------------------------------------------------------

    async def _announce_loop(self, trackers: TrackerClient) -> None:
        while True:
            await asyncio.sleep(_ANNOUNCE_S)
            try:
                now = time.monotonic()
                self._expire(now)
                await self._announce(trackers, now)
            except Exception:  # a bug: logged, and the next round goes on
                logger.exception("peer tier: announcing to the trackers failed")

    def _expire(self, now: float) -> None:
        """Free the waiters of fetches still on after ``wait_s`` (those that ended without
        landing freed theirs already); drop the not-kept fills whose grace is over; let held
        chunks go when due."""
        for key, landing in list(self._landing.items()):
            if now - landing.since > self.config.wait_s:
                del self._landing[key]
                landing.end(None)
        for key, at in list(self._dropping.items()):
            if at <= now:
                del self._dropping[key]
                if self.serving.pop(key, None) is not None:
                    self.counts["not_kept"] += 1
        for key, (_, until) in list(self._held.items()):
            if until <= now:
                del self._held[key]
                self._evicted.add(key)

    async def _announce(self, trackers: TrackerClient, now: float) -> None:
        """Tell the trackers what was filled, given up, is being evicted and was evicted; act
        on what they answer (keep, hold)."""
        evicted_bytes = dict(self.serving.evicted)
        self.serving.evicted.clear()
        self._evicting.update(evicted_bytes)
        filled, evicting, evicted = self._filled, self._evicting - set(self.serving), self._evicted
        failed = {key for key in self._failed if key not in self.serving and key not in self._held}  # still its copy
        self._filled, self._failed, self._evicting, self._evicted = set(), set(), set(), set()
        if not (filled or failed or evicting or evicted):
            return
        answer = await trackers.announce(filled=filled, failed=failed, evicting=evicting, evicted=evicted)
        for key in filled - answer.keep:  # served a little longer: children may be on their way
            self._dropping.setdefault(key, now + _DROP_GRACE_S)
        for key in evicting & answer.hold:
            raw = evicted_bytes.get(key)
            if raw is not None and len(self._held) < _MAX_HELD:
                self._held[key] = (raw, now + answer.hold_s)
                self.counts["held"] += 1
            else:
                self._evicted.add(key)

    def _forgotten(self, url: str) -> None:
        """Tracker ``url`` knows none of this peer's copies (it restarted, or this peer aged out
        there): announce those it owns again, with the next announcement."""
        trackers = self._trackers
        if trackers is None:  # the first hellos: nothing served yet
            return
        keys = [key for key in (*self.serving, *self._held) if trackers.tracker_of(key) == url]
        self._filled.update(keys)
        self.counts["reannounced"] += len(keys)

    async def _goodbye(self, trackers: TrackerClient) -> None:
        """Closing: tell the trackers this peer holds nothing any more."""
        self._trackers = None
        gone = set(self.serving) | set(self._held) | self._evicting | self._evicted
        self.serving.clear()
        self._held.clear()
        if gone:
            await trackers.announce(evicted=gone)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
