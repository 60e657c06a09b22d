"""blobsdk.chunks.placement: rendezvous hashing."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from blobsdk.chunks.placement import expected_moved, moved, place, rank

NODES = [f"http://10.0.0.{i}:7201" for i in range(4)]
KEYS = [f"{i:032x}" for i in range(10_000)]


def binomial_bound(p: float, n: int = len(KEYS), sigmas: float = 4.0) -> float:
    """How far a fraction of ``n`` keys, each in with probability ``p``, may fall from ``p``:
    ``sigmas`` standard deviations of a binomial fraction (4: a hash with the spread it claims
    fails it about once in 16,000 such checks; the keys are fixed, so a pass stays a pass)."""
    return sigmas * math.sqrt(p * (1 - p) / n)


def firsts(nodes: list[str]) -> dict[str, str]:
    return {key: rank(key, nodes)[0] for key in KEYS}


def test_rank_is_deterministic_and_independent_of_the_node_order() -> None:
    for key in KEYS[:200]:
        ranked = rank(key, NODES)
        assert ranked == rank(key, list(reversed(NODES))) == rank(key, NODES)
        assert sorted(ranked) == sorted(NODES)


def test_keys_spread_evenly_over_the_nodes() -> None:
    counts = Counter(firsts(NODES).values())
    expected = len(KEYS) / len(NODES)
    assert set(counts) == set(NODES)
    assert all(abs(n - expected) <= 0.15 * expected for n in counts.values()), counts


def test_second_choices_spread_evenly_too() -> None:
    counts = Counter(place(key, NODES, 2)[1] for key in KEYS)
    expected = len(KEYS) / len(NODES)
    assert all(abs(n - expected) <= 0.15 * expected for n in counts.values()), counts


def test_adding_a_node_moves_only_the_keys_it_takes() -> None:
    before, after = firsts(NODES), firsts([*NODES, "http://10.0.0.9:7201"])
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == "http://10.0.0.9:7201" for key in moved)
    assert abs(len(moved) / len(KEYS) - 1 / 5) <= binomial_bound(1 / 5)


def test_removing_a_node_moves_only_its_keys() -> None:
    gone = NODES[1]
    before, after = firsts(NODES), firsts([n for n in NODES if n != gone])
    changed = {key for key in KEYS if before[key] != after[key]}
    assert changed == {key for key in KEYS if before[key] == gone}


@pytest.mark.parametrize(("n", "replicas"), [(n, r) for n in (2, 4, 8, 16) for r in (1, 2) if r < n])
def test_one_node_joining_n_moves_about_one_in_n_plus_1_and_one_leaving_one_in_n(n: int, replicas: int) -> None:
    nodes = [f"http://10.0.1.{i}:7201" for i in range(n + 1)]
    for before, after, change in ((nodes[:n], nodes, 1), (nodes[:n], nodes[1:n], -1)):
        expected = expected_moved(n, change, replicas)
        assert expected == (replicas / (n + 1) if change == 1 else replicas / n)
        assert abs(moved(KEYS, before, after, replicas) - expected) <= binomial_bound(expected)


def test_expected_moved_refuses_what_it_cannot_say() -> None:
    with pytest.raises(ValueError, match=r"^change must be 1 \(a node joins\) or -1 \(one leaves\), got 2$"):
        expected_moved(4, 2)
    with pytest.raises(ValueError, match=r"^replicas must be between 1 and 3, got 4$"):
        expected_moved(4, -1, 4)
    assert moved([], NODES, NODES[1:]) == 0.0


def test_removing_a_node_promotes_the_next_in_rank() -> None:
    for key in KEYS[:200]:
        ranked = rank(key, NODES)
        assert rank(key, [n for n in NODES if n != ranked[0]]) == ranked[1:]


def test_replicas_are_distinct_and_a_prefix_of_the_rank() -> None:
    for key in KEYS[:500]:
        chosen = place(key, NODES, 3)
        assert len(set(chosen)) == 3 and chosen == rank(key, NODES)[:3]


def test_duplicates_and_short_node_lists() -> None:
    assert place(KEYS[0], [NODES[0], NODES[0]], 2) == [NODES[0]]
    assert place(KEYS[0], NODES[:2], 5) == rank(KEYS[0], NODES[:2])
    assert place(KEYS[0], [], 2) == []
    with pytest.raises(ValueError):
        place(KEYS[0], NODES, 0)
