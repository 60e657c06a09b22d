"""The adaptive per-endpoint limiter: admission and queueing, feedback, and convergence on a
simulated origin (run in virtual time, so it is fast and deterministic)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import selectors

import pytest

from blobsdk.chunks.demand import Demand
from blobsdk.errors import BlobNotFound, TimedOut, Unavailable
from blobsdk.tail.limiter import (
    AdaptiveLimiter,
    LimiterConfig,
    LimiterRegistry,
    Priority,
)

FIXED_5 = LimiterConfig(initial=5, min_limit=5, max_limit=5)
FIXED_1 = LimiterConfig(initial=1, min_limit=1, max_limit=1)
ALGORITHMS = ["gradient", "aimd"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def run_round(limiter: AdaptiveLimiter, clock: FakeClock, rtt: float, *, drop: bool = False) -> None:
    """As many requests at once as the limiter admits (so none waits), each taking ``rtt``;
    all dropped if ``drop``."""
    async with contextlib.AsyncExitStack() as stack:
        permits = [await stack.enter_async_context(limiter.acquire()) for _ in range(limiter.capacity)]
        clock.now += rtt
        for permit in permits if drop else ():
            permit.dropped()


async def settle(condition, rounds: int = 100) -> None:
    """Yield to the loop until ``condition()`` holds."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


# --- admission and queueing ----------------------------------------------------------------


async def test_never_more_than_limit_in_flight_and_all_slots_return():
    limiter = AdaptiveLimiter("e", FIXED_5)
    rng = random.Random(7)
    active = peak = 0

    async def request(i: int) -> None:
        nonlocal active, peak
        async with limiter.acquire(Priority(i % 2)) as permit:
            active += 1
            peak = max(peak, active)
            try:
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
            finally:
                active -= 1
            if i % 7 == 0:
                permit.dropped()
                raise Unavailable("shed")

    tasks = [asyncio.create_task(request(i)) for i in range(200)]
    await asyncio.sleep(0)
    for task in tasks[::9]:
        task.cancel()  # some while queued, some after being granted
    await asyncio.gather(*tasks, return_exceptions=True)
    assert peak == 5
    assert (limiter.in_flight, limiter.queued) == (0, 0)


async def test_waiters_go_foreground_first_then_in_arrival_order():
    limiter = AdaptiveLimiter("e", FIXED_1)
    order: list[str] = []

    async def request(name: str, priority: Priority) -> None:
        async with limiter.acquire(priority):
            order.append(name)

    holder = limiter.acquire()
    await holder.__aenter__()
    fg, pf = Priority.FOREGROUND, Priority.PREFETCH
    names = [("p1", pf), ("f1", fg), ("p2", pf), ("f2", fg)]
    tasks = []
    for name, priority in names:
        tasks.append(asyncio.create_task(request(name, priority)))
        await settle(lambda: limiter.queued == len(tasks))
    await holder.__aexit__(None, None, None)
    await asyncio.gather(*tasks)
    assert order == ["f1", "f2", "p1", "p2"]


async def test_priority_is_the_demands_and_foreground_by_default():
    limiter = AdaptiveLimiter("e", FIXED_1)
    prefetch = Demand(Priority.PREFETCH)
    assert limiter.acquire(prefetch).priority is Priority.PREFETCH
    assert limiter.acquire(Priority.PREFETCH).priority is Priority.PREFETCH
    assert limiter.acquire().priority is Priority.FOREGROUND
    prefetch.promote()
    assert limiter.acquire(prefetch).priority is Priority.FOREGROUND


