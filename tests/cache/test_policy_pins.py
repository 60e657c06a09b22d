"""Eviction past pinned entries (blobsdk/cache/policy.py): pinned entries at the least
recently used end are moved out of the way once, not walked past by every eviction."""

from __future__ import annotations

from blobsdk.cache.policy import Entry, Index, PolicyChain

from .walked import Walked


def _index(size: int, pinned: int) -> Index:
    index = Index()
    for n in range(size):
        index.add(Entry(f"{n:032x}", 1, 0.0, 0.0, pin_until=100.0 if n < pinned else 0.0))
    index.lru = Walked(index.lru)
    return index


def test_a_full_cache_with_pinned_entries_at_its_lru_end_evicts_in_constant_steps() -> None:
    index, chain = _index(2000, pinned=1000), PolicyChain()
    Walked.walked = 0
    for n in range(200):  # each put evicts one entry
        victims = chain.admit(index, Entry(f"{10_000 + n:032x}", 1, 1.0, 1.0), capacity=2000, now=1.0)
        assert victims is not None and len(victims) == 1
        index.add(Entry(f"{10_000 + n:032x}", 1, 1.0, 1.0))
    assert Walked.walked <= 1000 + 4 * 200  # 1,600; before: every put walked past the 1,000 pinned (200,400)


def test_pinned_entries_passed_over_move_to_the_recent_end_in_their_order() -> None:
    index, chain = _index(6, pinned=2), PolicyChain()
    victims = chain.admit(index, Entry("f" * 32, 1, 1.0, 1.0), capacity=6, now=1.0)
    assert victims is not None and [e.key for _, e in victims] == [f"{2:032x}"]
    assert list(index.lru) == [f"{n:032x}" for n in (3, 4, 5, 0, 1)]
    assert all(e.last_access == 0.0 for e in index.lru.values())  # times unchanged: only the order


def test_an_index_of_only_pinned_entries_moves_each_once_and_admits_nothing() -> None:
    index, chain = _index(3, pinned=3), PolicyChain()
    assert chain.admit(index, Entry("f" * 32, 1, 1.0, 1.0), capacity=3, now=1.0) is None
    assert list(index.lru) == [f"{n:032x}" for n in range(3)] and len(index) == 3
