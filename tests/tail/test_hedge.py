"""blobsdk.tail.hedge: hedged requests with adaptive delays, a budget, failover and clean
cancellation.  Attempts are in-loop fakes; delays are a few ms so the file runs in ~1 s."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import msgspec
import pytest
import xxhash

from blobsdk.chunks.codec import decode_chunk
from blobsdk.errors import BadCopy, BadRequest, BlockNotFound, HedgeExhausted, Unavailable
from blobsdk.tail.health import Reason
from blobsdk.tail.hedge import (
    Attempt,
    HedgeBudget,
    HedgeConfig,
    Hedger,
    LatencyTracker,
    is_failover,
)
from blobsdk.wire import ChunkRef

FIXED_10MS = HedgeConfig(min_delay_ms=10, max_delay_ms=10)  # hedge exactly 10 ms after a start
NEVER_HEDGE = HedgeConfig(min_delay_ms=1000, max_delay_ms=1000, budget_burst=0)


class Fakes:
    """Attempts per candidate name: ``ok`` returns, ``stall`` waits forever, ``fail`` raises.
    Records which candidates started and which saw their cancellation."""

    def __init__(self, **behaviour: object) -> None:
        self.behaviour = behaviour
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.forever = asyncio.Event()  # never set

    async def __call__(self, name: str, attempt: Attempt | None = None) -> str:
        self.started.append(name)
        what = self.behaviour[name]
        try:
            if what == "stall":
                await self.forever.wait()
            elif isinstance(what, (int, float)):
                await asyncio.sleep(what)
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        if isinstance(what, Exception):
            raise what
        return f"from {name}"


@asynccontextmanager
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Everything started inside finished, within 2 s (a hang would be a failed cancel)."""
    before = asyncio.all_tasks()
    async with asyncio.timeout(2):
        yield
    assert asyncio.all_tasks() == before


async def on_the_brink(fakes: Fakes, now: list[float], brink: float) -> None:
    """Once the primary started, set the fake clock ``now`` to just short of ``brink`` (the
    hedger's clock time of its next move) and let the race look at it a few times."""
    while not fakes.started:
        await asyncio.sleep(0.001)
    now[0] = brink - 0.0001
    await asyncio.sleep(0.05)  # a race waits out its first real delay, then looks every 0.1 ms


async def timed(coro: Awaitable[str]) -> tuple[str, float]:
    begun = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - begun


async def test_fast_primary_wins_without_a_hedge() -> None:
    hedger, fakes = Hedger(FIXED_10MS), Fakes(a="ok", b="ok")
    assert await hedger.run(["a", "b"], fakes) == "from a"
    assert fakes.started == ["a"]
    assert hedger.stats() == {
        "primaries": 1,
        "hedges_sent": 0,
        "hedges_won": 0,
        "budget_exhausted": 0,
        "failovers": 0,
        "hedges_deferred": 0,
        "hung_failovers": 0,
        "targets_hung": 0,
        "probes": 0,
    }


async def test_stalled_primary_is_hedged_after_the_delay_and_cancelled() -> None:
    """On a fake clock: the hedge goes out when the clock reaches the 10 ms delay, not before."""
    now = [0.0]
    hedger, fakes = Hedger(FIXED_10MS, clock=lambda: now[0]), Fakes(a="stall", b="ok")
    async with no_leftover_tasks():
        run = asyncio.create_task(hedger.run(["a", "b"], fakes))
        await on_the_brink(fakes, now, 0.010)
        assert fakes.started == ["a"]  # not hedged before the delay
        now[0] = 0.010
        result = await run
    assert result == "from b"
    assert fakes.cancelled == ["a"]
    assert hedger.stats()["hedges_sent"] == 1 and hedger.stats()["hedges_won"] == 1


async def test_loser_releases_its_connection() -> None:
    released: list[str] = []

    @asynccontextmanager
    async def connection(name: str) -> AsyncIterator[None]:
        try:
            yield
        finally:
            released.append(name)

    fakes = Fakes(a="stall", b="ok")

    async def attempt(name: str, _: Attempt) -> str:
        async with connection(name):
            return await fakes(name)

    async with no_leftover_tasks():
        assert await Hedger(FIXED_10MS).run(["a", "b"], attempt) == "from b"
    assert sorted(released) == ["a", "b"]  # the loser's __aexit__ ran before run returned