async def test_a_promoted_waiter_moves_to_the_foreground_queue():
    """Queued at prefetch priority, then promoted (a foreground reader joined its fetch): it
    goes after the foreground waiters that were there first, before every prefetch one."""
    limiter = AdaptiveLimiter("e", FIXED_1)
    order: list[str] = []

    async def request(name: str, demand: Demand) -> None:
        async with limiter.acquire(demand):
            order.append(name)

    holder = limiter.acquire()
    await holder.__aenter__()
    fg, pf = Priority.FOREGROUND, Priority.PREFETCH
    demands = {name: Demand(priority) for name, priority in [("p1", pf), ("f1", fg), ("p2", pf), ("p3", pf)]}
    tasks = []
    for name, demand in demands.items():
        tasks.append(asyncio.create_task(request(name, demand)))
        await settle(lambda: limiter.queued == len(tasks))
    demands["p3"].promote()
    demands["p3"].promote()  # once is enough: it is queued once more, not twice
    await holder.__aexit__(None, None, None)
    await asyncio.gather(*tasks)
    assert order == ["f1", "p3", "p1", "p2"]
    assert (limiter.in_flight, limiter.queued) == (0, 0)


async def test_a_promoted_waiter_cancelled_leaks_no_slot():
    limiter = AdaptiveLimiter("e", FIXED_1)
    holder = limiter.acquire()
    await holder.__aenter__()
    demand = Demand(Priority.PREFETCH)

    async def request() -> None:
        async with limiter.acquire(demand):
            pass

    task = asyncio.create_task(request())
    await settle(lambda: limiter.queued == 1)
    demand.promote()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await holder.__aexit__(None, None, None)
    assert (limiter.in_flight, limiter.queued) == (0, 0)
    async with limiter.acquire():  # the slot is free
        pass


async def test_cancelled_waiter_leaks_no_slot():
    limiter = AdaptiveLimiter("e", FIXED_1)
    holder = limiter.acquire()
    await holder.__aenter__()
    waiter = asyncio.create_task(limiter.acquire().__aenter__())
    await settle(lambda: limiter.queued == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.queued == 0
    await holder.__aexit__(None, None, None)
    assert limiter.in_flight == 0
    async with limiter.acquire():
        assert limiter.in_flight == 1
    assert limiter.stats()["ignored"] == 0


async def test_waiter_cancelled_after_its_grant_passes_the_slot_on():
    limiter = AdaptiveLimiter("e", FIXED_1)
    ran: list[str] = []

    async def request(name: str) -> None:
        async with limiter.acquire():
            ran.append(name)

    holder = limiter.acquire()
    await holder.__aenter__()
    first, second = asyncio.create_task(request("first")), asyncio.create_task(request("second"))
    await settle(lambda: limiter.queued == 2)
    await holder.__aexit__(None, None, None)
    assert (limiter.in_flight, limiter.queued) == (1, 1)  # granted to "first", which has not run yet
    first.cancel()
    async with asyncio.timeout(1):
        await asyncio.gather(first, second, return_exceptions=True)
    assert first.cancelled()
    assert ran == ["second"]
    assert (limiter.in_flight, limiter.queued) == (0, 0)


async def test_cancellation_inside_the_request_releases_without_a_sample():
    limiter = AdaptiveLimiter("e")
    entered = asyncio.Event()

    async def request() -> None:
        async with limiter.acquire():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(request())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.stats() | {"min_rtt_ms": 0.0} == {
        "limit": 16,
        "in_flight": 0,
        "queued": 0,
        "successes": 0,
        "drops": 0,
        "ignored": 1,
        "min_rtt_ms": 0.0,
        "probes": 0,
    }


async def test_a_deadline_inside_the_permit_is_a_drop():
    limiter = AdaptiveLimiter("e")
    with pytest.raises(TimeoutError):
        async with limiter.acquire(), asyncio.timeout(0):
            await asyncio.sleep(1)
    assert (limiter.stats()["drops"], limiter.limit) == (1, 14)


async def test_a_drop_seen_before_a_cancellation_still_counts():
    limiter = AdaptiveLimiter("e")

    async def request() -> None:
        async with limiter.acquire() as permit:
            permit.dropped()  # the 429 arrived; then the reader left
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(request())
    assert (limiter.stats()["drops"], limiter.limit) == (1, 14)


async def test_a_permit_is_entered_once():
    permit = AdaptiveLimiter("e").acquire()
    async with permit:
        pass
    with pytest.raises(RuntimeError):
        async with permit:
            pass


# --- outcomes --------------------------------------------------------------------------------


async def outcome_of(exc: Exception | None, *, mark_dropped: bool = False) -> dict[str, int | float]:
    """The stats of a fresh limiter after one request that raised ``exc``."""
    limiter = AdaptiveLimiter("e")
    with contextlib.suppress(Exception):
        async with limiter.acquire() as permit:
            if mark_dropped:
                permit.dropped()
            if exc is not None:
                raise exc
    return limiter.stats()


def timed_out() -> Unavailable:
    try:
        try:
            raise TimeoutError
        except TimeoutError as exc:
            raise Unavailable("GET /x: TimeoutError") from exc
    except Unavailable as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "mark_dropped", "counter"),
    [
        (None, False, "successes"),
        (TimeoutError(), False, "drops"),  # a deadline inside the permit
        (TimedOut("GET /x: timed out"), True, "drops"),  # the GET told its permit it timed out
        (timed_out(), False, "ignored"),  # nothing is dug out of __cause__: the GET must say so
        (Unavailable("HTTP 503"), True, "drops"),  # the caller saw a 429/503
        (Unavailable("connection refused"), False, "ignored"),
        (BlobNotFound("gone"), False, "ignored"),
    ],
)
async def test_outcomes(exc, mark_dropped, counter):
    stats = await outcome_of(exc, mark_dropped=mark_dropped)
    assert stats[counter] == 1
    assert stats["successes"] + stats["drops"] + stats["ignored"] == 1
    assert stats["limit"] == (14 if counter == "drops" else 16)


