"""What a chunk read hands the tier or engine that reads it: how to check the bytes read.

``Decoder``: a copy in its stored form -> its verified raw bytes (blobsdk/chunks/codec.py's
ChunkDecoder is one); ``Verifier``: checks raw bytes read straight into the caller's windows;
``Piece``: a whole uncompressed chunk and those windows.  Each raises BadCopy for a bad copy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..wire import ChunkRef

Decoder = Callable[[ChunkRef, memoryview], Awaitable[memoryview]]
# Checks a chunk's raw bytes in the caller's windows, one after another; raises BadCopy if bad.
Verifier = Callable[[ChunkRef, Sequence[memoryview]], None]


@dataclass(frozen=True, slots=True)
class Piece:
    """A whole uncompressed chunk and where its raw bytes go: ``windows``, one after another
    (writable byte views of the caller's memory, ``ref.raw_length`` bytes in all; several
    when the chunk straddles the caller's buffers)."""

    ref: ChunkRef
    windows: tuple[memoryview, ...]