async def test_errors_fail_over_at_once_without_spending_budget() -> None:
    hedger = Hedger(NEVER_HEDGE)
    fakes = Fakes(a=Unavailable("down"), b=BlockNotFound("gone"), c="ok")
    result, seconds = await timed(hedger.run(["a", "b", "c"], fakes))
    assert result == "from c"
    assert seconds < 0.5  # never waited for the 1 s hedge delay
    stats = hedger.stats()
    assert stats["failovers"] == 2 and stats["hedges_sent"] == 0 and stats["budget_exhausted"] == 0


async def test_a_failed_hedge_fails_over_to_the_next_candidate() -> None:
    hedger, fakes = Hedger(FIXED_10MS), Fakes(a="stall", b=Unavailable("down"), c="ok")
    async with no_leftover_tasks():
        assert await hedger.run(["a", "b", "c"], fakes) == "from c"
    assert fakes.started == ["a", "b", "c"] and fakes.cancelled == ["a"]
    assert hedger.stats()["hedges_sent"] == 1 and hedger.stats()["failovers"] == 1


async def test_every_candidate_failing_raises_hedge_exhausted_with_each_failure() -> None:
    errors = {"a": Unavailable("a down"), "b": BadCopy("b bad"), "c": BlockNotFound("c gone")}
    with pytest.raises(HedgeExhausted) as caught:
        await Hedger(FIXED_10MS).run(list(errors), Fakes(**errors))
    assert caught.value.failures == list(errors.items())
    assert isinstance(caught.value, Unavailable) and caught.value.__cause__ is errors["c"]
    assert "a down" in str(caught.value) and "c gone" in str(caught.value)


async def test_no_candidates_raises_hedge_exhausted() -> None:
    with pytest.raises(HedgeExhausted) as caught:
        await Hedger().run([], Fakes())
    assert caught.value.failures == []


@pytest.mark.parametrize("error", [BadRequest("malformed"), TypeError("a bug")])
async def test_an_error_that_is_not_a_failover_is_raised_at_once(error: Exception) -> None:
    fakes = Fakes(a="stall", b=error, c="ok")
    async with no_leftover_tasks():
        with pytest.raises(type(error)) as caught:
            await Hedger(FIXED_10MS).run(["a", "b", "c"], fakes)
    assert caught.value is error
    assert fakes.started == ["a", "b"] and fakes.cancelled == ["a"]


def test_failover_errors_are_blob_errors_about_one_candidate() -> None:
    assert is_failover(Unavailable()) and is_failover(BadCopy()) and is_failover(BlockNotFound())
    assert not is_failover(BadRequest()) and not is_failover(ValueError()) and not is_failover(OSError())


async def test_a_bad_copy_fails_over_and_the_good_copy_is_returned() -> None:
    raw = b"chunk bytes " * 100
    ref = ChunkRef(block_id="0" * 32, offset=0, length=len(raw), raw_length=len(raw), checksum=xxhash.xxh3_64_intdigest(raw))
    copies = {"r0": bytearray(raw), "r1": bytearray(raw)}
    copies["r0"][7] ^= 0xFF

    async def read_and_verify(replica: str, _: Attempt) -> bytes:
        buf = memoryview(bytearray(copies[replica]))  # a fresh buffer per attempt
        return bytes(decode_chunk(ref, buf))

    hedger = Hedger(FIXED_10MS)
    assert await hedger.run(["r0", "r1"], read_and_verify) == raw
    assert hedger.stats()["failovers"] == 1


async def test_the_budget_caps_hedges_when_every_primary_is_slow() -> None:
    config = HedgeConfig(min_delay_ms=0, max_delay_ms=0)  # every primary "too slow" at once

    async def attempt(name: str, _: Attempt) -> str:
        if name == "slow":
            for _ in range(20):  # far slower than the hedge, which returns at once
                await asyncio.sleep(0)
        return name

    hedger = Hedger(config)
    winners = [await hedger.run(["slow", "fast"], attempt) for _ in range(1000)]
    stats = hedger.stats()
    assert 0.05 * 1000 + config.budget_burst - 1 <= stats["hedges_sent"] <= 0.05 * 1000 + config.budget_burst
    assert stats["budget_exhausted"] == 1000 - stats["hedges_sent"]
    assert winners.count("fast") == stats["hedges_won"] == stats["hedges_sent"]