# --- the limit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_limit_grows_to_max_while_rtt_stays_at_the_floor(algorithm):
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(initial=4, max_limit=64, algorithm=algorithm), clock=clock)
    seen = [limiter.limit]
    for _ in range(300):
        await run_round(limiter, clock, 0.010)
        seen.append(limiter.limit)
    assert seen == sorted(seen)
    assert limiter.limit == 64
    assert limiter.stats()["min_rtt_ms"] == 10.0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_limit_does_not_grow_when_the_caller_leaves_it_unused(algorithm):
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(algorithm=algorithm), clock=clock)
    for _ in range(100):
        async with limiter.acquire():
            clock.now += 0.010
    assert limiter.limit == 16


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_limit_shrinks_on_drops_once_per_round_trip(algorithm):
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(initial=100, algorithm=algorithm), clock=clock)
    await run_round(limiter, clock, 0.010, drop=True)
    assert limiter.limit == 90  # 100 drops of requests that all saw the old limit: one cut
    second = limiter.capacity  # fewer: the first drop probes the floor
    await run_round(limiter, clock, 0.010, drop=True)
    assert limiter.limit == 81
    assert limiter.stats()["drops"] == 100 + second


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_limit_shrinks_when_rtt_inflates(algorithm):
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(initial=32, algorithm=algorithm), clock=clock)
    await run_round(limiter, clock, 0.010)
    before = limiter.limit
    for _ in range(10):
        await run_round(limiter, clock, 0.050)  # 5x the floor, beyond the tolerated 2x
    assert limiter.limit < before * 0.7
    assert limiter.stats()["drops"] == 0  # slow is not dropped


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_limiter_not_by_latency_keeps_its_limit_as_rtt_inflates_and_cuts_on_drops(algorithm):
    """An object store's limiter (``by_latency=False``): slow is no signal, a drop is."""
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(initial=32, algorithm=algorithm), clock=clock, by_latency=False)
    await run_round(limiter, clock, 0.010)
    before = limiter.limit
    for _ in range(10):
        await run_round(limiter, clock, 0.050)  # 5x the floor
    grown = limiter.limit
    assert grown >= before
    await run_round(limiter, clock, 0.050, drop=True)
    assert (limiter.limit, limiter.capacity) == (int(grown * 0.9), int(grown * 0.9))  # cut, and no floor probe
    assert (limiter.stats()["min_rtt_ms"], limiter.stats()["probes"]) == (10.0, 0)


