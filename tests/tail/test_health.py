"""One health tracker per tier (blobsdk/tail/health.py): down, bad bytes and hung, each with
its own rule, on a fake clock."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from blobsdk.config import HedgeConfig, L3Config, RepairConfig
from blobsdk.sources import LocalBlockStore
from blobsdk.tail.health import Reason, TargetHealth
from blobsdk.tail.hedge import Hedger
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L3Tier, L4Tier

HANG = HedgeConfig(hang_factor=4.0, hang_min_ms=100, hang_max_ms=1000, probe_after_s=1.0, probe_max_s=3.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_bad_bytes_last_their_time_or_until_good_bytes(clock: Clock) -> None:
    health = TargetHealth(clock=clock, bad_bytes_seconds=60.0)
    health.mark("a", Reason.BAD_BYTES)
    health.mark("b", Reason.BAD_BYTES)
    clock.now = 59.0
    assert health.has("a", Reason.BAD_BYTES) and health.count(Reason.BAD_BYTES) == 2
    health.clear("b", Reason.BAD_BYTES)
    assert not health.has("b", Reason.BAD_BYTES)
    clock.now = 60.0
    assert not health.has("a", Reason.BAD_BYTES) and health.count(Reason.BAD_BYTES) == 0


def test_down_lasts_its_time_and_a_success_ends_it(clock: Clock) -> None:
    health = TargetHealth(clock=clock, down_seconds=5.0)
    health.mark("a", Reason.DOWN)
    health.mark("b", Reason.DOWN)
    clock.now = 4.9
    assert health.has("a", Reason.DOWN) and health.count(Reason.DOWN) == 2
    health.clear("a", Reason.DOWN)
    assert not health.has("a", Reason.DOWN) and health.count(Reason.DOWN) == 1
    health.mark("b", Reason.DOWN)  # failed again: down for another 5 s from now
    clock.now = 9.8
    assert health.has("b", Reason.DOWN)
    clock.now = 9.9
    assert not health.has("b", Reason.DOWN) and health.count(Reason.DOWN) == 0


def test_zero_seconds_down_is_never_down(clock: Clock) -> None:
    health = TargetHealth(clock=clock)
    health.mark("a", Reason.DOWN)
    health.mark("a", Reason.BAD_BYTES)
    assert not health.has("a", Reason.DOWN) and not health.has("a", Reason.BAD_BYTES)


def test_each_reason_is_cleared_only_by_its_own_evidence(clock: Clock) -> None:
    health = TargetHealth(HANG, clock, down_seconds=5.0, bad_bytes_seconds=60.0)
    for reason in Reason:
        health.mark("a", reason)
    assert [health.count(reason) for reason in Reason] == [1, 1, 1]
    health.answered("a")  # an attempt returned: not hung, but maybe still down or bad
    assert [health.has("a", reason) for reason in Reason] == [False, True, True]
    health.clear("a", Reason.DOWN)
    assert [health.has("a", reason) for reason in Reason] == [False, False, True]
    assert health.count(Reason.BAD_BYTES) == 1 and health.count(Reason.HUNG) == 0


def test_the_hang_deadline_is_the_factor_times_the_estimate_clamped() -> None:
    health = TargetHealth(HANG)
    assert [health.deadline(e) for e in (None, 0.001, 0.1, 1.0)] == [1.0, 0.1, 0.4, 1.0]


def test_silence_counts_from_the_last_answer(clock: Clock) -> None:
    health = TargetHealth(HANG, clock)
    assert health.silent_since("a", 0.5) == float("-inf") and health.silent_for("a", 0.5)
    clock.now = 10.0
    health.answered("a")
    assert health.silent_since("a", 0.5) == 10.5 and not health.silent_for("a", 0.5)
    clock.now = 10.5
    assert health.silent_for("a", 0.5)


def test_a_hung_target_goes_last_and_is_probed_one_read_at_a_time(clock: Clock) -> None:
    health = TargetHealth(HANG, clock)
    health.mark("a", Reason.HUNG)
    assert health.rank(["a", "b"], str) == (["b", "a"], None)
    clock.now = 1.0  # probe_after_s
    assert health.rank(["a", "b"], str) == (["a", "b"], "a")
    assert health.rank(["a", "b"], str) == (["b", "a"], None)  # one probe at a time
    health.probe_done("a")  # cancelled: no verdict
    assert health.rank(["a", "b"], str) == (["a", "b"], "a") and health.probes == 2


def test_a_probe_that_hangs_doubles_the_wait_up_to_probe_max(clock: Clock) -> None:
    health = TargetHealth(HANG, clock)
    health.mark("a", Reason.HUNG)
    health.mark("a", Reason.HUNG)  # another read's attempt crossed its deadline: no new wait
    waits = []
    for _ in range(3):
        begun = clock.now
        while health.rank(["a", "b"], str)[1] is None:
            clock.now += 0.5
        waits.append(clock.now - begun)
        health.mark("a", Reason.HUNG)  # the probe hung too
    assert waits == [1.0, 2.0, 3.0]
    health.answered("a")
    assert health.rank(["a", "b"], str) == (["a", "b"], None) and health.count(Reason.HUNG) == 0


def test_a_hedger_shares_its_tiers_tracker_made_with_its_config(clock: Clock) -> None:
    health = TargetHealth(HANG, clock)
    hedger = Hedger(HANG, clock=clock, health=health)
    health.mark("a", Reason.HUNG)
    assert hedger.health is health and hedger.stats()["targets_hung"] == 1
    with pytest.raises(ValueError, match=r"^a hedger and the health tracker it shares need the same HedgeConfig$"):
        Hedger(HedgeConfig(), health=health)


async def test_the_l3_and_l4_tiers_each_keep_one_tracker_their_hedger_shares(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"
    async with aiohttp.ClientSession() as session:
        l3 = L3Tier(session, [url], L3Config(down_seconds=5.0))
        assert l3.hedger.health is l3.health and l3.health.down_seconds == 5.0
        l3.health.mark(url, Reason.DOWN)
        assert l3.candidates("key") == [] and l3.extra_stats()["nodes_down"] == 1
        await l3.aclose()
    async with LocalBlockStore(tmp_path) as blocks:
        l4 = L4Tier(ReplicaReader(blocks, repair=RepairConfig(demote_seconds=7.0)))
        assert l4.hedger.health is l4.health and l4.health.bad_bytes_seconds == 7.0
        l4.health.mark(blocks.name, Reason.BAD_BYTES)
        assert l4.extra_stats()["replicas_demoted"] == 1
