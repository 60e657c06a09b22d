"""The children waiting at a peer for a chunk it is fetching (blobsdk/peer/sharing.py,
``Sharing.expect`` and its :class:`Expecting`; the peer tier's fetch in blobsdk/tiers/_peer.py):
they get the bytes when they land, and a miss as soon as the fetch ends without them.

Every fetch here is ``wait_s`` = 3600: a waiter freed only by its wait would still be
waiting.  Whether a waiter is done is looked at after a bounded number of turns of the loop
(no timer involved), so the tests neither sleep nor depend on the machine's speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import aiohttp
import pytest

from blobsdk.config import PeerConfig
from blobsdk.errors import Unavailable
from blobsdk.peer.sharing import Sharing
from blobsdk.peer.trackers import Announced, Registration
from blobsdk.tiers import PeerTier
from blobsdk.wire import ChunkRef, Source
from tests.block_fixtures import pack
from tests.tiers.conformance import decode
from tests.tiers.fake_trackers import FakeTrackerClient, FakeTrackers

HOUR = PeerConfig(wait_s=3600.0)
RAW = bytes(range(256)) * 16
TURNS = 20  # far more turns of the loop than freeing a waiter takes (3 or 4)

Below = Callable[[], Awaitable[memoryview]]


async def settled(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is done within ``TURNS`` turns of the loop."""
    for _ in range(TURNS):
        if task.done():
            return True
        await asyncio.sleep(0)
    return task.done()


def chunk() -> tuple[ChunkRef, bytes]:
    (ref,) = pack([RAW]).refs
    return ref, RAW


async def walk(tier: PeerTier, ref: ChunkRef, below: Below) -> memoryview:
    """As the read path's fetch task of one chunk: the peer tier, then on its miss the tiers
    below (``below``), whose bytes are filled into it."""
    raw = await tier.fetch(ref, decode)
    if raw is None:
        raw = await below()
        await tier.fill(ref, raw)
    return raw


class Gate:
    """The tiers below the peer tier: they answer once ``go`` is set, with the chunk or with
    ``error``."""

    def __init__(self, raw: bytes, error: BaseException | None = None) -> None:
        self.raw, self.error = raw, error
        self.reading = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self) -> memoryview:
        self.reading.set()
        await self.go.wait()
        if self.error is not None:
            raise self.error
        return memoryview(bytearray(self.raw))


class SilentTrackers(FakeTrackers):
    """Trackers whose locate never answers (``asked`` is set once one is asked): a fetch
    waits on its peers until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    def connect(self, peer: Registration) -> FakeTrackerClient:
        return _Silent(self, peer)


class _Silent(FakeTrackerClient):
    async def locate(self, refs: Iterable[ChunkRef]) -> dict[str, list[Source]]:
        assert isinstance(self.trackers, SilentTrackers)
        self.trackers.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")


class Told:
    """A tracker client that records what it was told (``announce``) and keeps every fill."""

    def __init__(self) -> None:
        self.told: list[dict[str, set[str]]] = []

    async def announce(self, **lists: Iterable[str]) -> Announced:
        told = {name: set(keys) for name, keys in lists.items()}
        self.told.append(told)
        return Announced(keep=told["filled"])


@pytest.fixture
async def tier() -> AsyncIterator[PeerTier]:
    async with aiohttp.ClientSession() as session, PeerTier(session, FakeTrackers().connect, HOUR) as peer:
        yield peer


async def test_a_fetch_that_fails_below_frees_its_waiters_at_once(tier: PeerTier) -> None:
    ref, raw = chunk()
    below = Gate(raw, Unavailable("every replica failed"))
    fetching = asyncio.create_task(walk(tier, ref, below))
    await below.reading.wait()  # the peer tier missed: the chunk is expected from below
    waiter = asyncio.create_task(tier.sharing.lookup(ref))
    assert not await settled(waiter)  # it waits for the chunk to land
    below.go.set()
    with pytest.raises(Unavailable, match=r"^every replica failed$"):
        await fetching
    assert await settled(waiter) and waiter.result() is None  # a miss now, not in an hour
    assert await tier.sharing.lookup(ref) is None  # and for a child that comes later


@pytest.mark.parametrize("where", ["asking the peers", "reading below"])
async def test_a_fetch_whose_reader_is_cancelled_frees_its_waiters_at_once(where: str) -> None:
    ref, raw = chunk()
    silent = SilentTrackers()
    trackers = silent if where == "asking the peers" else FakeTrackers()
    below = Gate(raw)
    async with aiohttp.ClientSession() as session, PeerTier(session, trackers.connect, HOUR) as tier:
        fetching = asyncio.create_task(walk(tier, ref, below))
        await (silent.asked if where == "asking the peers" else below.reading).wait()
        waiter = asyncio.create_task(tier.sharing.lookup(ref))
        assert not await settled(waiter)
        fetching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetching
        assert fetching.cancelled()  # the cancellation went through, not swallowed
        assert await settled(waiter) and waiter.result() is None


async def test_a_fetch_after_a_failed_one_lands_for_its_own_waiters(tier: PeerTier) -> None:
    ref, raw = chunk()
    failing = Gate(raw, Unavailable("every replica failed"))
    failing.go.set()
    with pytest.raises(Unavailable):
        await walk(tier, ref, failing)
    below = Gate(raw)
    fetching = asyncio.create_task(walk(tier, ref, below))
    await below.reading.wait()
    waiter = asyncio.create_task(tier.sharing.lookup(ref))
    assert not await settled(waiter)  # a fresh expectation: waited for, not a miss
    below.go.set()
    assert bytes(await fetching) == raw
    assert await settled(waiter) and bytes(waiter.result()) == raw
    assert bytes(tier.sharing.serving[ref.key]) == raw


async def test_an_expecting_ends_once_and_a_key_two_fetches_expect_waits_for_both() -> None:
    ref, raw = chunk()
    sharing = Sharing(HOUR)
    first, second = sharing.expect(ref.key), sharing.expect(ref.key)
    waiter = asyncio.create_task(sharing.lookup(ref))
    first.failed()
    first.failed()  # ended already: nothing
    assert first.ended and not second.ended
    assert not await settled(waiter)  # the second fetch still runs
    second.landed(memoryview(raw))
    first.landed(memoryview(b"ignored"))
    assert await settled(waiter) and bytes(waiter.result()) == raw
    assert bytes(sharing.serving[ref.key]) == raw


async def test_a_given_up_key_is_announced_failed_unless_a_copy_landed_since() -> None:
    ref, _ = chunk()
    other, slow, landed = pack([b"other", b"slow", b"landed"]).refs
    sharing = Sharing(PeerConfig(wait_s=HOUR.wait_s, budget_bytes=0))  # it keeps no copy: none is announced filled
    trackers = Told()
    sharing.expect(ref.key).failed()
    sharing.expect(other.key).failed()
    sharing.landed(other.key, memoryview(b"other"))  # fetched again since: not given up
    slow_fetch = sharing.expect(slow.key)
    sharing._expire(time.monotonic() + HOUR.wait_s + 1)  # its waiters were freed after wait_s ...
    slow_fetch.failed()  # ... and then it failed
    landed_fetch = sharing.expect(landed.key)
    sharing.landed(landed.key, memoryview(b"landed"))  # a fill from below landed it ...
    landed_fetch.failed()  # ... before its fetch's task ended
    await sharing._announce(trackers, 0.0)  # type: ignore[arg-type]
    assert trackers.told == [{"filled": set(), "failed": {ref.key, slow.key}, "evicting": set(), "evicted": set()}]