async def test_gradient_gives_up_at_most_half_the_smoothing_per_round_trip():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(initial=32), clock=clock)
    await run_round(limiter, clock, 0.010)
    before = limiter.limit
    await run_round(limiter, clock, 1.0)  # 100x the floor: the gradient is clamped at 0.5
    assert int(before * (1 - 0.2 / 2)) <= limiter.limit < before


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_limit_stays_within_bounds(algorithm):
    clock = FakeClock()
    config = LimiterConfig(initial=8, min_limit=3, max_limit=12, algorithm=algorithm)
    limiter = AdaptiveLimiter("e", config, clock=clock)
    for _ in range(50):
        await run_round(limiter, clock, 0.010, drop=True)
        assert 3 <= limiter.limit <= 12
    assert limiter.limit == 3
    clock.now += config.min_rtt_window_s  # past the hold after the last drop
    for _ in range(100):
        await run_round(limiter, clock, 0.010)
        assert 3 <= limiter.limit <= 12
    assert limiter.limit == 12


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_after_a_drop_the_limit_stays_below_it_for_a_window(algorithm):
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(min_rtt_window_s=1.0, algorithm=algorithm), clock=clock)
    await run_round(limiter, clock, 0.010)
    await run_round(limiter, clock, 0.010, drop=True)  # dropped at 16
    limits = []
    while clock.now < 0.9:
        await run_round(limiter, clock, 0.010)
        limits.append(limiter.limit)
    assert max(limits) == 15  # recovered up to just below it, no further
    while clock.now < 2.0:
        await run_round(limiter, clock, 0.010)
    assert limiter.limit > 16  # the hold is over: probe higher again


async def test_the_hold_after_a_drop_never_lowers_the_limit():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(initial=4), clock=clock)
    await run_round(limiter, clock, 0.010)
    await run_round(limiter, clock, 0.010, drop=True)  # 4 -> 3.6, and a floor probe
    await run_round(limiter, clock, 0.010)  # the probe's sample
    await run_round(limiter, clock, 0.010, drop=True)  # dropped at 3: 3.6 -> 3.24, held below 3
    await run_round(limiter, clock, 0.010)
    assert (limiter.limit, limiter.capacity) == (3, 3)


async def test_a_stale_floor_is_reprobed_once_per_window():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(min_rtt_window_s=1.0), clock=clock)
    await run_round(limiter, clock, 0.001)
    while clock.now < 0.95:
        await run_round(limiter, clock, 0.040)
    assert (limiter.stats()["min_rtt_ms"], limiter.stats()["probes"]) == (1.0, 0)  # kept for a window
    while clock.now < 1.2:
        await run_round(limiter, clock, 0.040)
    assert (limiter.stats()["min_rtt_ms"], limiter.stats()["probes"]) == (40.0, 1)  # the path got slower


async def test_a_probe_finds_the_floor_below_the_usual_concurrency():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(max_limit=16, min_rtt_window_s=1.0), clock=clock)
    capacities = []
    while clock.now < 1.5:
        capacities.append(limiter.capacity)
        # the server queues beyond 4 concurrent requests, so at 16 the floor looks like 30 ms
        await run_round(limiter, clock, 0.010 if limiter.capacity <= 4 else 0.030)
    assert limiter.stats()["min_rtt_ms"] == 10.0
    assert limiter.stats()["probes"] == 1
    assert capacities.count(4) == 1  # one round trip at a quarter of the limit
    assert limiter.capacity == limiter.limit < 16  # 30 ms is now 3x the floor: back off


