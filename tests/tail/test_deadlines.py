"""blobsdk.tail.deadlines: one loop timer for every race of a hedger.  On an event loop whose
clock is virtual (tests/tiers/test_l4_slow_replica.py), so every time asserted is exact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from blobsdk.chunks.attempt import Attempt
from blobsdk.config import HedgeConfig
from blobsdk.tail.deadlines import Deadlines
from blobsdk.tail.hedge import Hedger
from tests.tiers.test_l4_slow_replica import VirtualTimeLoop

FIXED_10MS = HedgeConfig(min_delay_ms=10, max_delay_ms=10, budget_burst=1000)


class CountingLoop(VirtualTimeLoop):
    """Counts the loop timers a :class:`Deadlines` sets."""

    def __init__(self) -> None:
        super().__init__()
        self.shared_timers = 0

    def call_at(self, when: float, callback: Callable[..., object], *args: Any, context: Any = None) -> asyncio.TimerHandle:
        self.shared_timers += getattr(callback, "__func__", None) is Deadlines._fired
        return super().call_at(when, callback, *args, context=context)


def run_counting(test: Callable[[CountingLoop], Any]) -> Any:
    loop = CountingLoop()
    try:
        return loop.run_until_complete(test(loop))
    finally:
        loop.close()


def test_callbacks_run_at_their_times_in_order_and_a_cancelled_one_never() -> None:
    async def main(loop: CountingLoop) -> list[tuple[str, float]]:
        deadlines, ran = Deadlines(loop.time, loop), []
        for name, at in [("b", 0.010), ("a", 0.005), ("c", 0.020)]:
            deadlines.call_at(at, lambda name=name: ran.append((name, loop.time())))
        dropped = deadlines.call_at(0.007, lambda: ran.append(("dropped", loop.time())))
        deadlines.cancel(dropped)
        deadlines.cancel(dropped)  # twice: no harm
        assert deadlines.pending == 3
        await asyncio.sleep(0.030)
        assert deadlines.pending == 0 and not deadlines.armed
        return ran

    assert run_counting(main) == [("a", 0.005), ("b", 0.010), ("c", 0.020)]


def test_once_the_last_deadline_is_cancelled_the_loop_timer_fires_once_idle() -> None:
    async def main(loop: CountingLoop) -> list[str]:
        deadlines, ran = Deadlines(loop.time, loop), []
        first = deadlines.call_at(0.010, lambda: ran.append("first"))
        second = deadlines.call_at(0.020, lambda: ran.append("second"))
        deadlines.cancel(first)
        deadlines.cancel(second)
        assert deadlines.pending == 0 and deadlines.armed  # left to fire once, finding nothing
        await asyncio.sleep(0.011)
        assert not deadlines.armed and loop.shared_timers == 1
        return ran

    assert run_counting(main) == []


def test_soon_callbacks_of_one_turn_run_together_on_the_next() -> None:
    async def main(loop: CountingLoop) -> list[int]:
        deadlines, ran = Deadlines(loop.time, loop), []
        for i in range(3):
            deadlines.call_soon(lambda i=i: ran.append(i))
        assert ran == []
        await asyncio.sleep(0)
        return ran

    assert run_counting(main) == [0, 1, 2]


def test_a_failing_callback_goes_to_the_loops_handler_and_the_others_still_run() -> None:
    seen: list[str] = []

    async def main(loop: CountingLoop) -> list[str]:
        loop.set_exception_handler(lambda _, context: seen.append(context["message"]))
        deadlines, ran = Deadlines(loop.time, loop), []

        def boom() -> None:
            raise RuntimeError("boom")

        deadlines.call_at(0.001, boom)
        deadlines.call_at(0.001, lambda: ran.append("after"))
        await asyncio.sleep(0.002)
        return ran

    assert run_counting(main) == ["after"]
    assert seen == ["hedger deadline callback failed"]


def test_a_hedger_keeps_a_timer_per_event_loop() -> None:
    """A loop that stopped with a read still waiting leaves its deadline behind: a read on
    the next loop is hedged on that loop's own timer."""
    hedger = Hedger(FIXED_10MS)

    async def left_waiting() -> Deadlines:
        deadlines = hedger.deadlines()
        deadlines.call_at(hedger.clock() + 3600, lambda: None)
        return deadlines

    async def hedged_read() -> tuple[Deadlines, str]:
        return hedger.deadlines(), await hedger.run(["a", "b"], Replica(asyncio.get_running_loop()))

    first = asyncio.run(left_waiting())
    second, result = asyncio.run(hedged_read())
    assert result == "b" and hedger.stats()["hedges_sent"] == 1
    assert second is not first and first.pending == 1 and second.pending == 0