def test_budget_earns_a_fraction_per_primary_up_to_the_burst() -> None:
    budget = HedgeBudget(ratio=0.25, burst=2)
    assert budget.try_spend() and budget.try_spend() and not budget.try_spend()
    for _ in range(3):
        budget.earn()
    assert not budget.try_spend()
    budget.earn()
    assert budget.try_spend()
    for _ in range(100):
        budget.earn()
    assert budget.tokens == 2


def test_delay_follows_each_targets_p95_within_the_bounds() -> None:
    latency = LatencyTracker(HedgeConfig(min_delay_ms=2, max_delay_ms=500))
    assert latency.delay("a") == 0.5  # nothing measured: hedge late
    for _ in range(200):
        latency.record("a", 0.0001)
    assert latency.delay("a") == 0.002  # fast: down to the floor
    assert latency.delay("new") == 0.002  # an unmeasured target borrows the tier's estimate
    for i in range(100):
        latency.record("b", 0.010 if i % 20 else 0.100)  # 5% at 100 ms
    assert 0.010 <= latency.delay("b") <= 0.100
    for _ in range(200):
        latency.record("b", 0.050)
    assert latency.delay("b") == pytest.approx(0.050)  # grows with slower samples
    for _ in range(200):
        latency.record("b", 30.0)
    assert latency.delay("b") == 0.5  # clamped to the ceiling
    assert latency.delay("a") == 0.002  # per target


async def test_hedger_learns_latencies_of_attempts_that_returned() -> None:
    """Returned attempts take a fraction of a millisecond on the hedger's clock: a fake one
    that steps 0.1 ms per reading (on the real clock a loaded machine makes them slower than
    the 2 ms floor)."""
    ticks = itertools.count()
    hedger = Hedger(HedgeConfig(min_delay_ms=2, max_delay_ms=500), clock=lambda: next(ticks) / 10_000)
    fakes = Fakes(a="ok", b=Unavailable("x"))
    for _ in range(20):
        await hedger.run(["a"], fakes)
        with pytest.raises(HedgeExhausted):
            await hedger.run(["b"], fakes)
    assert hedger.latency.estimate("a") is not None and hedger.latency.delay("a") == 0.002
    assert hedger.latency.estimate("b") == hedger.latency.estimate("a")  # failures are no samples


async def test_caller_cancellation_cancels_every_attempt() -> None:
    fakes = Fakes(a="stall", b="stall", c="ok")
    hedger = Hedger(HedgeConfig(min_delay_ms=1, max_delay_ms=1))
    async with no_leftover_tasks():
        run = asyncio.create_task(hedger.run(["a", "b", "c"], fakes))
        while len(fakes.started) < 2:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)  # long past the next hedge delay
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert fakes.started == ["a", "b"]  # at most max_parallel in flight
    assert sorted(fakes.cancelled) == ["a", "b"]


async def test_more_parallel_attempts_when_configured() -> None:
    hedger, fakes = Hedger(HedgeConfig(min_delay_ms=1, max_delay_ms=1, max_parallel=3)), Fakes(a="stall", b="stall", c="ok")
    async with no_leftover_tasks():
        assert await hedger.run(["a", "b", "c"], fakes) == "from c"
    assert sorted(fakes.cancelled) == ["a", "b"] and hedger.stats()["hedges_sent"] == 2


async def test_disabled_hedging_only_fails_over() -> None:
    hedger, fakes = Hedger(HedgeConfig(enabled=False, min_delay_ms=1, max_delay_ms=1)), Fakes(a=0.03, b="ok")
    assert await hedger.run(["a", "b"], fakes) == "from a"
    assert fakes.started == ["a"] and hedger.stats()["budget_exhausted"] == 0


async def test_key_of_names_latency_targets() -> None:
    hedger = Hedger()

    async def attempt(candidate: tuple[str, int], _: Attempt) -> str:
        await asyncio.sleep(0)
        return candidate[0]

    for _ in range(10):
        await hedger.run([("http://r0", 0)], attempt, key_of=lambda c: c[0])
    assert hedger.latency.estimate("http://r0") is not None


