"""Which nodes hold a key: rendezvous (highest-random-weight) hashing.

Every (key, node) pair gets a pseudo-random weight, xxh3-64 of both names; a key's nodes
are all nodes sorted by weight, heaviest first.  Every client computes the same order with
no shared state, the keys spread evenly, and adding or removing one of N nodes moves only
the ~1/N of the keys whose first choice it is (DESIGN §8: L3 flash nodes).
"""

from __future__ import annotations

from collections.abc import Sequence

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
