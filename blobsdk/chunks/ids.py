"""The one rule for the ids that become file names and URL segments: chunk keys
(:attr:`blobsdk.wire.ChunkRef.key`) and block ids are 32 lowercase hex digits.

A key is checked once, where it enters (a cache's public methods: blobsdk/cache/base.py
``validate_key``), and typed :data:`ChunkKey` thereafter: what a ref makes
(:attr:`~blobsdk.wire.ChunkRef.key`, an xxh3-128 hex digest: a chunk key whatever the ref
holds) or that check returns, so code that takes a ChunkKey (an engine's trusted fast path,
the L1 tier's) does not check it again."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NewType

from ..errors import BadRequest

ChunkKey = NewType("ChunkKey", str)

# Whether ``text`` is exactly 32 lowercase hex digits (a match is truthy): the regex's own
# method, no frame of this module on every chunk of every plan that arrives.
is_hex32: Callable[[str], re.Match[str] | None] = re.compile(r"[0-9a-f]{32}").fullmatch


def validate_hex32(value: object, what: str) -> str:
    """Return ``value`` if it is 32 lowercase hex digits, else raise BadRequest naming it as ``what``."""
    if not isinstance(value, str) or not is_hex32(value):
        raise BadRequest(f"invalid {what} {value!r}: want 32 lowercase hex digits")
    return value