async def test_the_first_drop_probes_an_unconfirmed_floor():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", clock=clock)
    await run_round(limiter, clock, 0.030)  # cold connections, 16 at once
    await run_round(limiter, clock, 0.030, drop=True)
    assert limiter.capacity == limiter.limit // 4
    await run_round(limiter, clock, 0.010)
    assert (limiter.capacity, limiter.stats()["min_rtt_ms"]) == (limiter.limit, 10.0)
    await run_round(limiter, clock, 0.010, drop=True)
    assert limiter.capacity == limiter.limit  # confirmed: the next probe waits for the window
    assert limiter.stats()["probes"] == 1


async def test_a_probe_that_gets_no_samples_ends_after_a_window():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(min_rtt_window_s=1.0), clock=clock)
    await run_round(limiter, clock, 0.010)
    clock.now = 1.0
    await run_round(limiter, clock, 0.010)  # starts a probe
    assert limiter.capacity == 4
    for _ in range(3):
        with contextlib.suppress(BlobNotFound):
            async with limiter.acquire():
                clock.now += 0.5
                raise BlobNotFound("gone")
    assert (limiter.capacity, limiter.stats()["min_rtt_ms"]) == (16, 10.0)


async def test_only_requests_near_the_largest_size_are_samples():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", clock=clock)
    async with limiter.acquire(size=4 << 20):
        clock.now += 0.010
    for _ in range(5):
        async with limiter.acquire(size=100 << 10):
            clock.now += 0.001  # a small tail chunk: not comparable with the 4 MiB ones
    assert limiter.stats()["min_rtt_ms"] == 10.0
    async with limiter.acquire(size=3 << 20):
        clock.now += 0.008
    assert limiter.stats()["min_rtt_ms"] == 8.0


async def test_requests_of_one_small_size_are_samples():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", clock=clock)
    for _ in range(3):
        async with limiter.acquire(size=100 << 10):
            clock.now += 0.001
    assert limiter.stats()["min_rtt_ms"] == 1.0


def test_config_is_validated():
    for bad in ({"initial": 0}, {"min_limit": 5, "initial": 4}, {"backoff": 1.0}, {"tolerance": 0.5}, {"smoothing": 0}):
        with pytest.raises(ValueError):
            LimiterConfig(**bad)


async def test_registry_has_one_limiter_per_endpoint():
    registry = LimiterRegistry(FIXED_5)
    a = registry.get("http://a:1")
    assert registry.get("http://a:1/") is a
    assert registry.get("http://b:1") is not a
    async with a.acquire():
        stats = registry.stats()
    assert set(stats) == {"http://a:1", "http://b:1"}
    assert stats["http://a:1"]["in_flight"] == 1
    keys = {"limit", "in_flight", "queued", "successes", "drops", "ignored", "min_rtt_ms", "probes"}
    assert set(stats["http://b:1"]) == keys


def test_registry_makes_an_endpoint_s_limiter_by_latency_as_first_asked():
    registry = LimiterRegistry(FIXED_5)
    s3 = registry.get("s3://bkt/p", by_latency=False)
    assert registry.get("s3://bkt/p/", by_latency=False) is s3 and not s3.by_latency
    assert registry.get("http://a:1").by_latency
    with pytest.raises(ValueError, match=r"^the limiter of s3://bkt/p was made with by_latency=False$"):
        registry.get("s3://bkt/p")


# --- convergence on a simulated origin (virtual time) -------------------------------------------


class _VirtualClock:
    now = 0.0


class _VirtualSelector(selectors.DefaultSelector):
    """Never sleeps: a wait for the next timer moves the virtual clock to it."""

    def __init__(self, clock: _VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None):
        if timeout is None:
            raise AssertionError("simulation deadlocked: nothing is scheduled")
        self._clock.now += max(0.0, timeout)
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _VirtualClock()
        super().__init__(_VirtualSelector(self._virtual))

    def time(self) -> float:
        return self._virtual.now


class Overloaded(Unavailable):
    """The origin's 429."""


