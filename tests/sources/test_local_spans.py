"""LocalBlockStore.read_spans: many spans of one block in one job, one preadv per run."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from blobsdk.errors import BadCopy, BadRequest, BlockNotFound, ClientClosed, CorruptData
from blobsdk.sources import LocalBlockStore, _localread
from blobsdk.sources.base import Span, SpanReader, new_block_id

BLOCK = 1 << 20


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LocalBlockStore]:
    async with LocalBlockStore(tmp_path / "blocks") as s:
        yield s


@pytest.fixture
async def block(store: LocalBlockStore) -> tuple[str, bytes]:
    block_id, data = new_block_id(), os.urandom(BLOCK)
    await store.write_block(block_id, [data])
    return block_id, data


def span(offset: int, *sizes: int) -> Span:
    """A span of ``sum(sizes)`` bytes at ``offset``, read into one fresh window per size."""
    return Span(offset, sum(sizes), tuple(memoryview(bytearray(n)) for n in sizes))


def read_of(s: Span) -> bytes:
    return b"".join(bytes(w) for w in s.windows)


class PreadvCalls:
    """Counts os.preadv calls (made on the store's threads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = os.preadv

        def counted(fd: int, views: list[memoryview], offset: int) -> int:
            self.count += 1
            return real(fd, views, offset)

        monkeypatch.setattr(_localread.os, "preadv", counted)


async def test_spans_land_in_their_windows_adjacent_ones_in_one_preadv(
    store: LocalBlockStore, block: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    block_id, data = block
    calls = PreadvCalls(monkeypatch)
    gap = _localread.GAP_BYTES
    spans = [
        span(0, 100),
        span(100, 50, 0, 7),  # adjacent, into three windows (one empty)
        span(157 + 10, 300),  # a small gap: bridged
        span(467 + gap + 1, 1000),  # too far: a new run
        span(BLOCK - 10, 10),  # the last bytes
    ]
    assert isinstance(store, SpanReader)
    assert await store.read_spans(block_id, spans) == [None] * 5
    for s in spans:
        assert read_of(s) == data[s.offset : s.offset + s.length]
    assert calls.count == 3  # [0, 100, 167] in one run, then each of the other two


async def test_a_run_stops_at_run_bytes_and_out_of_order_spans_are_read_too(
    store: LocalBlockStore, block: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    block_id, data = block
    monkeypatch.setattr(_localread, "RUN_BYTES", 1000)
    calls = PreadvCalls(monkeypatch)
    spans = [span(0, 600), span(600, 600), span(1200, 300), span(100, 50)]  # the last goes back: a run of its own
    assert await store.read_spans(block_id, spans) == [None] * 4
    assert [read_of(s) for s in spans] == [data[s.offset : s.offset + s.length] for s in spans]
    assert calls.count == 3  # [0], [600, 1200], [100]


async def test_each_span_is_checked_once_in_order_and_its_error_kept(store: LocalBlockStore, block: tuple[str, bytes]) -> None:
    block_id, data = block
    spans = [span(0, 10), span(10, 10), span(BLOCK - 5, 10), span(50, 10)]
    seen: list[tuple[int, bytes]] = []

    def check(i: int) -> None:
        seen.append((i, read_of(spans[i])))
        if i == 1:
            raise BadCopy("span 1 is bad")

    outcomes = await store.read_spans(block_id, spans, check=check)
    assert seen == [(0, data[0:10]), (1, data[10:20]), (3, data[50:60])]  # the span past the end is neither read nor checked
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], BadCopy) and str(outcomes[1]) == "span 1 is bad"
    assert isinstance(outcomes[2], CorruptData)
    assert str(outcomes[2]) == f"range {BLOCK - 5}+10 is past the end of block {block_id} ({BLOCK} bytes)"


async def test_a_span_with_more_windows_than_iov_max_is_read_whole(
    store: LocalBlockStore, block: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    block_id, data = block
    monkeypatch.setattr(_localread, "IOV_MAX", 4)
    spans = [span(0, *[3] * 10), span(30, 5), span(35, 1, 1, 1)]
    assert await store.read_spans(block_id, spans) == [None] * 3
    assert [read_of(s) for s in spans] == [data[0:30], data[30:35], data[35:38]]


async def test_errors_about_the_whole_block_raise(store: LocalBlockStore, tmp_path: Path) -> None:
    with pytest.raises(BlockNotFound, match=r"^block 0{32} not found$"):
        await store.read_spans("0" * 32, [span(0, 1)])
    with pytest.raises(BadRequest, match=r"^invalid block id 'nope': want 32 lowercase hex digits$"):
        await store.read_spans("nope", [span(0, 1)])
    with pytest.raises(BadRequest, match=r"^offset and length must not be negative, got -1 and 1$"):
        await store.read_spans("0" * 32, [span(-1, 1)])
    closed = LocalBlockStore(tmp_path / "closed")
    await closed.aclose()
    with pytest.raises(ClientClosed, match=r"^block store .*closed is closed$"):
        await closed.read_spans("0" * 32, [span(0, 1)])


async def test_a_cancelled_read_stops_at_its_next_run_and_ends_before_the_cancellation_goes_on(
    store: LocalBlockStore, block: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing writes into the windows once ``read_spans`` is over, cancelled included: the
    cancelled call waits for its job, which reads no run after the one it is in."""
    block_id, data = block
    monkeypatch.setattr(_localread, "RUN_BYTES", 1)  # every span a run of its own
    spans = [span(i * 100, 100) for i in range(5)]
    loop = asyncio.get_running_loop()
    started, release = asyncio.Event(), threading.Event()
    checked: list[int] = []

    def check(i: int) -> None:
        if i == 0:
            loop.call_soon_threadsafe(started.set)
            release.wait()
        checked.append(i)

    read = asyncio.create_task(store.read_spans(block_id, spans, check=check))
    await started.wait()
    read.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not read.done()  # waiting for its job, which may still write
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert checked == [0]
    assert read_of(spans[0]) == data[:100] and all(read_of(s) == bytes(100) for s in spans[1:])