class Replica:
    """Attempts per candidate: ``a`` stalls (until cancelled), ``b`` answers in 1 ms; records
    the virtual time each attempt started."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.started: list[tuple[str, float]] = []

    async def __call__(self, name: str, attempt: Attempt) -> str:
        self.started.append((name, round(self.loop.time(), 6)))
        await asyncio.sleep(3600 if name == "a" else 0.001)
        return name


def test_a_shared_timer_hedges_each_race_at_its_own_virtual_time() -> None:
    async def main(loop: CountingLoop) -> tuple[list[str], list[tuple[str, float]], int]:
        hedger, replica = Hedger(FIXED_10MS, clock=loop.time), Replica(loop)

        async def read(after: float) -> str:
            await asyncio.sleep(after)
            return await hedger.run(["a", "b"], replica)

        results = await asyncio.gather(*(read(after) for after in (0.0, 0.003, 0.006)))
        assert hedger.deadlines().pending == 0
        return results, replica.started, hedger.stats()["hedges_sent"]

    results, started, hedges = run_counting(main)
    assert results == ["b", "b", "b"] and hedges == 3
    assert [at for name, at in started if name == "b"] == [0.010, 0.013, 0.016]  # each 10 ms after its primary


def test_a_batch_of_fast_reads_sets_the_shared_timer_once_and_leaves_none() -> None:
    async def main(loop: CountingLoop) -> tuple[int, int]:
        hedger, replica = Hedger(FIXED_10MS, clock=loop.time), Replica(loop)
        await asyncio.gather(*(hedger.run(["b", "a"], replica) for _ in range(100)))
        assert hedger.deadlines().pending == 0
        await asyncio.sleep(0.010)
        assert not hedger.deadlines().armed  # fired once, idle
        return loop.shared_timers, hedger.stats()["hedges_sent"]

    assert run_counting(main) == (1, 0)  # 100 races, one loop timer, no hedge


def test_reads_one_after_another_set_the_shared_timer_once_per_hedge_delay() -> None:
    async def main(loop: CountingLoop) -> tuple[float, int]:
        hedger, replica = Hedger(FIXED_10MS, clock=loop.time), Replica(loop)
        for _ in range(50):
            await hedger.run(["b", "a"], replica)  # 1 ms each
        return round(loop.time(), 6), loop.shared_timers

    took, timers = run_counting(main)
    assert took == 0.050
    assert timers <= 6  # was one per read: 50


def test_cancelled_reads_leave_no_deadline_and_no_timer() -> None:
    async def main(loop: CountingLoop) -> None:
        hedger, replica = Hedger(HedgeConfig(min_delay_ms=1000, max_delay_ms=1000), clock=loop.time), Replica(loop)
        reads = [asyncio.create_task(hedger.run(["a", "b"], replica)) for _ in range(10)]
        await asyncio.sleep(0.5)  # every primary stalled, none hedged yet
        assert hedger.deadlines().pending == 10 and hedger.deadlines().armed
        for read in reads:
            read.cancel()
        await asyncio.wait(reads)
        assert all(read.cancelled() for read in reads)
        assert hedger.deadlines().pending == 0
        await asyncio.sleep(1)
        assert not hedger.deadlines().armed  # its one firing found nothing to do
        assert [name for name, _ in replica.started] == ["a"] * 10

    run_counting(main)