class Origin:
    """Latency ``base + k * max(0, concurrency - knee)``; more than ``capacity`` concurrent
    requests are rejected (after ``base``, the time to say so)."""

    def __init__(self, base: float = 0.010, k: float = 0.010, knee: int = 4, capacity: int = 8) -> None:
        self.base, self.k, self.knee, self.capacity = base, k, knee, capacity
        self.concurrency = 0

    async def request(self) -> None:
        self.concurrency += 1
        try:
            seen = self.concurrency
            if seen > self.capacity:
                await asyncio.sleep(self.base)
                raise Overloaded(f"{seen} concurrent requests")
            await asyncio.sleep(self.base + self.k * max(0, seen - self.knee))
        finally:
            self.concurrency -= 1


async def simulate(algorithm: str, origin: Origin, requests: int = 500, workers: int = 32) -> tuple[AdaptiveLimiter, list[bool]]:
    """``requests`` requests from ``workers`` workers through one limiter; whether each was dropped."""
    loop = asyncio.get_running_loop()
    limiter = AdaptiveLimiter("origin", LimiterConfig(algorithm=algorithm), clock=loop.time)
    outcomes: list[bool] = []
    tickets = iter(range(requests))

    async def worker() -> None:
        for _ in tickets:
            async with limiter.acquire() as permit:
                try:
                    await origin.request()
                except Overloaded:
                    permit.dropped()
                    outcomes.append(True)
                else:
                    outcomes.append(False)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return limiter, outcomes


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    "origin",
    [
        pytest.param(lambda: Origin(k=0.010), id="queues-beyond-4"),
        pytest.param(lambda: Origin(k=0.0), id="flat-then-rejects"),  # no latency warning at all
    ],
)
def test_limit_converges_on_a_simulated_origin(algorithm, origin):
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        limiter, dropped = runner.run(simulate(algorithm, origin()))
    assert len(dropped) == 500
    assert 3 <= limiter.limit <= 8, limiter.stats()
    first, last = sum(dropped[:100]), sum(dropped[-250:])
    assert first > 0  # the initial limit (16) overshoots the origin's capacity (8)...
    assert last <= 2, dropped  # ...and the limiter learns to stay below it
    assert limiter.stats()["min_rtt_ms"] == 10.0


async def test_has_room_while_a_slot_is_free_and_nobody_waits():
    registry = LimiterRegistry(FIXED_5)
    assert registry.has_room("http://never-used:1")  # no limiter yet: nothing in its way
    limiter = registry.get("http://a:1")
    holders = [limiter.acquire() for _ in range(5)]
    for permit in holders[:4]:
        await permit.__aenter__()
    assert limiter.has_room and registry.has_room("http://a:1/")
    await holders[4].__aenter__()
    assert not limiter.has_room and not registry.has_room("http://a:1")
    waiter = asyncio.create_task(limiter.acquire().__aenter__())
    await asyncio.sleep(0)
    await holders[0].__aexit__(None, None, None)  # the slot goes to the waiter, not to "room"
    await waiter
    assert not limiter.has_room
    for permit in holders[1:]:
        await permit.__aexit__(None, None, None)
    assert limiter.has_room


# --- a cold burst at a busy origin: drops that meet no success ----------------------------------


async def test_drops_that_meet_no_success_do_not_hold_the_limit_down():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", clock=clock)
    for _ in range(12):
        await run_round(limiter, clock, 0.001, drop=True)  # full of others' work: everything shed
    assert limiter.limit <= 4
    seen = []
    for _ in range(6):
        await run_round(limiter, clock, 0.010)
        seen.append(limiter.limit)
    assert seen[-1] == 16, seen  # slow start back to the limit before the drops, in a few round trips
    assert seen == sorted(seen)


