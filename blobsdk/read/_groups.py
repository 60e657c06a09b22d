"""A one-off read's whole chunks, read straight into the caller's memory in groups (see
blobsdk/read/readpath.py, ``ReadPath._start_groups``): which of a read's jobs are whole
chunks and which windows of the output they fill, and the groups a block's chunks gather
into, in the order of their offsets.  Arithmetic on chunk refs and memory views only: no
tier, no I/O.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator

from ..chunks import Piece
from ..wire import ChunkRef

Job = tuple[memoryview, int, ChunkRef, int]  # (output window, its blob offset, chunk, the chunk's blob offset)


def _window(out: memoryview, start: int, ref: ChunkRef, chunk_start: int) -> memoryview:
    """The part of output window ``out`` (beginning at blob offset ``start``) that chunk
    ``ref`` (beginning at ``chunk_start``) fills."""
    lo = max(chunk_start, start)
    hi = min(chunk_start + ref.raw_length, start + len(out))
    return out[lo - start : hi - start]


def direct_kind(ref: ChunkRef) -> bool:
    """Whether a chunk can be read straight into the caller's memory: stored uncompressed."""
    return ref.codec == "none" and ref.length == ref.raw_length and ref.raw_length > 0


def copy_into(raw: memoryview, windows: tuple[memoryview, ...]) -> None:
    """A chunk's raw bytes into its windows, one after another."""
    at = 0
    for window in windows:
        window[:] = raw[at : at + window.nbytes]
        at += window.nbytes


def chunks_of(jobs: list[Job]) -> Iterator[tuple[list[Job], tuple[memoryview, ...] | None]]:
    """Each chunk's jobs (consecutive: the jobs are in blob order, and a chunk that straddles
    output windows has one in each) and, when they cover all of it, its windows in order."""
    i, n = 0, len(jobs)
    while i < n:
        out, start, ref, chunk_start = jobs[i]
        lo = chunk_start - start
        if lo >= 0 and lo + ref.raw_length <= out.nbytes:  # in one window: the common case
            yield jobs[i : i + 1], (out[lo : lo + ref.raw_length],)
            i += 1
            continue
        j = i + 1
        while j < n and jobs[j][3] == chunk_start and jobs[j][2] is ref:
            j += 1
        same = jobs[i:j]
        windows = tuple(_window(*job) for job in same)
        yield same, (windows if lo >= 0 and sum(w.nbytes for w in windows) == ref.raw_length else None)
        i = j


class Filling:
    """The chunks of one block a one-off read is gathering into its next group."""

    __slots__ = ("nbytes", "pieces")

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.nbytes = 0

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.nbytes += piece.ref.length

    def take(self) -> list[Piece]:
        """The group gathered, in the order of the chunks' offsets; empty again."""
        group = sorted(self.pieces, key=_offset)
        self.pieces, self.nbytes = [], 0
        return group


_offset = operator.attrgetter("ref.offset")


def starts_of(windows: tuple[memoryview, ...]) -> Iterator[int]:
    """Where each of a chunk's windows begins in the chunk."""
    return itertools.accumulate((w.nbytes for w in windows), initial=0)
