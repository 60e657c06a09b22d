"""A hedged request's candidates as both the hedger (blobsdk/tail/hedge.py) and its race
(blobsdk/tail/race.py) see them: the attempt at one, whether an attempt's error moves on to
the next, the error once every one failed, and what a hedger counts.  Neither of the two
imports the other for these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import BlobError, HedgeExhausted
from .attempt import Attempt

T = TypeVar("T")
R = TypeVar("R")

AttemptFn = Callable[[T, Attempt], Awaitable[R]]  # one attempt at one candidate


def is_failover(exc: BaseException) -> bool:
    """Whether an attempt's error is about that candidate only (so another may succeed)."""
    return isinstance(exc, BlobError) and not isinstance(exc, ValueError)


def exhausted(failures: list[tuple[T, BaseException]], key_of: Callable[[T], str]) -> HedgeExhausted:
    """The error once every candidate failed: each failure described, the last as cause."""
    if not failures:
        return HedgeExhausted("no candidates to try", [])
    described = "; ".join(f"{key_of(c)}: {type(e).__name__}: {e}" for c, e in failures)
    exc = HedgeExhausted(f"all {len(failures)} candidates failed: {described}", failures)
    exc.__cause__ = failures[-1][1]
    return exc


@dataclass
class HedgeStats:
    """``primaries``: requests run; ``hedges_sent``/``hedges_won``: hedged attempts started /
    that returned first; ``budget_exhausted``: requests that wanted a hedge and had no token;
    ``failovers``: attempts started because another one failed; ``hedges_deferred``:
    requests whose hedge waited for its target to have room; ``hung_failovers``: attempts
    failed over because they outlived their hang deadline or their target was hung (see
    blobsdk/tail/health.py)."""

    primaries: int = 0
    hedges_sent: int = 0
    hedges_won: int = 0
    budget_exhausted: int = 0
    failovers: int = 0
    hedges_deferred: int = 0
    hung_failovers: int = 0
