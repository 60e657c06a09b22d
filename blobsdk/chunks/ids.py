"""The one rule for the ids that become file names and URL segments: chunk keys
(:attr:`blobsdk.wire.ChunkRef.key`) and block ids are 32 lowercase hex digits."""

from __future__ import annotations

import re

from ..errors import BadRequest

_HEX32 = re.compile(r"[0-9a-f]{32}")


def is_hex32(text: str) -> bool:
    """Whether ``text`` is exactly 32 lowercase hex digits."""
    return _HEX32.fullmatch(text) is not None


def validate_hex32(value: object, what: str) -> str:
    """Return ``value`` if it is 32 lowercase hex digits, else raise BadRequest naming it as ``what``."""
    if not isinstance(value, str) or not is_hex32(value):
        raise BadRequest(f"invalid {what} {value!r}: want 32 lowercase hex digits")
    return value


def validate_block_id(block_id: object) -> str:
    """``block_id`` if it is a block id (written or link: 32 lowercase hex digits), else BadRequest."""
    return validate_hex32(block_id, "block id")
