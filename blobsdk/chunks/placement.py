"""Which nodes hold a key: rendezvous (highest-random-weight) hashing.

Every (key, node) pair gets a pseudo-random weight, xxh3-64 of both names; a key's nodes
are all nodes sorted by weight, heaviest first.  Every client computes the same order with
no shared state, the keys spread evenly, and adding or removing one of N nodes moves only
the ~1/N of the keys whose first choice it is (DESIGN §8: L3 flash nodes).  :func:`moved`
measures that fraction for two node lists, :func:`expected_moved` says what it tends to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash


def weight(key: str, node: str) -> int:
    """The pseudo-random weight of ``node`` for ``key`` (a NUL keeps the two names apart)."""
    return xxhash.xxh3_64_intdigest(f"{node}\0{key}".encode())


def rank(key: str, nodes: Sequence[str]) -> list[str]:
    """Every distinct node, best first for ``key``; ties (never seen in practice) by name."""
    return sorted(dict.fromkeys(nodes), key=lambda node: (weight(key, node), node), reverse=True)


def place(key: str, nodes: Sequence[str], replicas: int = 2) -> list[str]:
    """The ``replicas`` distinct nodes that hold ``key`` (all of them if there are fewer)."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    return rank(key, nodes)[:replicas]


def moved(keys: Iterable[str], before: Sequence[str], after: Sequence[str], replicas: int = 1) -> float:
    """The fraction of ``keys`` whose ``replicas`` nodes (as a set) differ between the node
    lists ``before`` and ``after``: what a change of members costs in chunks that change nodes."""
    keys = list(keys)
    changed = sum(set(place(key, before, replicas)) != set(place(key, after, replicas)) for key in keys)
    return changed / len(keys) if keys else 0.0


def expected_moved(nodes: int, change: int, replicas: int = 1) -> float:
    """The fraction :func:`moved` tends to when one node joins (``change`` +1) or leaves
    (-1) ``nodes`` nodes: a key moves when the node is among its ``replicas`` heaviest of the
    larger list, whose order is uniform, so ``replicas/(nodes+1)`` on a join and
    ``replicas/nodes`` on a leave (ValueError for another change, or more replicas than
    the smaller list has)."""
    if change not in (1, -1):
        raise ValueError(f"change must be 1 (a node joins) or -1 (one leaves), got {change}")
    larger = nodes + 1 if change == 1 else nodes
    if not 1 <= replicas <= larger - 1:
        raise ValueError(f"replicas must be between 1 and {larger - 1}, got {replicas}")
    return replicas / larger
