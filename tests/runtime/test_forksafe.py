"""blobsdk/runtime/forksafe.py: a fork waits for blobsdk's loop threads and executors to be quiet,
so a child never inherits a lock one of them held (the DataLoader worker hang)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import blobsdk
from blobsdk.runtime.forksafe import Executor, LoopThread
from tests.helpers import wait_for_child

HOLD_S = 0.002  # each step holds the lock this long, back to back: ~always held


async def hold_forever(lock: threading.Lock, executor: Executor) -> None:
    """Hold ``lock`` in turns on the loop thread and in an executor job, without a break."""
    loop = asyncio.get_running_loop()
    while True:
        _hold(lock)  # blocking the loop thread on purpose: a callback mid-call
        await loop.run_in_executor(executor, _hold, lock)
        await asyncio.to_thread(_hold, lock)  # the loop's default executor


def _hold(lock: threading.Lock) -> None:
    with lock:
        time.sleep(HOLD_S)


@pytest.fixture
def busy() -> Iterator[threading.Lock]:
    """A lock that blobsdk threads hold nearly all the time, until the test ends."""
    lock = threading.Lock()
    thread = LoopThread("test-busy").start()
    executor = Executor(max_workers=2)
    job = asyncio.run_coroutine_threadsafe(hold_forever(lock, executor), thread.loop)
    time.sleep(0.05)
    yield lock
    job.cancel()
    thread.stop()
    executor.shutdown()


def fork_and_take(lock: threading.Lock) -> int:
    """Fork a child that exits 0 if it can take ``lock``, 1 if it is held forever there."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if lock.acquire(timeout=1.0) else 1)
    return wait_for_child(pid)


def test_no_lock_a_blobsdk_thread_held_is_held_in_a_forked_child(busy: threading.Lock) -> None:
    assert [fork_and_take(busy) for _ in range(20)] == [0] * 20
    assert busy.acquire(timeout=1.0)  # and the parent's threads went on after each fork
    busy.release()


def test_a_fork_from_a_loop_thread_itself_is_not_held_up() -> None:
    thread = LoopThread("test-self").start()

    async def fork_here() -> int:
        pid = os.fork()  # on the loop thread, which cannot park for it
        if pid == 0:  # pragma: no cover - the child
            os._exit(0)
        return pid

    try:
        start = time.monotonic()
        pid = asyncio.run_coroutine_threadsafe(fork_here(), thread.loop).result(timeout=10)
        assert time.monotonic() - start < 1  # not PAUSE_TIMEOUT_S waiting for itself
        assert wait_for_child(pid) == 0
    finally:
        thread.stop()


def test_a_sync_client_busy_reading_in_the_parent_lets_forked_children_open_their_own(tmp_path: Path) -> None:
    paths = [f"/f/{i:03d}" for i in range(200)]
    with blobsdk.SyncClient.local(tmp_path / "store") as client:
        client.put_many((p, p.encode() * 1000) for p in paths)
        reading = client.readahead(paths * 5, depth=16)
        next(reading)  # the parent's loop and executors are busy reading ahead
        for _ in range(5):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                with blobsdk.SyncClient.local(tmp_path / "store") as child:
                    os._exit(0 if child.get(paths[7]) == paths[7].encode() * 1000 else 1)
            assert wait_for_child(pid) == 0
            next(reading)
        reading.close()


def test_a_loop_thread_runs_nothing_until_started() -> None:
    """Made idle (no thread, not parked at forks); start() runs it, stop() ends it."""
    from blobsdk.runtime.forksafe import _registry

    thread = LoopThread("test-idle")
    assert not thread.thread.is_alive()
    assert thread not in _registry()._loops
    assert thread.start() is thread
    assert thread.thread.is_alive()
    assert thread in _registry()._loops
    thread.stop()
    assert not thread.thread.is_alive()
    assert thread not in _registry()._loops
