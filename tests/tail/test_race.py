"""blobsdk.tail.race: a race looks at its attempts at other times than its hedge's deadline,
and no such early look may send the hedge.  Each case on an event loop whose clock is
virtual (tests/tiers/test_l4_slow_replica.py), so every time asserted is exact: the hedge
goes out at its attempt's start plus its delay, not at the early look."""

from __future__ import annotations

import asyncio

import pytest

from blobsdk.chunks.attempt import Attempt
from blobsdk.config import HedgeConfig
from blobsdk.errors import HedgeExhausted, Unavailable
from blobsdk.tail.hedge import Hedger
from tests.tiers.test_l4_slow_replica import run_virtual

HEDGE_10MS = HedgeConfig(min_delay_ms=10, max_delay_ms=10)
HEDGE_10MS_HUNG_20MS = HedgeConfig(min_delay_ms=10, max_delay_ms=10, hang_min_ms=20, hang_max_ms=20)
HEDGE_50MS_HUNG_20MS = HedgeConfig(min_delay_ms=50, max_delay_ms=50, hang_min_ms=20, hang_max_ms=20)
STALL = 3600.0


class Targets:
    """Attempts by target: each one waits its target's seconds (STALL: until cancelled), then
    answers, or raises the target's error; records the virtual time each attempt started."""

    def __init__(self, loop: asyncio.AbstractEventLoop, **behaviour: float | Exception) -> None:
        self.loop = loop
        self.behaviour = behaviour
        self.started: list[tuple[str, float]] = []

    async def __call__(self, name: str, attempt: Attempt) -> str:
        self.started.append((name, round(self.loop.time(), 6)))
        what = self.behaviour[name]
        if isinstance(what, Exception):
            await asyncio.sleep(0.006)
            raise what
        await asyncio.sleep(what)
        return name


def test_after_a_failover_the_first_attempts_deadline_sends_no_hedge_before_the_new_attempts_delay() -> None:
    """``a`` fails at 6 ms, so ``b`` starts then, its hedge due at 16 ms; the deadline set for
    ``a``'s hedge (10 ms) still fires, during ``b``'s delay, and must only look."""

    async def main() -> tuple[str, list[tuple[str, float]], dict[str, int]]:
        loop = asyncio.get_running_loop()
        hedger = Hedger(HEDGE_10MS, clock=loop.time)
        targets = Targets(loop, a=Unavailable("a is down"), b=STALL, c=0.001)
        result = await hedger.run(["a", "b", "c"], targets)
        return result, targets.started, hedger.stats()

    result, started, stats = run_virtual(main())
    assert result == "c"
    assert started == [("a", 0.0), ("b", 0.006), ("c", 0.016)]  # not at 0.010
    assert (stats["failovers"], stats["hedges_sent"], stats["hedges_won"]) == (1, 1, 1)


def test_a_poke_from_a_race_that_found_another_target_hung_sends_no_hedge_before_its_delay() -> None:
    """A lone read of ``x`` (begun at 0) finds ``x`` hung at 20 ms and pokes every other race
    of the hedger.  This race began at 15 ms on ``a``, its hedge due at 25 ms: the poke at
    20 ms looks (``a`` is not hung: 5 ms in service) and sends nothing."""

    async def main() -> tuple[str, list[tuple[str, float]], dict[str, int]]:
        loop = asyncio.get_running_loop()
        hedger = Hedger(HEDGE_10MS_HUNG_20MS, clock=loop.time)
        targets = Targets(loop, x=STALL, a=STALL, b=0.001)

        async def finds_x_hung() -> None:
            with pytest.raises(HedgeExhausted, match=r"^all 1 candidates failed: x: Unavailable: x: no answer within"):
                await hedger.run(["x"], targets)

        async def poked() -> str:
            await asyncio.sleep(0.015)
            return await hedger.run(["a", "b"], targets)

        _, result = await asyncio.gather(finds_x_hung(), poked())
        return result, targets.started, hedger.stats()

    result, started, stats = run_virtual(main())
    assert result == "b"
    assert started == [("x", 0.0), ("a", 0.015), ("b", 0.025)]  # not at 0.020, the poke
    assert (stats["targets_hung"], stats["hung_failovers"], stats["hedges_sent"]) == (1, 1, 1)


