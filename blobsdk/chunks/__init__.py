"""The ground package: the chunk model every role shares (the id rule, the rules of a read
plan, placement by rendezvous hashing, stored bytes to verified raw bytes, a chunk read's
pieces) and what one chunk read carries across the layers (its ``Call``: demand, grant, an
attempt's hooks).  It
imports only errors and wire.

Every name but the id rule loads its module on first use: wire checks ids with
``chunks/ids.py``, and Python runs this face first, while wire is half-made; the modules
behind the other names import wire."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .ids import ChunkKey, is_hex32, validate_block_id, validate_hex32

if TYPE_CHECKING:
    from .call import AttemptFn, Call, Demand, Priority
    from .codec import ChunkDecoder, decode_chunk, verify_raw, verify_windows
    from .pieces import Decoder, Piece, Verifier
    from .placement import place, rank
    from .plans import check_plan, checked_plan

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
        "place": "placement",
        "rank": "placement",
        "check_plan": "plans",
        "checked_plan": "plans",
    },
)

__all__ = [
    "AttemptFn",
    "Call",
    "ChunkDecoder",
    "ChunkKey",
    "Decoder",
    "Demand",
    "Piece",
    "Priority",
    "Verifier",
    "check_plan",
    "checked_plan",
    "decode_chunk",
    "is_hex32",
    "place",
    "rank",
    "validate_block_id",
    "validate_hex32",
    "verify_raw",
    "verify_windows",
]
