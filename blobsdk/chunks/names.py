"""The names of the chunk model and the rules every party applies to them alike: which names
are valid, and which nodes a name belongs to.

- **A blob's path** (DESIGN §1) is ``/bucket/key...``: absolute, a bucket and at least one key
  segment, UTF-8, at most 1024 bytes once encoded, made of non-empty segments, none of them
  ``.`` or ``..``, and no NUL.  A *prefix* for listing follows the same rules except that it
  may end with ``/``, may be just ``/`` and may name only a bucket.

  Listing (:func:`listing_prefix`): ``/`` lists every bucket; ``/a`` and ``/a/`` list bucket
  ``a`` only (never ``/a2/...``); a longer prefix is matched as a string inside its bucket, as
  S3's ListObjects does: ``/a/dir/`` lists what is under the directory, ``/a/dir`` also
  ``/a/dir2`` and ``/a/dir.x``, ``/a/logs/2024-`` every key that starts with it.

- **A block's id and a chunk's key** (:attr:`blobsdk.wire.ChunkRef.key`) become file names and
  URL segments: each is 32 lowercase hex digits.  A key is checked once, where it enters (a
  cache's public methods: blobsdk/cache/base.py ``validate_key``), and typed
  :data:`ChunkKey` thereafter: what a ref makes (:attr:`~blobsdk.wire.ChunkRef.key`, an
  xxh3-128 hex digest: a chunk key whatever the ref holds) or that check returns, so code
  that takes a ChunkKey (an engine's trusted fast path, the L1 tier's) does not check it
  again.

- **Which nodes hold a key**: rendezvous (highest-random-weight) hashing.  Every (key, node)
  pair gets a pseudo-random weight, xxh3-64 of both names; a key's nodes are all nodes sorted
  by weight, heaviest first.  Every client computes the same order with no shared state, the
  keys spread evenly, and adding or removing one of N nodes moves only the ~1/N of the keys
  whose first choice it is (DESIGN §8: L3 flash nodes; trackers shard the key space by it).
  :func:`moved` measures that fraction for two node lists, :func:`expected_moved` says what it
  tends to.

Every reader, writer, server and tracker applies all three, a read each of them.  This module
imports only errors, so wire.py can check ids with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import NewType

import xxhash

from ..errors import BadRequest, InvalidPath

# --- blob paths ------------------------------------------------------------------------------

MAX_PATH_BYTES = 1024
RESERVED_DIR = ".blobsdk"  # /{bucket}/.blobsdk/: blobsdk's own records
INDEX_DIR = f"{RESERVED_DIR}/chunks"  # the chunk index's entries: /{bucket}/.blobsdk/chunks/<32 hex>


def validate_path(path: object) -> str:
    """Return ``path`` unchanged if it is a valid blob path, else raise InvalidPath."""
    text = _check_text(path)
    if text == "/":
        raise InvalidPath("path '/' names no blob")
    segments = text[1:].split("/")
    _check_segments(text, segments)
    if len(segments) == 1:
        raise InvalidPath(f"path {text!r} names a bucket, not a blob: a blob path is /bucket/key")
    return text


def validate_prefix(prefix: object) -> str:
    """Return a valid listing prefix (``/``, ``/bucket``, ``/bucket/dir/``...)."""
    text = _check_text(prefix)
    body = text[1:]
    body = body.removesuffix("/")
    if body:
        _check_segments(text, body.split("/"))
    elif text != "/":
        raise InvalidPath(f"invalid prefix {text!r}: empty segment")
    return text


def listing_prefix(prefix: object) -> str:
    """A valid listing prefix, a bare bucket (``/a``) made ``/a/`` so that it never matches
    another bucket whose name starts with it."""
    text = validate_prefix(prefix)
    return text + "/" if text != "/" and "/" not in text[1:] else text


def validate_writable(path: object) -> str:
    """Return ``path`` unchanged if a user may write or delete it: a valid blob path outside
    the reserved namespace; else InvalidPath."""
    text = validate_path(path)
    refuse_reserved(text)
    return text


def is_reserved(path: str) -> bool:
    """Whether a valid path or prefix lies in its bucket's reserved namespace
    (``/{bucket}/.blobsdk``, or under ``/{bucket}/.blobsdk/``)."""
    parts = path.split("/", 3)
    return len(parts) >= 3 and parts[2] == RESERVED_DIR


def refuse_reserved(path: str) -> None:
    """InvalidPath if a valid path or prefix lies in the reserved namespace."""
    if is_reserved(path):
        bucket = bucket_of(path)
        raise InvalidPath(
            f"path {path!r}: /{bucket}/{RESERVED_DIR}/ is reserved for blobsdk's own records"
            " (it can be read and listed, not written or deleted)"
        )


def is_index_entry(path: str) -> bool:
    """Whether ``path`` is exactly a chunk index entry: ``/{bucket}/.blobsdk/chunks/<32 hex>``."""
    parts = path.split("/")
    return len(parts) == 5 and parts[2:4] == INDEX_DIR.split("/") and is_hex32(parts[4]) is not None


def bucket_of(path: str) -> str:
    """The bucket (first segment) of a valid path."""
    return path.split("/", 2)[1]


def _check_text(path: object) -> str:
    if not isinstance(path, str):
        raise InvalidPath(f"path must be str, not {type(path).__name__}")
    if not path:
        raise InvalidPath("path is empty")
    if "\x00" in path:
        raise InvalidPath("path contains NUL")
    if not path.startswith("/"):
        raise InvalidPath(f"path must be absolute (start with '/'): {path!r}")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidPath(f"path is not valid UTF-8: {path!r}") from exc
    if size > MAX_PATH_BYTES:
        raise InvalidPath(f"path is {size} bytes, over the limit of {MAX_PATH_BYTES}")
    return path


def _check_segments(path: str, segments: list[str]) -> None:
    for segment in segments:
        if segment == "":
            raise InvalidPath(f"empty segment ('//' or trailing '/') in {path!r}")
        if segment in (".", ".."):
            raise InvalidPath(f"'{segment}' segment in {path!r}")


# --- block ids and chunk keys ---------------------------------------------------------------

ChunkKey = NewType("ChunkKey", str)

# Whether ``text`` is exactly 32 lowercase hex digits (a match is truthy): the regex's own
# method, no frame of this module on every chunk of every plan that arrives.
is_hex32: Callable[[str], re.Match[str] | None] = re.compile(r"[0-9a-f]{32}").fullmatch


def validate_hex32(value: object, what: str) -> str:
    """Return ``value`` if it is 32 lowercase hex digits, else raise BadRequest naming it as ``what``."""
    if not isinstance(value, str) or not is_hex32(value):
        raise BadRequest(f"invalid {what} {value!r}: want 32 lowercase hex digits")
    return value


def validate_block_id(block_id: object) -> str:
    """``block_id`` if it is a block id (written or link: 32 lowercase hex digits), else BadRequest."""
    return validate_hex32(block_id, "block id")


# --- placement: which nodes hold a key --------------------------------------------------------


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