def test_a_hang_check_due_before_the_hedge_sends_no_hedge_before_its_delay() -> None:
    """The hedge delay (50 ms) is longer than the hang deadline (20 ms), so the race's first
    look is the hang check, at 20 ms in service.  ``a`` answers other reads every 7 ms, so it
    is busy, not hung: that look, and every later one, sends no hedge until 50 ms."""

    async def main() -> tuple[str, list[tuple[str, float]], dict[str, int]]:
        loop = asyncio.get_running_loop()
        hedger = Hedger(HEDGE_50MS_HUNG_20MS, clock=loop.time)
        busy = Targets(loop, a=0.007)
        targets = Targets(loop, a=STALL, b=0.001)
        done = asyncio.Event()

        async def others_answered_by_a() -> None:
            await asyncio.sleep(0.002)
            while not done.is_set():
                assert await hedger.run(["a"], busy) == "a"

        async def late_at_a() -> str:
            await asyncio.sleep(0.010)
            try:
                return await hedger.run(["a", "b"], targets)
            finally:
                done.set()

        _, result = await asyncio.gather(others_answered_by_a(), late_at_a())
        return result, targets.started, hedger.stats()

    result, started, stats = run_virtual(main())
    assert result == "b"
    assert started == [("a", 0.01), ("b", 0.06)]  # not at 0.030, the first hang check
    assert (stats["hung_failovers"], stats["targets_hung"], stats["hedges_sent"]) == (0, 0, 1)


class Trickle:
    """Attempts whose reply arrives slowly but steadily, as a body on a full link does: bytes
    every ``every`` seconds (``attempt.receiving()``), the whole after ``total``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float, total: float) -> None:
        self.loop, self.every, self.total = loop, every, total
        self.started: list[tuple[str, float]] = []

    async def __call__(self, name: str, attempt: Attempt) -> str:
        self.started.append((name, round(self.loop.time(), 6)))
        end = self.loop.time() + self.total
        while self.loop.time() < end:
            await asyncio.sleep(self.every)
            attempt.receiving()
        return name


HEDGE_10S_HUNG_1S = HedgeConfig(min_delay_ms=10_000, max_delay_ms=10_000, hang_min_ms=1000, hang_max_ms=1000)


def test_a_reply_arriving_slowly_but_steadily_is_no_hang() -> None:
    """A 4 MiB body at 12 MB/s takes 0.35 s alone and seconds behind its neighbours on a full
    link: bytes arrive every 0.3 s for 3 s, three times the 1 s hang deadline.  The deadline is
    one for the first byte and each silence after it, so the attempt is neither failed over
    (which would read the chunk again from the other replica, on the same full links) nor is
    its target marked hung."""

    async def main() -> tuple[str, list[tuple[str, float]], dict[str, int]]:
        loop = asyncio.get_running_loop()
        hedger = Hedger(HEDGE_10S_HUNG_1S, clock=loop.time)
        targets = Trickle(loop, every=0.3, total=3.0)
        result = await hedger.run(["a", "b"], targets)
        return result, targets.started, hedger.stats()

    result, started, stats = run_virtual(main())
    assert result == "a"
    assert started == [("a", 0.0)]
    assert (stats["hung_failovers"], stats["targets_hung"], stats["hedges_sent"]) == (0, 0, 0)


def test_a_reply_that_falls_silent_after_its_first_bytes_is_hung_one_deadline_later() -> None:
    """Bytes count only while they come: ``a`` sends for 0.6 s, then stops; it is hung at its
    last bytes plus the 1 s deadline, and the read fails over to ``b``."""

    async def main() -> tuple[str, list[tuple[str, float]], dict[str, int]]:
        loop = asyncio.get_running_loop()
        hedger = Hedger(HEDGE_10S_HUNG_1S, clock=loop.time)
        trickle = Trickle(loop, every=0.3, total=0.6)
        fast = Targets(loop, b=0.001)

        async def attempt(name: str, mark: Attempt) -> str:
            if name == "b":
                return await fast(name, mark)
            await trickle(name, mark)
            await asyncio.sleep(STALL)
            return name

        result = await hedger.run(["a", "b"], attempt)
        return result, fast.started, hedger.stats()

    result, started, stats = run_virtual(main())
    assert result == "b"
    assert started == [("b", 1.6)]
    assert (stats["hung_failovers"], stats["targets_hung"], stats["hedges_sent"]) == (1, 1, 0)
