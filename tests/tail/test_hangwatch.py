"""blobsdk.tail.health.HangWatch: the hang rule applied to a hedger's attempts in service, on a
fake clock.  An attempt is hung once it has been silent past its target's hang deadline and
the target has been silent as long; a race that finds one tells the others."""

from __future__ import annotations

import math
from dataclasses import dataclass

from blobsdk.config import HedgeConfig
from blobsdk.tail.health import HangWatch, Reason, TargetHealth

CONFIG = HedgeConfig(hang_min_ms=500, hang_max_ms=1000, hang_factor=8)


@dataclass
class Mark:
    serving: bool
    heard: float


@dataclass
class Entry:
    key: str
    waited: bool = False


class Race:
    def __init__(self) -> None:
        self.pokes = 0

    def poke(self) -> None:
        self.pokes += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(estimates: dict[str, float] | None = None) -> tuple[HangWatch, TargetHealth, Clock]:
    clock = Clock()
    health = TargetHealth(CONFIG, clock)
    return HangWatch(health, (estimates or {}).get), health, clock


def test_the_bound_is_the_earliest_attempt_in_service_plus_the_shortest_deadline() -> None:
    hangs, _, _ = watch()
    assert hangs.bound([Mark(True, 100.0), Mark(False, 90.0), Mark(True, 99.0)]) == 99.5
    assert hangs.bound([Mark(False, 90.0)]) == math.inf  # none in service: no look needed


def test_the_next_check_is_each_attempts_deadline_or_later_while_its_target_answers_others() -> None:
    hangs, health, clock = watch({"fast": 0.1})  # 8 x 0.1 s: a 0.8 s deadline; "slow": unmeasured, 1 s
    running = [(Mark(True, 100.0), Entry("fast")), (Mark(True, 100.0), Entry("slow"))]
    assert hangs.next_check(running) == 100.8
    clock.now = 100.5
    health.answered("fast")  # busy, not hung: it is silent long enough only at 101.3
    assert hangs.next_check(running) == 101.0  # so "slow" comes first now
    assert hangs.next_check([(Mark(True, 100.0), Entry("slow", waited=True)), (Mark(False, 100.0), Entry("fast"))]) is None


def test_an_attempt_past_its_deadline_at_a_silent_target_is_hung_and_the_other_races_are_told() -> None:
    hangs, health, clock = watch()
    finder, other = Race(), Race()
    hangs.races.update([finder, other])
    mark = Mark(True, 100.0)
    clock.now = 100.999
    assert not hangs.found_hung("a", mark, clock(), finder)
    clock.now = 101.0
    assert hangs.found_hung("a", mark, clock(), finder)
    assert health.has("a", Reason.HUNG) and hangs.is_hung("a")
    assert (finder.pokes, other.pokes) == (0, 1)
    assert not hangs.any_healthy(["a"]) and hangs.any_healthy(["a", "b"])


def test_an_attempt_queued_in_this_client_or_at_a_target_that_answers_others_is_not_hung() -> None:
    hangs, health, clock = watch()
    clock.now = 105.0
    assert not hangs.found_hung("a", Mark(False, 100.0), clock(), Race())  # never sent
    health.answered("a")
    assert not hangs.found_hung("a", Mark(True, 100.0), clock(), Race())  # another read's answer came now
    assert not health.has("a", Reason.HUNG)
