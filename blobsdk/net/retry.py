"""Retries of a request that failed for a reason another try may not meet (a throttle, a
5xx, a dropped connection, a stalled body): full-jitter exponential backoff, bounded by the
request's budget in seconds rather than by a count, as AWS's SDKs back off in their
"standard" retry mode.

Before retry ``n`` (1, 2, ...) the caller pauses a time drawn uniformly from
``[0, min(cap_s, base_s * 2**(n - 1)))``: "full jitter", so the clients a throttle answered
at once do not come back at once.  A retry is made only while its pause ends within the
budget, counted from the first try; once it would not, the request gives up at once with
its last error and a summary of its tries (how many, over how long, why each failed),
rather than sleep into a budget it cannot use.

The values (``BASE_S`` 0.1, ``CAP_S`` 5): AWS's own SDKs use a base of 0.1-1 s and a cap of
20 s, for control-plane calls with no deadline of their own.  A data read has one (the S3
store's ``timeout_s``, 30 s by default): with a cap of 20 s a single pause could spend two
thirds of it, and a read that a throttle of a second or two delayed would wait out a long
pause after the throttle had ended.  With a cap of 5 s the first six pauses add up to about
3 s on average (6.3 s at most) and each later one is 2.5 s on average, so a throttle of
0.5-1 s is ridden out within about five retries, and a persistent one gets 13-25 tries
(17 typically) spread over a 30 s budget before the read gives up.

Clock, sleep and the random draws are injected (:class:`Backoff`), so a test's pauses and
budget are exact.  A leaf of ``net``: it imports nothing of blobsdk.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable

BASE_S = 0.1
CAP_S = 5.0


class Backoff:
    """The pauses between tries (see the module docstring): ``base_s``, ``cap_s``;
    ``rng`` draws from [0, 1); ``clock`` and ``sleep`` keep and spend time."""

    __slots__ = ("base_s", "cap_s", "clock", "rng", "sleep")

    def __init__(
        self,
        base_s: float = BASE_S,
        cap_s: float = CAP_S,
        *,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {base_s} and {cap_s}")
        self.base_s, self.cap_s = base_s, cap_s
        self.rng, self.clock, self.sleep = rng, clock, sleep

    def start(self, budget_s: float) -> Retries:
        """The retries of one request whose first try starts now, within ``budget_s``."""
        return Retries(self, budget_s)


class Retries:
    """One request's tries so far, and whether its budget allows another."""

    __slots__ = ("_backoff", "began", "budget_s", "reasons", "tries")

    def __init__(self, backoff: Backoff, budget_s: float) -> None:
        self._backoff = backoff
        self.budget_s = budget_s
        self.began = backoff.clock()
        self.tries = 1  # the first one, under way
        self.reasons: Counter[str] = Counter()  # why the failed tries failed

    async def again(self, reason: str) -> bool:
        """The try under way failed for ``reason`` (one word: "throttled", "stalled",
        "failed"): pause, and True for another try; False, without a pause, when the pause
        would end past the budget."""
        self.reasons[reason] += 1
        backoff = self._backoff
        pause = backoff.rng() * min(backoff.cap_s, backoff.base_s * 2 ** (self.tries - 1))
        if backoff.clock() + pause - self.began >= self.budget_s:
            return False
        await backoff.sleep(pause)
        self.tries += 1
        return True

    def summary(self) -> str:
        """How the tries went, for the error of a request that gave up: how many, over how
        long, why they failed."""
        took = self._backoff.clock() - self.began
        why = ", ".join(f"{reason}: {count}" for reason, count in self.reasons.most_common())
        tries = "1 try" if self.tries == 1 else f"{self.tries} tries"
        return f"gave up after {tries} in {took:.1f}s ({why}): another pause would pass the budget of {self.budget_s:g}s"
