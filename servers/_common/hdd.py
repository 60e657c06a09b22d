"""HDD emulation shared by the block server (servers/blockstore.py) and the HDD proxy in
front of an object store (servers/hddproxy.py): a request waits for one of a disk's
:class:`Spindles` (FIFO), pays its seek latency once, then moves its bytes through the
disk's :class:`Bandwidth` budget.
"""

from __future__ import annotations

import asyncio


class Bandwidth:
    """Server-wide bandwidth cap: each transfer reserves the next free slot of wire time
    and sleeps until its bytes would have gone through.  0 bytes/s = unlimited."""

    def __init__(self, bytes_per_second: float) -> None:
        self._rate = bytes_per_second
        self._next_free = 0.0
        self.moved = 0  # bytes through it so far, either way (the /metrics counter bandwidth_bytes_total)

    async def take(self, nbytes: int) -> None:
        self.moved += max(0, nbytes)
        if self._rate <= 0 or nbytes <= 0:
            return
        now = asyncio.get_running_loop().time()
        self._next_free = max(self._next_free, now) + nbytes / self._rate
        await asyncio.sleep(self._next_free - now)


class Spindles:
    """HDD emulation: ``async with spindles:`` queues for a free spindle, then pays the
    seek latency.  ``queued`` and ``in_service`` are exported as /metrics gauges.  (A plain
    class, not an asynccontextmanager: it is entered on every request.)"""

    def __init__(self, count: int, latency_s: float) -> None:
        self._free = asyncio.Semaphore(count) if count > 0 else None
        self._latency_s = latency_s
        self.queued = 0
        self.in_service = 0

    async def __aenter__(self) -> None:
        await self._acquire()
        self.in_service += 1
        if self._latency_s > 0:
            try:
                await asyncio.sleep(self._latency_s)
            except BaseException:  # cancelled while seeking: __aexit__ will not run
                self._release()
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    async def _acquire(self) -> None:
        if self._free is None:
            return
        self.queued += 1
        try:
            await self._free.acquire()
        finally:
            self.queued -= 1

    def _release(self) -> None:
        self.in_service -= 1
        if self._free is not None:
            self._free.release()
