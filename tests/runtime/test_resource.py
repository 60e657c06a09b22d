"""AsyncResource's own contract (blobsdk/runtime/resource.py): entering starts and gives the
object, a failed start is closed before its error goes on, leaving closes on success and on an
exception (never swallowing it), and the classes built on it close twice harmlessly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from blobsdk.cache import DiskCache, MemoryCache
from blobsdk.errors import ClientClosed, Unavailable
from blobsdk.runtime.resource import AsyncResource
from blobsdk.sources import LocalBlockStore


class Probe(AsyncResource):
    """Records what the base calls, in order; ``fail`` makes the start raise it."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail

    async def _start(self) -> None:
        self.calls.append("start")
        if self.fail is not None:
            raise self.fail

    async def aclose(self) -> None:
        self.calls.append("aclose")


async def test_entering_starts_and_gives_the_object_and_leaving_closes() -> None:
    probe = Probe()
    async with probe as entered:
        assert entered is probe
        assert probe.calls == ["start"]
    assert probe.calls == ["start", "aclose"]


async def test_a_failed_start_is_closed_and_its_error_goes_on() -> None:
    probe = Probe(fail=OSError("no disk"))
    with pytest.raises(OSError, match=r"^no disk$"):
        async with probe:
            raise AssertionError("the body of a failed entry never runs")
    assert probe.calls == ["start", "aclose"]


async def test_a_start_cancelled_is_closed_and_the_cancellation_goes_on() -> None:
    probe = Probe(fail=asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        async with probe:
            raise AssertionError("the body of a failed entry never runs")
    assert probe.calls == ["start", "aclose"]


async def test_leaving_by_an_exception_closes_and_never_swallows_it() -> None:
    probe = Probe()
    with pytest.raises(KeyError, match="'inside'"):
        async with probe:
            raise KeyError("inside")
    assert probe.calls == ["start", "aclose"]


async def test_a_resource_without_aclose_says_so() -> None:
    class NoClose(AsyncResource):
        pass

    with pytest.raises(NotImplementedError, match=r"^NoClose must define aclose$"):
        async with NoClose():
            pass


def test_the_base_adds_no_instance_dict_to_a_slotted_class() -> None:
    class Slotted(AsyncResource):
        __slots__ = ("x",)

        async def aclose(self) -> None:
            pass

    assert not hasattr(Slotted(), "__dict__")


async def test_closing_twice_is_harmless(tmp_path: Path) -> None:
    """A close after ``async with`` (an owner's exit stack and the caller both close) is a no-op."""
    cache = DiskCache(tmp_path / "cache", capacity_bytes=1 << 20)
    async with cache:
        assert await cache.put("0" * 32, b"x")
    await cache.aclose()
    memory = MemoryCache(capacity_bytes=1 << 20)
    async with memory:
        pass
    await memory.aclose()
    blocks = LocalBlockStore(tmp_path / "blocks")
    async with blocks:
        pass
    await blocks.aclose()


async def test_a_failed_open_closes_what_it_started(tmp_path: Path) -> None:
    """A cache and a block store whose root cannot be made: the failed entry closed them (their
    thread pools stopped), so the next call says closed rather than start the pool again."""
    (tmp_path / "file").write_bytes(b"")
    cache = DiskCache(tmp_path / "file" / "cache", capacity_bytes=1 << 20)
    with pytest.raises(Unavailable, match=r"^cache disk cannot open .*/file/cache: .*Not a directory"):
        async with cache:
            raise AssertionError("never entered")
    with pytest.raises(ClientClosed, match=r"^cache disk is closed: use async with$"):
        await cache.get("0" * 32)
    blocks = LocalBlockStore(tmp_path / "file" / "blocks")
    with pytest.raises(Unavailable, match="/file/blocks: NotADirectoryError"):
        async with blocks:
            raise AssertionError("never entered")
    with pytest.raises(ClientClosed, match=r"^block store .*/file/blocks is closed$"):
        async with blocks.block_writer("0" * 32):
            raise AssertionError("a closed store writes nothing")
