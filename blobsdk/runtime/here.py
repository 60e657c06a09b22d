"""What belongs to one process, and to one event loop: :class:`Held`, the one place where
blobsdk asks "which process, and which loop, am I in?".

Why it is asked at all:

- ``fork()`` copies a process's memory but only the thread that called it.  A forked child
  (a DataLoader worker, by default on Linux) inherits the parent's clients, their event
  loops, sockets and files, with no thread running those loops: a call through them waits
  for ever, and closing them would close, or say goodbye on, what the parent still uses.
- obstore runs every request on one Tokio runtime per process, started by its first one,
  whose threads do not survive a fork: a child's obstore request hangs (sources/_s3.py).
- An aiohttp session, like an ``asyncio.Lock``, belongs to the loop it was made on: another
  loop (``asyncio.run`` again, another thread's loop) must not use it.

So a :class:`Held` value remembers the process (and, ``per_loop``, the running loop) it was
put in, and :meth:`Held.get` gives it back only there; the caller makes a new one elsewhere.
A value put in another process (a parent's, inherited over a fork) is set aside, never
closed and never collected: kept referenced so that the child's garbage collector runs none
of its finalizers (nor touches the pages it shares with the parent).  Another loop's value
in this process is only let go when a new one is put: whether to close it first is the
caller's call (:attr:`Held.loop` says where).  A pickled ``Held`` arrives empty: what it held
belongs to the process that pickled it.

The test is ``os.getpid()`` at each use, not an ``os.register_at_fork`` hook: it needs no
registry of holders (no hidden global state) and holds however the process came to be.
(blobsdk's one fork hook, in _forksafe.py, only quiets its threads while a fork happens.)

Users: SyncClient (its loop thread and client), _stores._ProcessClient (the torch datasets'
and DCP's client), fsspec.py (each filesystem's client and lock per loop, its IO loop),
torch.py (the next epoch's readahead), sources/_s3get.py (the signed GETs' connections, per
loop), sources/_s3obstore.py (which process started obstore's runtime), _forksafe.py (its
registry of threads).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Held(Generic[T]):
    """One value (never None) of this process, and of the loop it was put on if ``per_loop``."""

    def __init__(self, *, per_loop: bool = False) -> None:
        self._per_loop = per_loop
        self._value: T | None = None
        self._pid = 0  # the process that put the value
        self._loop: asyncio.AbstractEventLoop | None = None  # and its loop (``per_loop``)
        self._set_aside: list[T] = []  # parents' values (see the module docstring)

    def get(self) -> T | None:
        """The value put in this process (on the running loop, if ``per_loop``), else None."""
        if not self._put_in_this_process() or (self._per_loop and self._loop is not running_loop()):
            return None
        return self._value

    def get_or_make(self, make: Callable[[], T]) -> T:
        """The value of :meth:`get`, or else a new one from ``make``, put here."""
        value = self.get()
        return value if value is not None else self.put(make())

    def put(self, value: T) -> T:
        """Hold ``value`` for this process (and, ``per_loop``, for the running loop: there
        must be one), in place of the one held (let go; a parent's is set aside)."""
        loop = asyncio.get_running_loop() if self._per_loop else None
        self._set_parents_aside()
        self._value, self._loop = value, loop
        return value

    def take(self) -> T | None:
        """The value put in this process, whatever its loop (:attr:`loop`, read before),
        taken off the holder: the caller's to close.  None if none was put here."""
        self._set_parents_aside()
        value, self._value, self._loop = self._value, None, None
        return value

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop this process's value was put on (None: none here, or not ``per_loop``)."""
        return self._loop if self._put_in_this_process() else None

    @property
    def inherited(self) -> bool:
        """Whether the value held was put in another process: this one was forked after."""
        return self._value is not None and not self._put_in_this_process()

    def _set_parents_aside(self) -> None:
        if self._value is not None and not self._put_in_this_process():
            self._set_aside.append(self._value)
            self._value, self._loop = None, None
        self._pid = os.getpid()

    def _put_in_this_process(self) -> bool:
        return self._pid == os.getpid()

    def __reduce__(self) -> tuple[object, tuple[bool]]:
        return _empty, (self._per_loop,)  # arrives empty (see the module docstring)


def _empty(per_loop: bool) -> Held[object]:
    return Held(per_loop=per_loop)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