@pytest.mark.parametrize(
    "bad",
    [
        {"min_delay_ms": 5, "max_delay_ms": 1},
        {"quantile": 0},
        {"budget_ratio": -1},
        {"max_parallel": 0},
        {"window": 2},
    ],
)
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HedgeConfig(**bad)  # type: ignore[arg-type]


async def test_a_hedge_waits_until_its_target_has_room() -> None:
    hedger, fakes = Hedger(FIXED_10MS), Fakes(a="stall", b="ok")
    room = False
    run = asyncio.create_task(hedger.run(["a", "b"], fakes, ready=lambda name: room))
    await asyncio.sleep(0.05)  # long past the delay: the hedge is due, but b has no room
    assert fakes.started == ["a"] and hedger.stats()["hedges_deferred"] == 1
    room = True
    assert await asyncio.wait_for(run, 1.0) == "from b"
    assert fakes.started == ["a", "b"] and fakes.cancelled == ["a"]
    assert (hedger.stats()["hedges_sent"], hedger.stats()["hedges_deferred"], hedger.budget.tokens) == (1, 1, 49.0)


async def test_a_failover_does_not_wait_for_room() -> None:
    hedger, fakes = Hedger(FIXED_10MS), Fakes(a=Unavailable("down"), b="ok")
    assert await hedger.run(["a", "b"], fakes, ready=lambda name: False) == "from b"


def queued_then(queue_s: float, service: object) -> Callable[[str, Attempt], Awaitable[str]]:
    """An attempt that waits ``queue_s`` in a client-side queue, then serves like Fakes."""
    fakes = Fakes(a=service, b="ok")

    async def attempt(name: str, handle: Attempt) -> str:
        if name == "a":
            handle.queued()
            await asyncio.sleep(queue_s)
            handle.in_service()
        return await fakes(name)

    attempt.fakes = fakes  # type: ignore[attr-defined]
    return attempt


async def test_an_attempt_queued_in_the_client_is_not_hedged_until_in_service() -> None:
    hedger, attempt = Hedger(FIXED_10MS), queued_then(0.08, "stall")
    begun = time.perf_counter()
    assert await hedger.run(["a", "b"], attempt) == "from b"
    assert time.perf_counter() - begun >= 0.09  # 80 ms queued + the 10 ms delay, not 10 ms
    assert attempt.fakes.started == ["a", "b"]  # type: ignore[attr-defined]


async def test_latency_counts_from_entering_service() -> None:
    hedger = Hedger(HedgeConfig(quantile=0.5))
    for _ in range(10):
        await hedger.run(["a", "b"], queued_then(0.03, 0.002))
    estimate = hedger.latency.estimate("a")
    assert estimate is not None and estimate < 0.02  # the 30 ms queue is not the server's


def test_an_attempt_handle_records_its_queueing() -> None:
    now = [1.0]
    handle = Attempt(lambda: now[0])
    assert (handle.serving, handle.begun) == (True, 1.0)
    handle.queued()
    now[0] = 3.0
    assert handle.serving is False
    handle.in_service()
    assert (handle.serving, handle.begun) == (True, 3.0)


async def test_every_attempt_gets_a_handle_of_its_own() -> None:
    handles: list[Attempt] = []

    async def attempt(name: str, handle: Attempt) -> str:
        handles.append(handle)
        if name == "a":
            raise Unavailable("down")
        return name

    assert await Hedger(FIXED_10MS).run(["a", "b"], attempt) == "b"
    assert len(handles) == 2 and handles[0] is not handles[1]


# --- hung targets (blobsdk/tail/health.py) ---------------------------------------------------------

HANG_20MS = HedgeConfig(
    min_delay_ms=1000,
    max_delay_ms=1000,
    budget_burst=0,
    budget_ratio=0,
    hang_min_ms=20,
    hang_max_ms=20,
    probe_after_s=0.2,
    probe_max_s=0.4,
)


async def test_an_attempt_past_its_hang_deadline_fails_over_without_budget() -> None:
    """On a fake clock: the failover comes when the clock reaches the 20 ms deadline, not before."""
    now = [0.0]
    hedger, fakes = Hedger(HANG_20MS, clock=lambda: now[0]), Fakes(a="stall", b="ok")
    async with no_leftover_tasks():
        run = asyncio.create_task(hedger.run(["a", "b"], fakes))
        await on_the_brink(fakes, now, 0.020)
        assert fakes.started == ["a"] and hedger.stats()["hung_failovers"] == 0  # not hung before its deadline
        now[0] = 0.020
        result = await run
    assert result == "from b"
    assert fakes.cancelled == ["a"] and hedger.budget.tokens == 0
    stats = hedger.stats()
    assert (stats["hung_failovers"], stats["targets_hung"], stats["hedges_sent"], stats["failovers"]) == (1, 1, 0, 1)


