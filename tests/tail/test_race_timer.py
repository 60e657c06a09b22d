"""blobsdk.tail.deadlines.Timer: one race's deadline in its hedger's shared timer, and its
first look.  On an event loop whose clock is virtual, so every time asserted is exact."""

from __future__ import annotations

import asyncio

from blobsdk.tail.deadlines import Deadlines, Timer
from tests.tiers.test_l4_slow_replica import run_virtual


class Owner:
    """A race, as its timer calls it: records when."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[str, float]] = []

    def schedule(self) -> None:
        self.calls.append(("schedule", self.loop.time()))

    def look(self) -> None:
        self.calls.append(("look", self.loop.time()))


def test_a_first_look_asked_twice_in_a_turn_runs_once_on_the_next_turn() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        owner = Owner(loop)
        timer = Timer(Deadlines(loop.time, loop), owner)
        timer.first_look()
        timer.first_look()
        assert timer.asked and owner.calls == []
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not timer.asked
        timer.first_look()  # asked again once it ran: runs again
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return owner.calls

    assert run_virtual(main()) == [("schedule", 0.0), ("schedule", 0.0)]


def test_a_deadline_set_for_earlier_is_kept_and_a_later_one_is_replaced_by_an_earlier() -> None:
    async def main() -> tuple[list[tuple[str, float]], int]:
        loop = asyncio.get_running_loop()
        owner, deadlines = Owner(loop), Deadlines(loop.time, loop)
        timer = Timer(deadlines, owner)
        timer.set(0.020)
        timer.set(0.030)  # later: kept at 0.020
        timer.set(0.010)  # earlier: moved
        pending = deadlines.pending
        await asyncio.sleep(0.050)
        return owner.calls, pending

    calls, pending = run_virtual(main())
    assert pending == 1
    assert calls == [("look", 0.010)]


def test_once_closed_a_timer_calls_its_owner_no_more() -> None:
    async def main() -> tuple[list[tuple[str, float]], int]:
        loop = asyncio.get_running_loop()
        owner, deadlines = Owner(loop), Deadlines(loop.time, loop)
        timer = Timer(deadlines, owner)
        timer.set(0.010)
        timer.first_look()
        timer.close()
        timer.close()  # twice: no harm
        await asyncio.sleep(0.050)
        return owner.calls, deadlines.pending

    assert run_virtual(main()) == ([], 0)
