"""The ground package: the chunk model every role shares (its names and their rules: blob
paths, block ids and chunk keys, placement by rendezvous hashing; stored bytes to verified
raw bytes; a chunk read's pieces) and what one chunk read carries across the layers (its
``Call``: demand, grant, an attempt's hooks).  It imports only errors and wire.  The rules a
read plan obeys are wire's (``check_plan``, ``checked_plan``), beside the structs they check.

Every name but those of ``chunks/names.py`` loads its module on first use: wire checks ids
with ``chunks/names.py``, and Python runs this face first, while wire is half-made; the
modules behind the other names import wire."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .names import (
    INDEX_DIR,
    MAX_PATH_BYTES,
    RESERVED_DIR,
    ChunkKey,
    bucket_of,
    expected_moved,
    is_hex32,
    is_index_entry,
    is_reserved,
    listing_prefix,
    moved,
    place,
    rank,
    refuse_reserved,
    validate_block_id,
    validate_hex32,
    validate_path,
    validate_prefix,
    validate_writable,
)

if TYPE_CHECKING:
    from .call import AttemptFn, Call, Demand, Priority
    from .codec import ChunkDecoder, decode_chunk, verify_raw, verify_windows
    from .pieces import Decoder, Piece, Verifier

__getattr__ = lazy_names(
    __name__,
    {
        "AttemptFn": "call",
        "Call": "call",
        "Demand": "call",
        "Priority": "call",
        "ChunkDecoder": "codec",
        "decode_chunk": "codec",
        "verify_raw": "codec",
        "verify_windows": "codec",
        "Decoder": "pieces",
        "Piece": "pieces",
        "Verifier": "pieces",
    },
)

__all__ = [
    "INDEX_DIR",
    "MAX_PATH_BYTES",
    "RESERVED_DIR",
    "AttemptFn",
    "Call",
    "ChunkDecoder",
    "ChunkKey",
    "Decoder",
    "Demand",
    "Piece",
    "Priority",
    "Verifier",
    "bucket_of",
    "decode_chunk",
    "expected_moved",
    "is_hex32",
    "is_index_entry",
    "is_reserved",
    "listing_prefix",
    "moved",
    "place",
    "rank",
    "refuse_reserved",
    "validate_block_id",
    "validate_hex32",
    "validate_path",
    "validate_prefix",
    "validate_writable",
    "verify_raw",
    "verify_windows",
]