async def test_a_late_attempt_at_a_target_that_answers_others_is_no_hang() -> None:
    """A busy HDD server: the client does not see its queue, so one read waits 5x its hang
    deadline while the server keeps answering the reads ahead of it.  The deadline is 200 ms
    and the others are answered until the late read ends: a loaded machine's stalled event
    loop (tens of ms) must not look like a silent server."""
    hedger = Hedger(msgspec.structs.replace(HANG_20MS, hang_min_ms=200, hang_max_ms=200))
    late_done = asyncio.Event()

    async def others_answered_by_a() -> None:
        while not late_done.is_set():
            assert await hedger.run(["a"], Fakes(a=0.005)) == "from a"

    async with no_leftover_tasks(), asyncio.TaskGroup() as group:
        group.create_task(others_answered_by_a())
        await asyncio.sleep(0.01)
        fakes = Fakes(a=1.0, b="ok")
        try:
            assert await hedger.run(["a", "b"], fakes) == "from a"  # waited for, not failed over
        finally:
            late_done.set()
    assert fakes.started == ["a"] and hedger.stats()["hung_failovers"] == 0
    assert hedger.stats()["targets_hung"] == 0


async def test_a_target_answering_nothing_is_hung_after_its_last_answer_plus_the_deadline() -> None:
    hedger = Hedger(HANG_20MS)
    assert await hedger.run(["a"], Fakes(a="ok")) == "from a"
    result, seconds = await timed(hedger.run(["a", "b"], Fakes(a="stall", b="ok")))
    assert result == "from b" and 0.02 <= seconds < 0.5 and hedger.stats()["hung_failovers"] == 1


async def test_a_hung_target_gets_no_first_attempts_until_its_probe_is_due() -> None:
    hedger, fakes = Hedger(HANG_20MS), Fakes(a="stall", b="ok")
    await hedger.run(["a", "b"], fakes)  # finds a hung
    fakes.started.clear()
    for _ in range(5):
        assert await hedger.run(["a", "b"], fakes) == "from b"
    assert fakes.started == ["b"] * 5  # ranked last: never tried while b answers


async def test_a_probe_that_answers_makes_the_target_healthy_again() -> None:
    hedger, fakes = Hedger(HANG_20MS), Fakes(a="stall", b="ok")
    await hedger.run(["a", "b"], fakes)
    fakes.behaviour["a"] = "ok"  # the server came back
    await asyncio.sleep(0.25)  # past probe_after_s
    assert await hedger.run(["a", "b"], fakes) == "from a"  # the probe goes first, and answers
    assert hedger.stats()["targets_hung"] == 0 and hedger.stats()["probes"] == 1
    assert await hedger.run(["a", "b"], fakes) == "from a"  # and a is ranked by rendezvous again


async def test_a_probe_that_hangs_again_doubles_the_wait_for_the_next() -> None:
    hedger, fakes = Hedger(HANG_20MS), Fakes(a="stall", b="ok")
    await hedger.run(["a", "b"], fakes)
    await asyncio.sleep(0.25)
    result, seconds = await timed(hedger.run(["a", "b"], fakes))  # the probe, hung: fails over
    assert result == "from b" and seconds < 0.5 and hedger.stats()["probes"] == 1
    await asyncio.sleep(0.25)  # past the first wait, not the doubled one (0.4 s)
    fakes.started.clear()
    assert await hedger.run(["a", "b"], fakes) == "from b"
    assert fakes.started == ["b"] and hedger.stats()["probes"] == 1


