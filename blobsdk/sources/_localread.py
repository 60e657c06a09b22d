"""The local block store's reads (blobsdk/sources/_local.py): blocking functions, run on the
store's thread pool, each of which opens the block's file (never through a symlink), checks
that the bytes asked for lie inside it, reads them and closes it.

:func:`read_spans_sync` reads many spans of one block with one open: each run of spans in
order (adjacent, or at most :data:`GAP_BYTES` apart; up to :data:`RUN_BYTES`) with one
``preadv`` into their windows, then each span of the run is handed to the caller's check
while its bytes are still warm in the cache.  A restore's chunks so cost one thread hop and
one open per group, not per chunk.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..errors import BlobError, BlockNotFound, CorruptData
from ..runtime import RootDir, open_regular
from .base import Span, SpanCheck

# os.preadv and os.writev take at most IOV_MAX buffers per call.
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
# A run of spans read with one preadv stops growing past this: its bytes are checked right
# after, while the last of them may still be in the CPU's cache.
RUN_BYTES = 4 << 20
# Spans at most this far apart in a block are read in one run, the bytes between them into a
# scratch buffer: a syscall per span costs more than copying a few pages more (a restore of
# 16,000 refs of ~16 KiB, 10,000 runs: 110 ms of reads on one thread without, 90 ms with).
GAP_BYTES = 64 << 10


def open_block(root: RootDir, shard: str, block_id: str) -> int:
    """An fd of the block; BlockNotFound if there is none, UnsafeEntry if its shard or its
    file is a symlink or not what the layout puts there."""
    try:
        with root.shard(shard) as dir_fd:
            return open_regular(dir_fd, block_id, root.entry_path(shard, block_id))
    except FileNotFoundError:
        raise BlockNotFound(f"block {block_id} not found") from None


@contextmanager
def _open_span(root: RootDir, shard: str, block_id: str, offset: int, length: int) -> Iterator[int]:
    """An fd of the block, once ``offset + length`` is known to lie inside it."""
    fd = open_block(root, shard, block_id)
    try:
        size = os.fstat(fd).st_size
        if offset + length > size:
            raise _past_end(block_id, offset, length, size)
        yield fd
    finally:
        os.close(fd)


def _past_end(block_id: str, offset: int, length: int, size: int) -> CorruptData:
    return CorruptData(f"range {offset}+{length} is past the end of block {block_id} ({size} bytes)")


def read_into_sync(root: RootDir, shard: str, block_id: str, offset: int, out: memoryview) -> None:
    with _open_span(root, shard, block_id, offset, out.nbytes) as fd:
        preadv_all(fd, block_id, offset, [out])


def read_range_sync(root: RootDir, shard: str, block_id: str, offset: int, length: int) -> bytes:
    with _open_span(root, shard, block_id, offset, length) as fd:
        return _pread_exact(fd, block_id, offset, length)


def read_clipped_sync(root: RootDir, shard: str, block_id: str, offset: int, length: int) -> tuple[bytes, int]:
    fd = open_block(root, shard, block_id)
    try:
        size = os.fstat(fd).st_size
        inside = min(length, size - offset)
        return (_pread_exact(fd, block_id, offset, inside) if inside > 0 else b""), size
    finally:
        os.close(fd)


def read_spans_sync(
    root: RootDir,
    shard: str,
    block_id: str,
    spans: Sequence[Span],
    check: SpanCheck | None,
    stop: threading.Event,
) -> list[BlobError | None]:
    """Every span of the block read into its windows, and checked (see the module docstring
    and :meth:`~blobsdk.sources.base.SpanReader.read_spans`); stops between runs once
    ``stop`` is set (its caller was cancelled and waits for this to end)."""
    fd = open_block(root, shard, block_id)
    try:
        size = os.fstat(fd).st_size
        outcomes: list[BlobError | None] = [None] * len(spans)
        for run in _runs(spans, size, outcomes, block_id):
            if stop.is_set():
                break
            _read_run(fd, block_id, run)
            if check is not None:
                for i in run.spans:
                    try:
                        check(i)
                    except BlobError as exc:
                        outcomes[i] = exc
        return outcomes
    finally:
        os.close(fd)


class _Run:
    """Spans read with one preadv: from ``offset``, ``nbytes`` bytes into ``views`` (their
    windows, and a scratch ``sink`` for each gap of at most GAP_BYTES between them)."""

    __slots__ = ("nbytes", "offset", "spans", "views")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.spans: list[int] = []
        self.views: list[memoryview] = []
        self.nbytes = 0


def _runs(spans: Sequence[Span], size: int, outcomes: list[BlobError | None], block_id: str) -> Iterator[_Run]:
    """``spans`` in runs to read with one preadv each: in order in the block, each beginning
    where the last ended or at most GAP_BYTES after it, at most RUN_BYTES (or one span) and
    IOV_MAX views; a span past the end of the block is in none, its outcome CorruptData."""
    run: _Run | None = None
    sink = memoryview(bytearray(GAP_BYTES)) if len(spans) > 1 else memoryview(b"")
    for i, span in enumerate(spans):
        if span.offset + span.length > size:
            outcomes[i] = _past_end(block_id, span.offset, span.length, size)
            continue
        if run is not None:
            gap = span.offset - run.offset - run.nbytes
            full = run.nbytes + gap + span.length > RUN_BYTES or len(run.views) + 1 + len(span.windows) > IOV_MAX
            if full or not 0 <= gap <= GAP_BYTES:
                yield run
                run = None
            elif gap:
                run.views.append(sink[:gap])
                run.nbytes += gap
        if run is None:
            run = _Run(span.offset)
        run.spans.append(i)
        run.views.extend(span.windows)
        run.nbytes += span.length
    if run is not None:
        yield run


def _read_run(fd: int, block_id: str, run: _Run) -> None:
    """Fill a run's views (one preadv, unless it reads less than asked or one span has more
    than IOV_MAX windows)."""
    done = os.preadv(fd, run.views, run.offset) if run.nbytes and len(run.views) <= IOV_MAX else 0
    if done < run.nbytes:
        preadv_all(fd, block_id, run.offset + done, skip(run.views, done))


def _pread_exact(fd: int, block_id: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``, which lie inside the block (it was fstat'ed)."""
    data = os.pread(fd, length, offset)  # one read, no extra copy: the common case
    if len(data) == length:
        return data
    buf = bytearray(length)  # a short read: fill the rest the careful way
    buf[: len(data)] = data
    preadv_all(fd, block_id, offset + len(data), [memoryview(buf)[len(data) :]])
    return bytes(buf)


def preadv_all(fd: int, block_id: str, offset: int, views: list[memoryview]) -> None:
    """Fill ``views`` one after another with the bytes at ``offset`` (preadv may read less
    than asked: go on from there)."""
    views = [v for v in views if v.nbytes]
    while views:
        n = os.preadv(fd, views[:IOV_MAX], offset)
        if n == 0:
            raise CorruptData(f"block {block_id} shrank while it was read")
        offset += n
        views = skip(views, n)


def skip(views: list[memoryview], nbytes: int) -> list[memoryview]:
    """The views left after ``nbytes`` of them were read or written (a short preadv or writev)."""
    i = 0
    while i < len(views) and nbytes >= views[i].nbytes:
        nbytes -= views[i].nbytes
        i += 1
    rest = views[i:]
    if rest and nbytes:
        rest[0] = rest[0][nbytes:]
    return rest
