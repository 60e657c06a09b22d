"""HDD emulation shared by the block server (servers/blockstore.py) and the HDD proxy in
front of an object store (servers/hddproxy.py): a request waits for one of a disk's
:class:`Spindles` (FIFO), pays its seek latency once, then moves its bytes through the
disk's :class:`Bandwidth` budget.  A block server is one disk; the proxy's store is
:class:`StripedDisks`, whose requests are served stripe by stripe, each stripe by its own
disk, in parallel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash


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


class Disk:
    """One emulated disk of a striped store: its spindles (FIFO, a seek each time one is
    taken), its bandwidth, and how many stripe reads or writes it served."""

    def __init__(self, spindles: int, latency_s: float, bytes_per_second: float) -> None:
        self.spindles = Spindles(spindles, latency_s)
        self.bandwidth = Bandwidth(bytes_per_second)
        self.stripes = 0  # stripe transfers served so far (each took a spindle and paid a seek)


@dataclass(frozen=True)
class Piece:
    """``length`` bytes at ``offset`` in a transfer's body, all on one stripe; ``done`` is set
    once they have come through their disk."""

    offset: int
    length: int
    done: asyncio.Event


class StripedDisks:
    """A striped store's disks: an object's bytes are cut into ``stripe_bytes`` stripes, stripe
    ``s`` of ``path`` lives on disk ``(hash(path) + s) % len(disks)``: consecutive stripes on
    consecutive disks, from a disk the path picks, as RAID-0 places them, so a large object's
    stripes are spread evenly whatever its name (a hash per stripe left one disk holding up to
    0.45 of an object store's bytes).  A transfer of bytes
    ``[start, start + length)`` is served stripe by stripe, each stripe by its own disk (a
    spindle, its seek, then its bytes through the disk's bandwidth, ``piece_bytes`` at a
    time), every stripe at once: stripes on different disks move in parallel, those on one
    disk queue on its spindles and share its bandwidth.  The aggregate bandwidth is the
    disks' sum, reached by requests that keep every disk busy; a request pays one seek per
    stripe it touches (at least one: a request of no bytes still meets a disk)."""

    def __init__(self, disks: Sequence[Disk], stripe_bytes: int, piece_bytes: int) -> None:
        if not disks or stripe_bytes < 1 or piece_bytes < 1:
            raise ValueError("need at least one disk, stripe_bytes >= 1 and piece_bytes >= 1")
        self.disks = list(disks)
        self.stripe_bytes = stripe_bytes
        self.piece_bytes = piece_bytes

    def disk_of(self, path: str, stripe: int) -> Disk:
        return self.disks[(xxhash.xxh3_64_intdigest(path.encode()) + stripe) % len(self.disks)]

    def transfer(self, path: str, start: int, length: int) -> Transfer:
        return Transfer(self, path, start, length)


class Transfer:
    """One request's bytes on a :class:`StripedDisks`: ``async with`` starts every stripe's
    disk work (and stops what is left of it on the way out: a client that goes away frees
    its spindles); ``pieces`` are its bytes in order, each with its ``done`` event."""

    def __init__(self, disks: StripedDisks, path: str, start: int, length: int) -> None:
        self.pieces: list[Piece] = []
        self._stripes: list[tuple[Disk, list[Piece]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        offset = 0
        while True:
            stripe = (start + offset) // disks.stripe_bytes
            stripe_end = (stripe + 1) * disks.stripe_bytes - start
            pieces: list[Piece] = []
            while True:
                n = min(disks.piece_bytes, stripe_end - offset, length - offset)
                pieces.append(Piece(offset, n, asyncio.Event()))
                offset += n
                if offset >= min(stripe_end, length):
                    break
            self.pieces += pieces
            self._stripes.append((disks.disk_of(path, stripe), pieces))
            if offset >= length:
                break

    @property
    def disks_touched(self) -> list[Disk]:
        return [disk for disk, _ in self._stripes]

    async def __aenter__(self) -> Transfer:
        self._tasks = [asyncio.create_task(_serve_stripe(disk, pieces)) for disk, pieces in self._stripes]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def done(self) -> None:
        """Until every byte has come through its disk."""
        for piece in self.pieces:
            await piece.done.wait()


async def _serve_stripe(disk: Disk, pieces: list[Piece]) -> None:
    async with disk.spindles:
        disk.stripes += 1
        for piece in pieces:
            await disk.bandwidth.take(piece.length)
            piece.done.set()