async def test_an_attempt_queued_for_a_target_found_hung_fails_over() -> None:
    """Attempts waiting in the client for a hung target's permit are failed over once another
    read found it hung, though they never entered service."""
    hedger = Hedger(HANG_20MS)
    gate = asyncio.Event()  # never set: the queue at "a" never moves

    async def attempt(name: str, handle: Attempt) -> str:
        if name == "a":
            handle.queued()
            await gate.wait()
        return name

    waiting = asyncio.create_task(hedger.run(["a", "b"], attempt))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # queued: not late, not hung
    await hedger.run(["a", "b"], Fakes(a="stall", b="ok"))  # another read finds a hung
    assert await asyncio.wait_for(waiting, 1.0) == "b"


async def test_a_patient_tier_waits_for_its_last_attempt_rather_than_fail_it_as_hung() -> None:
    """The last tier (L4) has nowhere to fall through to: a replica that is only slow for this
    client (8 clients queued at a saturated HDD tier) must not fail the read."""
    hedger = Hedger(HANG_20MS)
    async with no_leftover_tasks():
        result, seconds = await timed(hedger.run(["a", "b"], Fakes(a="stall", b=0.1), patient=True))
    assert result == "from b" and seconds >= 0.1 and hedger.stats()["hung_failovers"] == 1  # a failed over, b waited for
    with pytest.raises(HedgeExhausted, match="b: no answer within its hang deadline"):
        await Hedger(HANG_20MS).run(["a", "b"], Fakes(a="stall", b=0.1))  # a cache tier moves on instead


async def test_a_patient_tier_waits_for_a_slow_replica_rather_than_move_on_to_a_hung_one() -> None:
    """ "c" is known hung (it stalled before); "a" is only slow, past its 20 ms hang deadline
    (a loaded machine).  The last tier waits for "a" rather than fail over to "c", which would
    never answer: before, the read waited on "c" until its socket timed out."""
    hedger = Hedger(HANG_20MS)
    await hedger.run(["c", "b"], Fakes(c="stall", b="ok"))  # c is found hung
    assert hedger.health.has("c", Reason.HUNG)
    fakes = Fakes(a=0.1, c="stall")
    async with no_leftover_tasks():
        result = await asyncio.wait_for(hedger.run(["a", "c"], fakes, patient=True), 1.5)
    assert result == "from a" and fakes.started == ["a"]  # c never tried
    assert hedger.health.has("a", Reason.HUNG) is False  # it answered: not hung any more


async def test_a_hung_attempts_wait_is_no_latency_sample() -> None:
    """Which samples are recorded, not their values: on a loaded machine a 1 ms sleep can
    take longer than the 20 ms hang deadline."""
    hedger = Hedger(HANG_20MS)
    recorded: list[str] = []
    record = hedger.latency.record

    def spy(target: str, seconds: float) -> None:
        recorded.append(target)
        record(target, seconds)

    hedger.latency.record = spy  # type: ignore[method-assign]
    for _ in range(10):
        await hedger.run(["a"], Fakes(a=0.001))  # one candidate: no race, a few samples
    await hedger.run(["a", "b"], Fakes(a="stall", b="ok"))
    assert recorded == ["a"] * 10 + ["b"]  # the hung attempt's wait was not recorded


def test_hang_settings_are_validated() -> None:
    with pytest.raises(ValueError, match=r"^hedge.hang_min_ms must be > 0, got 0$"):
        HedgeConfig(hang_min_ms=0)
    with pytest.raises(ValueError, match=r"^need hang_factor > 0 and 0 < hang_min_ms <= hang_max_ms, got 8.0, 900, 800$"):
        HedgeConfig(hang_min_ms=900, hang_max_ms=800)
    with pytest.raises(ValueError, match=r"^need 0 < probe_after_s <= probe_max_s, got 5, 1$"):
        HedgeConfig(probe_after_s=5, probe_max_s=1)


async def test_a_lone_candidate_of_a_cache_tier_is_failed_over_once_hung() -> None:
    """A chunk's only peer source, SIGSTOPped: the tier misses after its hang deadline (the
    read goes on to the next tier) instead of waiting out a socket timeout."""
    hedger = Hedger(HANG_20MS)
    async with no_leftover_tasks():
        with pytest.raises(HedgeExhausted, match="a: no answer within its hang deadline"):
            await asyncio.wait_for(hedger.run(["a"], Fakes(a="stall")), 1.0)
    result, seconds = await timed(Hedger(HANG_20MS).run(["a"], Fakes(a=0.1), patient=True))
    assert result == "from a" and seconds >= 0.1  # the last tier waits for it


