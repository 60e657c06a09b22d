"""Dataloader prefetch: read the next blobs while the consumer works on this one.

``client.readahead(paths, depth=K, max_bytes=B)`` yields ``(path, data)`` in the order of
``paths`` while keeping up to ``K`` reads in flight ahead of the consumer, and at most ``B``
bytes of blobs read or being read but not yet yielded (one blob larger than ``B`` is still
read, alone).  Plans are looked up in batches through the plan cache, a batch ahead of the
reads.  ``paths`` is consumed lazily, so it may be a generator.

A path that fails (missing, unreadable) raises its error when its turn comes, after every
path before it was yielded; leaving the loop early cancels the reads in flight, so nothing
outlives the iteration.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from .._arguments import wrong
from ..chunks import validate_path
from ..errors import BadRequest, BlobError, BlobNotFound
from ..metadata import PlanReader
from ..wire import ReadPlan

READAHEAD_DEPTH = 32  # reads in flight ahead of the consumer
READAHEAD_BYTES = 256 << 20  # bytes of blobs ahead of the consumer
PLAN_LOOKAHEAD = 256  # paths whose plans are looked up in one batch

Reader = Callable[[ReadPlan], Awaitable[bytearray]]


@dataclass(slots=True)
class _Slot:
    """One path on its way to the consumer: its plan (or why there is none), then its read."""

    path: str
    plan: ReadPlan | None
    error: BlobError | None
    read: asyncio.Task[bytearray] | None = None

    @property
    def size(self) -> int:
        return self.plan.size if self.plan is not None else 0


def check_window(depth: object, max_bytes: object) -> None:
    """``depth`` and ``max_bytes`` ints >= 1: a TypeError for what is no number at all (a str),
    else BadRequest (a bool, a float, < 1).  The client checks them when the readahead is made."""
    for name, value in (("depth", depth), ("max_bytes", max_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            if not isinstance(value, int | float):
                raise wrong(name, "an int >= 1", value)
            raise BadRequest(f"{name} must be an int >= 1, got {value!r}")


async def read_ahead(
    plans: PlanReader, read: Reader, paths: Iterable[str], *, depth: int, max_bytes: int
) -> AsyncGenerator[tuple[str, bytearray], None]:
    check_window(depth, max_bytes)
    source = iter(paths)
    planned: deque[_Slot] = deque()  # plans known, reads not started
    reading: deque[_Slot] = deque()  # reads started, in order
    ahead = 0  # bytes of the blobs in ``reading``
    try:
        while True:
            if not planned:
                planned.extend(await _plan_batch(plans, source, max(PLAN_LOOKAHEAD, depth)))
            while planned and len(reading) < depth and (not reading or ahead + planned[0].size <= max_bytes):
                slot = planned.popleft()
                if slot.plan is not None:
                    slot.read = asyncio.ensure_future(read(slot.plan))
                reading.append(slot)
                ahead += slot.size
            if not reading:
                return
            slot = reading.popleft()
            if slot.read is None:
                assert slot.error is not None
                raise slot.error
            data = await slot.read
            ahead -= slot.size
            yield slot.path, data
    finally:
        await _cancel(reading)


async def _plan_batch(plans: PlanReader, source: Iterator[str], n: int) -> list[_Slot]:
    """The next ``n`` paths with their plans (one lookup), or the error each will raise."""
    slots: list[_Slot] = []
    for path in itertools.islice(source, n):
        try:
            slots.append(_Slot(validate_path(path), None, None))
        except BlobError as exc:
            slots.append(_Slot(str(path), None, exc))
    wanted = [slot.path for slot in slots if slot.error is None]
    found = dict(zip(wanted, await plans.get_plans(wanted), strict=True)) if wanted else {}
    for slot in slots:
        if slot.error is None:
            slot.plan = found[slot.path]
            if slot.plan is None:
                slot.error = BlobNotFound(f"no blob at {slot.path!r}")
    return slots


async def _cancel(slots: Iterable[_Slot]) -> None:
    tasks = [slot.read for slot in slots if slot.read is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
