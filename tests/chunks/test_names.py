"""blobsdk/chunks/names.py: the blob path rules, the 32-hex id rule, and rendezvous placement."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from blobsdk.cache.base import validate_key
from blobsdk.chunks import (
    bucket_of,
    expected_moved,
    is_hex32,
    listing_prefix,
    moved,
    place,
    rank,
    validate_block_id,
    validate_hex32,
    validate_path,
    validate_prefix,
)
from blobsdk.errors import BadRequest, InvalidPath
from blobsdk.sources.base import new_block_id

# --- blob paths ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/b/k", "/b/a/b/c.bin", "/b/%_*?", "/b/ünïcode", "/b/" + "x" * 1021])
def test_valid_paths(path):
    assert validate_path(path) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "path is empty"),
        ("b/k", "path must be absolute"),
        ("/", "path '/' names no blob"),
        ("/bucketx", "path '/bucketx' names a bucket, not a blob: a blob path is /bucket/key"),
        ("/b/../k", "'..' segment"),
        ("/b/./k", "'.' segment"),
        ("/..", "'..' segment"),
        ("/b//k", "empty segment"),
        ("/b/k/", "empty segment"),
        ("/b/k\x00", "path contains NUL"),
        ("/b/" + "x" * 1022, "path is 1025 bytes, over the limit of 1024"),
        ("/b/\udcff", "path is not valid UTF-8"),
        (b"/b/k", "path must be str, not bytes"),
        (None, "path must be str, not NoneType"),
    ],
)
def test_invalid_paths(path, message):
    with pytest.raises(InvalidPath, match=message.replace("?", r"\?").replace("(", r"\(")) as info:
        validate_path(path)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("prefix", ["/", "/b", "/b/", "/b/dir/", "/b/dir/pre"])
def test_valid_prefixes(prefix):
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["", "b/", "//", "/b//", "/b/../", "/b/\x00"])
def test_invalid_prefixes(prefix):
    with pytest.raises(InvalidPath):
        validate_prefix(prefix)


def test_bucket_of():
    assert bucket_of("/bucket/a/b") == "bucket"
    assert bucket_of("/bucket") == "bucket"


@pytest.mark.parametrize(
    ("prefix", "listed"),
    [("/", "/"), ("/b", "/b/"), ("/b/", "/b/"), ("/b/dir", "/b/dir"), ("/b/dir/", "/b/dir/"), ("/b/logs/2024-", "/b/logs/2024-")],
)
def test_a_bare_bucket_lists_that_bucket_only(prefix, listed):
    assert listing_prefix(prefix) == listed


def test_a_listing_prefix_is_validated():
    with pytest.raises(InvalidPath, match="empty segment"):
        listing_prefix("/b//")


# --- block ids and chunk keys --------------------------------------------------

GOOD = "0123456789abcdef" * 2


def test_hex32_is_exactly_32_lowercase_hex_digits():
    assert is_hex32(GOOD) and is_hex32(new_block_id())
    for bad in ("", GOOD[:-1], GOOD + "0", GOOD.upper(), GOOD[:-1] + "g", GOOD[:-1] + "\n", f" {GOOD[1:]}"):
        assert not is_hex32(bad), bad


@pytest.mark.parametrize("value", [GOOD.upper(), 7, None, GOOD.encode()])
def test_validators_name_what_they_refuse(value: object):
    for validate, what in ((validate_key, "chunk key"), (validate_block_id, "block id")):
        with pytest.raises(BadRequest) as caught:
            validate(value)
        assert str(caught.value) == f"invalid {what} {value!r}: want 32 lowercase hex digits"
    assert validate_key(GOOD) is validate_block_id(GOOD) is validate_hex32(GOOD, "x") is GOOD


# --- placement: rendezvous hashing ---------------------------------------------

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
