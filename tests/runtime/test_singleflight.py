"""blobsdk.runtime.singleflight: one task per key, shared; cancelled when its last waiter leaves."""

from __future__ import annotations

import asyncio

import pytest

from blobsdk.runtime.singleflight import SingleFlight


class Work:
    """A coroutine factory that counts its runs and holds each until ``release`` is set."""

    def __init__(self, value: str = "v") -> None:
        self.value = value
        self.runs = 0
        self.cancelled = 0
        self.release = asyncio.Event()

    async def __call__(self) -> str:
        self.runs += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self.value


async def test_concurrent_callers_of_a_key_share_one_run() -> None:
    flights: SingleFlight[str] = SingleFlight()
    work = Work()
    callers = [asyncio.create_task(flights.run("k", work)) for _ in range(5)]
    await asyncio.sleep(0)
    assert len(flights) == 1
    work.release.set()
    assert await asyncio.gather(*callers) == [("v", 5)] * 5
    assert work.runs == 1 and len(flights) == 0


async def test_a_lone_caller_is_told_it_alone_shared_the_result() -> None:
    flights: SingleFlight[str] = SingleFlight()
    work = Work()
    work.release.set()
    assert await flights.run("k", work) == ("v", 1)


async def test_an_error_reaches_every_caller_and_the_next_call_runs_afresh() -> None:
    flights: SingleFlight[str] = SingleFlight()
    runs = 0

    async def failing() -> str:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0)
        raise ValueError("boom")

    callers = [asyncio.create_task(flights.run("k", failing)) for _ in range(3)]
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert [str(r) for r in results] == ["boom"] * 3 and runs == 1
    with pytest.raises(ValueError, match=r"^boom$"):
        await flights.run("k", failing)
    assert runs == 2


async def test_the_work_goes_on_while_anyone_waits() -> None:
    flights: SingleFlight[str] = SingleFlight()
    work = Work()
    leaving = asyncio.create_task(flights.run("k", work))
    staying = asyncio.create_task(flights.run("k", work))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    work.release.set()
    assert await staying == ("v", 2)
    assert work.cancelled == 0


async def test_the_last_waiter_leaving_cancels_the_work_and_unlists_it_at_once() -> None:
    flights: SingleFlight[str] = SingleFlight()
    work = Work()
    caller = asyncio.create_task(flights.run("k", work))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert len(flights) == 0  # a caller arriving now must not join the dying task
    fresh = Work("fresh")
    fresh.release.set()
    assert await flights.run("k", fresh) == ("fresh", 1)
    await asyncio.sleep(0)
    assert work.cancelled == 1


async def test_aclose_cancels_and_awaits_every_task_in_flight() -> None:
    flights: SingleFlight[str] = SingleFlight()
    work = Work()
    callers = [asyncio.create_task(flights.run(key, work)) for key in ("a", "b")]
    while work.runs < 2:
        await asyncio.sleep(0)
    await flights.aclose()
    assert work.cancelled == 2
    for caller in callers:
        with pytest.raises(asyncio.CancelledError):
            await caller


async def test_aclose_waits_for_work_still_unwinding_after_its_last_waiter_left() -> None:
    flights: SingleFlight[str] = SingleFlight()
    unwound = asyncio.Event()

    async def slow_to_unwind() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)  # cleanup that awaits, e.g. closing a connection
            unwound.set()
        return "never"

    caller = asyncio.create_task(flights.run("k", slow_to_unwind))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert len(flights) == 0
    await flights.aclose()
    assert unwound.is_set()
