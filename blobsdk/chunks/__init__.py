"""The ground package: the chunk model every role shares (the id rule, the rules of a read
plan, placement by rendezvous hashing, stored bytes to verified raw bytes, a chunk read's
pieces) and the contracts of one call (its ``Demand``, a hedged request's ``Attempt``).  It
imports only errors and wire.

Every name but the id rule loads its module on first use: wire checks ids with
``chunks/ids.py``, and Python runs this face first, while wire is half-made; the modules
behind the other names import wire."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .ids import is_hex32, validate_hex32

if TYPE_CHECKING:
    from .attempt import Attempt
    from .codec import ChunkDecoder, decode_chunk, verify_raw, verify_windows
    from .demand import Demand, Priority
    from .pieces import Decoder, Piece, Verifier
    from .placement import place, rank
    from .plans import check_plan, checked_plan

__getattr__ = lazy_names(
    __name__,
    {
        "Attempt": "attempt",
        "ChunkDecoder": "codec",
        "decode_chunk": "codec",
        "verify_raw": "codec",
        "verify_windows": "codec",
        "Demand": "demand",
        "Priority": "demand",
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
    "Attempt",
    "ChunkDecoder",
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
    "validate_hex32",
    "verify_raw",
    "verify_windows",
]
