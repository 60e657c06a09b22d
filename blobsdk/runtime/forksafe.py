"""blobsdk's threads are quiet when the process forks.

A child forked while another thread holds a lock inherits the lock held, with no thread to
release it: a DataLoader worker forked while the parent's client was inside SQLite (its
global mutex), an import (the module's import lock) or a logging handler hung on its first
use of the same.  So every thread blobsdk starts is either a :class:`LoopThread` (a
``SyncClient``'s event loop) or a worker of an :class:`Executor`, and an ``os.fork`` hook,
before the fork, parks each loop thread between two callbacks (nothing of blobsdk runs
there mid-call) and then waits for every executor's jobs in flight to end; after it, in the
parent, the loops go on.  A loop that does not park within :data:`PAUSE_TIMEOUT_S` (a
callback that blocks, or the fork is called from that loop's own thread) is left running and
logged: the fork is never held up for long.

The registry of live loops and executors is per process by nature (so are fork hooks): a
forked child starts with an empty one (blobsdk/runtime/here.py sets the parent's aside), as it
inherits no thread to pause.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, Self, TypeVar

from .here import Held

PAUSE_TIMEOUT_S = 5.0  # at most this long before a fork for blobsdk's threads to go quiet

_log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


class Executor(ThreadPoolExecutor):
    """A ThreadPoolExecutor that counts its jobs in flight, so a fork can wait for none, and
    that still runs jobs at interpreter exit.

    Python stops every ThreadPoolExecutor's workers in threading's exit hook, which runs
    before ``atexit`` handlers and ``multiprocessing``'s finalizers, and from then on the
    executor refuses work ("cannot schedule new futures after shutdown"), as if shut down;
    Python 3.12 also starts no new thread then.  A client closed (or used) from an ``atexit``
    handler, or by a dataset's exit finalizer, needs its executors' jobs to run all the same:
    so once refused without :meth:`shutdown` having been called, a job runs in the thread that
    submits it (blocking it: at exit, only the closing work is left)."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers, thread_name_prefix)
        self._busy = 0
        self._idle = threading.Condition()
        self._closing = False  # shutdown() called: a refused job is an error, not the interpreter's exit
        _registry().add_executor(self)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._idle:
            self._busy += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except RuntimeError:
            if self._closing:
                self._job_ended()
                raise
            future = _run_here(fn, *args, **kwargs)  # the interpreter is exiting
        except BaseException:
            self._job_ended()
            raise
        future.add_done_callback(self._job_ended)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closing = True
        super().shutdown(wait, cancel_futures=cancel_futures)

    def _job_ended(self, _: object = None) -> None:
        with self._idle:
            self._busy -= 1
            if not self._busy:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """True once no job is in flight; False if one still is after ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)


def _run_here(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
    """``fn`` run now, in this thread, as a done future (an exception is its outcome, as in a
    worker)."""
    future: Future[T] = Future()
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future, as a worker does
        future.set_exception(exc)
    else:
        future.set_result(result)
    return future


class LoopThread:
    """An event loop running forever on its own daemon thread, with a default executor of
    blobsdk's own (:class:`Executor`), parked at every fork of this process.  Made idle;
    :meth:`start` starts the thread (and returns the LoopThread), :meth:`stop` ends it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._executor = Executor(thread_name_prefix=f"{name}-io")
        self.loop.set_default_executor(self._executor)
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._parked = threading.Event()
        self._resume = threading.Event()

    def start(self) -> Self:
        """Run the loop on its thread, parked at every fork from now on."""
        self.thread.start()
        _registry().add_loop(self)
        return self

    def stop(self) -> None:
        """Stop the loop, join its thread, shut its executor down and close it."""
        _registry().discard_loop(self)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        # Not loop.shutdown_default_executor(): running this loop again here fails when the
        # caller's thread runs a loop of its own (a dataset's client closed by gc in async code).
        self._executor.shutdown(wait=True)
        self.loop.close()

    def pause(self, deadline: float) -> bool:
        """Park the loop's thread between callbacks until :meth:`resume`; False if it did not
        park by ``deadline`` (time.monotonic) or this is that thread."""
        if threading.current_thread() is self.thread or not self.thread.is_alive():
            return False
        self._parked.clear()
        self._resume.clear()
        try:
            self.loop.call_soon_threadsafe(self._park)
        except RuntimeError:  # closed meanwhile
            return False
        return self._parked.wait(max(0.0, deadline - time.monotonic()))

    def resume(self) -> None:
        self._resume.set()

    def _park(self) -> None:
        self._parked.set()
        self._resume.wait(PAUSE_TIMEOUT_S)  # never parked for good, even if resume is lost


class _Registry:
    """The live loop threads and executors of this process, quieted around a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops: set[LoopThread] = set()
        self._executors: weakref.WeakSet[Executor] = weakref.WeakSet()  # dropped when collected
        self._paused: list[LoopThread] = []

    def add_loop(self, loop: LoopThread) -> None:
        with self._lock:
            self._loops.add(loop)

    def discard_loop(self, loop: LoopThread) -> None:
        with self._lock:
            self._loops.discard(loop)

    def add_executor(self, executor: Executor) -> None:
        with self._lock:
            self._executors.add(executor)

    def before_fork(self) -> None:
        # A snapshot, not the lock held across the fork: a loop thread registering an executor
        # meanwhile would wait for the lock instead of parking.  (A child has a registry of its own.)
        with self._lock:
            loops, executors = list(self._loops), list(self._executors)
        deadline = time.monotonic() + PAUSE_TIMEOUT_S
        for loop in loops:
            if loop.pause(deadline):
                self._paused.append(loop)
            elif threading.current_thread() is not loop.thread:
                _log.warning("fork: blobsdk loop thread %s did not pause; forking anyway", loop.thread.name)
        for executor in executors:
            if not executor.wait_idle(max(0.0, deadline - time.monotonic())):
                _log.warning("fork: a blobsdk executor still ran a job; forking anyway")

    def after_fork_in_parent(self) -> None:
        paused, self._paused = self._paused, []
        for loop in paused:
            loop.resume()


_registries: Held[_Registry] = Held()


def _registry() -> _Registry:
    """This process's registry (a new, empty one in a forked child: see the module docstring)."""
    return _registries.get_or_make(_Registry)


os.register_at_fork(
    before=lambda: _registry().before_fork(),
    after_in_parent=lambda: _registry().after_fork_in_parent(),
)
