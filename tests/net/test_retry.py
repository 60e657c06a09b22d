"""blobsdk.net.retry: full-jitter exponential pauses within a budget, on an injected clock,
sleep and random draws, so every pause and every decision is exact."""

from __future__ import annotations

import pytest

from blobsdk.net.retry import Backoff, Retries


class Time:
    """A clock that only the pauses (and the test) move."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def backoff(time: Time, draws: list[float], base_s: float = 0.1, cap_s: float = 5.0) -> Backoff:
    pending = iter(draws)
    return Backoff(base_s, cap_s, rng=lambda: next(pending), clock=time.clock, sleep=time.sleep)


async def test_pauses_double_from_the_base_up_to_the_cap_each_a_full_jitter_draw() -> None:
    time = Time()
    retries = backoff(time, [1.0, 0.5, 1.0, 0.25, 1.0, 1.0, 1.0, 0.5]).start(budget_s=100.0)
    for _ in range(8):
        assert await retries.again("throttled")
    # ceilings 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5 (capped), 5; each drawn in [0, ceiling)
    assert time.pauses == pytest.approx([0.1, 0.1, 0.4, 0.2, 1.6, 3.2, 5.0, 2.5])
    assert retries.tries == 9


async def test_no_retry_whose_pause_would_end_past_the_budget_and_no_pause_then() -> None:
    time = Time()
    retries = backoff(time, [1.0] * 20).start(budget_s=2.0)
    assert await retries.again("throttled")  # 0.1 s
    time.now += 0.5  # the second try took half a second
    assert await retries.again("stalled")  # 0.2 s: ends at 0.8 s
    assert await retries.again("throttled")  # 0.4 s: ends at 1.2 s
    assert not await retries.again("throttled")  # 0.8 s would end at 2.0 s: the budget's end
    assert time.pauses == pytest.approx([0.1, 0.2, 0.4]) and time.now == pytest.approx(101.2)
    assert retries.tries == 4
    assert retries.summary() == (
        "gave up after 4 tries in 1.2s (throttled: 3, stalled: 1): another pause would pass the budget of 2s"
    )


async def test_a_budget_spent_by_the_first_try_allows_no_retry() -> None:
    time = Time()
    retries = backoff(time, [0.0]).start(budget_s=30.0)
    time.now += 30.0
    assert not await retries.again("server error")
    assert retries.summary() == "gave up after 1 try in 30.0s (server error: 1): another pause would pass the budget of 30s"


def test_each_request_has_its_own_tries_and_budget() -> None:
    time = Time()
    shared = backoff(time, [])
    first = shared.start(5.0)
    time.now += 1.0
    second = shared.start(7.0)
    assert isinstance(first, Retries) and (first.began, first.budget_s) == (100.0, 5.0)
    assert (second.began, second.budget_s, second.tries) == (101.0, 7.0, 1)


@pytest.mark.parametrize(("base_s", "cap_s"), [(0.0, 5.0), (-1.0, 5.0), (6.0, 5.0)])
def test_a_base_that_is_not_positive_or_above_the_cap_is_refused(base_s: float, cap_s: float) -> None:
    with pytest.raises(ValueError, match=rf"^need 0 < base_s <= cap_s, got {base_s} and {cap_s}$"):
        Backoff(base_s, cap_s)