async def test_an_attempt_whose_server_says_it_works_is_neither_hedged_nor_hung_until_it_falls_silent() -> None:
    """An L3 node reading a chunk through a busy L4 sends ``102 Processing`` (the attempt's
    ``progress()``): its hang deadline counts from its last word, and it is not hedged (that
    would make another node read the chunk from L4 too).  Once it falls silent it is hung a
    deadline later.  The clock is fake and moves only with the attempt: 10 words 15 ms apart
    (150 ms: over 7 of its 20 ms deadlines), then silence."""
    now = [0.0]
    hedger = Hedger(HedgeConfig(min_delay_ms=1, max_delay_ms=1, hang_min_ms=20, hang_max_ms=20), clock=lambda: now[0])
    forever = asyncio.Event()

    async def attempt(name: str, mark: Attempt) -> str:
        if name == "b":
            return "from b"
        for _ in range(10):
            now[0] += 0.015
            mark.progress()
            await asyncio.sleep(0.001)
        now[0] += 1.0
        await forever.wait()
        return "from a"

    async with no_leftover_tasks():
        assert await hedger.run(["a", "b"], attempt) == "from b"
    stats = hedger.stats()
    assert (stats["hedges_sent"], stats["hung_failovers"], stats["targets_hung"]) == (0, 1, 1)
    assert now[0] == pytest.approx(1.15)  # a spoke all ten times before it was found hung


def test_an_attempt_handle_records_its_servers_progress() -> None:
    now, heard = [5.0], []
    mark = Attempt(lambda: now[0], on_progress=lambda: heard.append(now[0]))
    assert (mark.begun, mark.heard, mark.upstream) == (5.0, 5.0, False)
    now[0] = 7.0
    mark.progress()
    assert (mark.begun, mark.heard, mark.upstream, heard) == (5.0, 7.0, True, [7.0])


def test_a_targets_typical_latency_is_its_recent_median() -> None:
    """For ranking: a few slow samples do not make a target slow, and what it did long ago
    does not rank it now (a replica ranked last is read no more, so its window never changes)."""
    now = [0.0]
    latency = LatencyTracker(HedgeConfig(), clock=lambda: now[0])
    assert latency.typical("a", within=2.0) is None  # unmeasured
    for seconds in [0.001] * 10 + [0.5] * 4:
        latency.record("a", seconds)
    assert latency.typical("a", within=2.0) == 0.001 and latency.estimate("a") == 0.5
    now[0] = 2.5
    assert latency.typical("a", within=2.0) is None  # stale: its window starts afresh
    latency.record("a", 0.002)
    assert latency.typical("a", within=2.0) is None and latency.estimate("a") == 0.5  # too few: borrows all targets' p95
    for _ in range(10):
        latency.record("a", 0.002)
    assert latency.typical("a", within=2.0) == 0.002


async def test_a_hedge_that_wins_leaves_the_callers_task_uncancelled() -> None:
    """The primary runs in the caller's task and is stopped by a cancellation of that task,
    taken back once it is: the caller, inside its own timeout, sees only the hedge's value."""
    now = [0.0]
    hedger, fakes = Hedger(FIXED_10MS, clock=lambda: now[0]), Fakes(a="stall", b="ok")

    async def caller() -> tuple[str, int]:
        async with asyncio.timeout(5):
            result = await hedger.run(["a", "b"], fakes)
            await asyncio.sleep(0)  # no cancellation left pending
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    async with no_leftover_tasks():
        run = asyncio.create_task(caller())
        await on_the_brink(fakes, now, 0.010)
        now[0] = 0.010
        assert await run == ("from b", 0)
    assert fakes.cancelled == ["a"]


async def test_a_caller_cancelled_while_its_hedge_runs_is_cancelled() -> None:
    """A cancellation from outside is never taken for the race's own."""
    now = [0.0]
    hedger, fakes = Hedger(FIXED_10MS, clock=lambda: now[0]), Fakes(a="stall", b="stall")
    async with no_leftover_tasks():
        run = asyncio.create_task(hedger.run(["a", "b"], fakes))
        await on_the_brink(fakes, now, 0.010)
        now[0] = 0.010
        while len(fakes.started) < 2:
            await asyncio.sleep(0.001)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert sorted(fakes.cancelled) == ["a", "b"]