async def test_slow_start_ends_when_a_queue_builds():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", clock=clock)
    for _ in range(12):
        await run_round(limiter, clock, 0.001, drop=True)
    collapsed = limiter.limit
    await run_round(limiter, clock, 0.010)
    await run_round(limiter, clock, 0.010)
    before = limiter.limit
    assert before >= collapsed + 2  # slow start: +1 per sample
    await run_round(limiter, clock, 0.030)  # 3x the floor: no longer +1 per sample
    assert limiter.limit <= before
    for _ in range(3):
        await run_round(limiter, clock, 0.010)
    assert limiter.limit < 16  # back to the gradient's pace


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_drop_amid_successes_still_holds_after_slow_start(algorithm):
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(algorithm=algorithm), clock=clock)
    for _ in range(12):
        await run_round(limiter, clock, 0.001, drop=True)
    rounds = 0
    while limiter.limit < 10:
        await run_round(limiter, clock, 0.010)
        rounds += 1
    assert rounds <= 5  # slow start
    await run_round(limiter, clock, 0.010, drop=True)  # amid successes: the server's own level, 10
    for _ in range(50):
        await run_round(limiter, clock, 0.010)
    assert limiter.limit == 9


class BusyOrigin(Origin):
    """An Origin that sheds everything until ``busy_s`` (work others left behind), then serves."""

    def __init__(self, busy_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.busy_s = busy_s

    async def request(self) -> None:
        if asyncio.get_running_loop().time() < self.busy_s:
            await asyncio.sleep(0.0002)
            raise Overloaded("busy")
        await super().request()


async def simulate_for(
    algorithm: str, origin: Origin, seconds: float, workers: int = 32
) -> tuple[AdaptiveLimiter, list[tuple[float, int, bool]]]:
    """Closed-loop workers through one limiter for ``seconds`` of virtual time; each
    request's ``(end, limit after it, dropped)``."""
    loop = asyncio.get_running_loop()
    limiter = AdaptiveLimiter("origin", LimiterConfig(algorithm=algorithm), clock=loop.time)
    log: list[tuple[float, int, bool]] = []

    async def worker() -> None:
        while loop.time() < seconds:
            dropped = False
            async with limiter.acquire() as permit:
                try:
                    await origin.request()
                except Overloaded:
                    permit.dropped()
                    dropped = True
            log.append((loop.time(), limiter.limit, dropped))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return limiter, log


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_cold_burst_at_a_busy_origin_settles_within_half_a_second(algorithm):
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        limiter, log = runner.run(simulate_for(algorithm, BusyOrigin(0.030, k=0.0), 2.0))
    assert sum(dropped for t, _, dropped in log if t < 0.030) > 20  # a full origin: cut hard...
    late = [(limit, dropped) for t, limit, dropped in log if t >= 0.5]
    assert {limit for limit, _ in late} <= set(range(5, 9)), limiter.stats()  # ...and settled at its 8
    assert sum(dropped for _, dropped in late) <= 2
    served = sum(not dropped for t, _, dropped in log if 1.0 <= t < 2.0)
    assert served >= 0.6 * 8 / 0.010  # most of what 8 slots of 10 ms serve


async def test_aimd_a_drop_just_after_an_inflation_cut_is_still_amid_successes():
    clock = FakeClock()
    limiter = AdaptiveLimiter("e", LimiterConfig(algorithm="aimd", min_rtt_window_s=1.0), clock=clock)
    await run_round(limiter, clock, 0.010)  # the floor: 10 ms, at 16
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(limiter.acquire())
        others = [limiter.acquire() for _ in range(limiter.capacity - 1)]
        for permit in others:
            await permit.__aenter__()
        clock.now += 0.050
    # ``first`` answered at 5x the floor: AIMD cut 16 -> 14.4, on a success
    for permit in others:
        await permit.__aexit__(BlobNotFound, BlobNotFound("gone"), None)  # nothing to learn from
    async with limiter.acquire() as late:
        clock.now += 0.010
        late.dropped()  # the server, serving until just now, sheds at 14: hold below 14
    assert first.started < late.started
    limits = []
    while clock.now < 0.9:
        await run_round(limiter, clock, 0.010)
        limits.append(limiter.limit)
    assert max(limits) == 13
