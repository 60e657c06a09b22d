"""blobsdk.tail.hedgestate: what the hedger and its race share, which errors fail over to the
next candidate, and the error once every candidate failed."""

from __future__ import annotations

import pytest

from blobsdk.errors import BadCopy, BadRequest, BlockNotFound, HedgeExhausted, InvalidPath, Unavailable
from blobsdk.tail import hedge
from blobsdk.tail.hedgestate import HedgeStats, exhausted, is_failover
from tests.helpers import ROOT
from tests.project.test_imports import import_edges


@pytest.mark.parametrize("error", [Unavailable("down"), BadCopy("bad bytes"), BlockNotFound("gone")])
def test_an_error_about_one_candidate_fails_over(error: BaseException) -> None:
    assert is_failover(error)


@pytest.mark.parametrize("error", [BadRequest("bad range"), InvalidPath("bad path"), RuntimeError("bug"), KeyError("k")])
def test_an_error_about_the_request_or_a_bug_does_not(error: BaseException) -> None:
    assert not is_failover(error)


def test_exhausted_describes_every_failure_in_order_with_the_last_as_its_cause() -> None:
    first, last = Unavailable("refused"), BadCopy("checksum")
    exc = exhausted([("a", first), ("b", last)], key_of=str.upper)
    assert isinstance(exc, HedgeExhausted)
    assert str(exc) == "all 2 candidates failed: A: Unavailable: refused; B: BadCopy: checksum"
    assert exc.failures == [("a", first), ("b", last)]
    assert exc.__cause__ is last


def test_exhausted_with_no_candidate_says_so() -> None:
    exc = exhausted([], key_of=str)
    assert str(exc) == "no candidates to try" and exc.failures == [] and exc.__cause__ is None


def test_the_hedger_counts_in_the_shared_stats_and_still_names_them() -> None:
    assert hedge.HedgeStats is HedgeStats and hedge.is_failover is is_failover
    assert HedgeStats() == HedgeStats(0, 0, 0, 0, 0, 0, 0)


def test_the_race_imports_nothing_of_the_hedger_not_even_for_typing() -> None:
    """hedge.py runs races (it imports race.py); race.py names what it uses of its hedger as a
    protocol (RaceHost), and what both share is in hedgestate.py: no cycle, typing-only ones
    included."""
    edges = {(e.source, e.target) for e in import_edges(ROOT, ("blobsdk",))}
    assert ("blobsdk.tail.hedge", "blobsdk.tail.race") in edges
    assert ("blobsdk.tail.race", "blobsdk.tail.hedge") not in edges
    assert not {t for s, t in edges if s == "blobsdk.tail.hedgestate"} & {"blobsdk.tail.hedge", "blobsdk.tail.race"}
