"""The peer tier asks its tracker once more when every source it was given failed with
budget left (blobsdk/tiers/_peer.py, ``_from_peers``): a real cluster and tracker, as
tests/tiers/test_peer.py (whose fixtures these are)."""

from __future__ import annotations

import asyncio

from blobsdk.config import PeerConfig
from tests.tiers.test_peer import Swarm, cluster, copies, hits, peer_of, swarm, until, written

__all__ = ["cluster", "swarm"]  # the fixtures, shared with test_peer.py


def fetchers(swarm: Swarm) -> int:
    hot: list[dict[str, int]] = swarm.tracker.stats()["hot"]  # type: ignore[assignment]
    return sum(entry["fetchers"] for entry in hot)


async def test_a_child_whose_sources_went_stale_asks_again_and_gets_a_copy_made_since(swarm: Swarm) -> None:
    # swarm_sim's churn run: a child waited seconds at a source that died, and the other
    # sources it had been given dropped the chunk meanwhile; each such fetch read the origin
    # while hundreds of peers held the chunk.
    writer = await swarm.client()
    data = await written(writer, "/p/again", 1)
    (ref,) = (await writer.plan("/p/again")).chunks
    later = await swarm.client()
    assert await later.get("/p/again") == data  # it holds the chunk ...
    await until(lambda: copies(swarm.tracker) == 1)
    holder = peer_of(later)
    assert holder._trackers is not None
    await holder._trackers.announce(evicted=[ref.key])  # ... but the tracker does not know it yet
    stuck = peer_of(await swarm.client(PeerConfig(wait_s=30.0)))
    stuck.sharing.expect(ref.key)  # fetching it, never to land
    assert stuck._trackers is not None and await stuck._trackers.locate([ref]) == {ref.key: []}
    child = await swarm.client(PeerConfig(wait_s=30.0))  # a budget no loaded machine spends here
    reading = asyncio.create_task(child.get("/p/again"))
    await until(lambda: fetchers(swarm) == 2)  # the child was sent to the stuck fetcher, its only source
    holder.sharing._forgotten(swarm.url)  # now the holder announces its copy
    await until(lambda: copies(swarm.tracker) == 1)
    stuck.sharing._free_waiters()  # the stuck fetch gives up: the child gets a 404
    assert await reading == data
    assert hits(child) == {"peer": 1, "l4": 0}  # before: the origin
    stats = child.stats()["peer"]
    assert stats["asked_again"] == 1 and stats["errors"] == 0 and stuck.extra_stats()["uploads_missing"] == 1


async def test_a_child_whose_sources_were_only_busy_does_not_ask_again(swarm: Swarm) -> None:
    # A 429 says the source has the chunk: the list is not stale, and asking again named other
    # busy holders (swarm_sim's n100_slots_held run: 170 origin reads instead of 160).
    writer = await swarm.client()
    data = await written(writer, "/p/busy", 1)
    holder = await swarm.client()
    assert await holder.get("/p/busy") == data
    await until(lambda: copies(swarm.tracker) == 1)
    server = peer_of(holder).sharing.server
    server.uploads = peer_of(holder).config.max_uploads  # as if that many were sending
    child = await swarm.client(PeerConfig(fetch_budget_s=0.5))  # tries it again, then its budget is out
    assert await child.get("/p/busy") == data
    server.uploads = 0
    stats = child.stats()["peer"]
    assert hits(child) == {"peer": 0, "l4": 1} and stats["asked_again"] == 0 and stats["busy_waits"] >= 1
    assert holder.stats()["peer"]["uploads_refused"] == stats["busy_waits"] + 1
