"""How an L3 prefetch (blobsdk/read/prefetch.py) asks the nodes how far their jobs are: at
once, then after waits that double up to a cap, so a long job costs its node and its client
one request a second, not ten."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from blobsdk.read.prefetch import POLL_MAX_S, POLL_S, Prefetcher, _Tally
from blobsdk.tiers import HydrateJob, L3Tier
from blobsdk.wire import HydrateStatus


@dataclass
class NodeOfJobsThatRun:
    """An L3 tier whose one node says "running" for ``asks_running`` asks, then "done"."""

    asks_running: int
    asks: int = 0

    async def hydrate_status(self, job: HydrateJob) -> HydrateStatus:
        self.asks += 1
        state = "running" if self.asks <= self.asks_running else "done"
        return HydrateStatus(job_id=job.job_id or "", state=state, total=job.total, done=0 if state == "running" else job.total)


@dataclass
class Waits:
    """A sleep that only records how long it was asked to wait."""

    seen: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.seen.append(seconds)


@dataclass
class NoTiers:
    tiers: tuple[()] = ()


async def test_a_long_l3_prefetch_is_polled_less_and_less_often_down_to_the_cap() -> None:
    node, waits = NodeOfJobsThatRun(asks_running=8), Waits()
    prefetcher = Prefetcher(cast(Any, None), cast(Any, NoTiers()), 1, {}, sleep=waits)
    prefetcher.l3 = cast(L3Tier, node)
    (status,) = await prefetcher._poll([HydrateJob("http://node", "job", ())], _Tally())
    assert status.state == "done" and node.asks == 9  # at once, then after each wait
    assert waits.seen == [POLL_S, 2 * POLL_S, 4 * POLL_S, 8 * POLL_S, POLL_MAX_S, POLL_MAX_S, POLL_MAX_S, POLL_MAX_S]
    assert (POLL_S, POLL_MAX_S) == (0.1, 1.0)


async def test_a_finished_l3_prefetch_is_asked_once_and_never_waits() -> None:
    node, waits = NodeOfJobsThatRun(asks_running=0), Waits()
    prefetcher = Prefetcher(cast(Any, None), cast(Any, NoTiers()), 1, {}, sleep=waits)
    prefetcher.l3 = cast(L3Tier, node)
    jobs = [HydrateJob("http://a", "1", ()), HydrateJob("http://b", "2", ())]
    assert [s.state for s in await prefetcher._poll(jobs, _Tally())] == ["done", "done"]
    assert node.asks == 2 and waits.seen == []
