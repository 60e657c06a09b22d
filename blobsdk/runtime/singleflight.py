"""Single-flight: one task per key in flight, shared by every caller of that key (DESIGN
invariant 3).  Used by the client's read path (one fetch per chunk key) and by the L3 node
(one read-through per chunk key).

The rule, the same for every user:

- The first caller of a key starts ``work()`` as a task; callers arriving while it runs
  wait for the same task and get the same result or error.
- A caller that is cancelled stops waiting; the task goes on while anyone still waits.  When
  the last waiter leaves, the task is cancelled and the key is unlisted at once, so a caller
  arriving afterwards starts afresh rather than inherit a dying task; that last waiter then
  lets the task unwind (at most ``UNWIND_S``) before its own cancellation goes on, so
  nothing runs that nobody waits for, and nothing outlives the caller that left last.
- A task that finished is unlisted before any caller sees its result, so nobody can join it
  late: the number of callers that shared a result is final when they get it.
- :meth:`aclose` cancels every task in flight and waits for them, including tasks whose
  last waiter left and which are still unwinding from that cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

V = TypeVar("V")
UNWIND_S = 1.0  # how long the last waiter to leave waits for the cancelled task to end


class _Flight(Generic[V]):
    """One task in flight: how many callers joined it, and how many still wait."""

    __slots__ = ("callers", "task", "waiting")

    def __init__(self, task: asyncio.Task[V]) -> None:
        self.task = task
        self.callers = 1
        self.waiting = 0


class SingleFlight(Generic[V]):
    """One ``work()`` task per key in flight; see the module docstring."""

    def __init__(self) -> None:
        self._flights: dict[str, _Flight[V]] = {}
        self._abandoned: set[asyncio.Task[V]] = set()  # cancelled, unlisted, maybe still unwinding

    def __len__(self) -> int:
        """How many keys are in flight."""
        return len(self._flights)

    def __contains__(self, key: object) -> bool:
        """Whether a task for ``key`` is in flight (a caller now would join it)."""
        return key in self._flights

    async def run(self, key: str, work: Callable[[], Coroutine[Any, Any, V]]) -> tuple[V, int]:
        """The result of the task for ``key`` (started with ``work()`` if none runs), and how
        many callers shared it (1: this caller alone)."""
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight(asyncio.get_running_loop().create_task(work(), name=key))
            self._flights[key] = flight
            flight.task.add_done_callback(self._landed)
        else:
            flight.callers += 1
        flight.waiting += 1
        try:
            value = await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            flight.waiting -= 1
            if flight.waiting == 0 and not flight.task.done():  # the last waiter left
                flight.task.cancel()
                self._forget(flight)
                self._abandoned.add(flight.task)  # owned until it has unwound (see aclose)
                await asyncio.wait([flight.task], timeout=UNWIND_S)
            raise
        return value, flight.callers

    async def aclose(self) -> None:
        """Cancel every task in flight and wait until they have ended."""
        running = [flight.task for flight in self._flights.values()]
        for task in running:
            task.cancel()
        # The abandoned ones were cancelled already: let them finish their cleanup.
        await asyncio.gather(*running, *self._abandoned, return_exceptions=True)

    def _forget(self, flight: _Flight[V]) -> None:
        key = flight.task.get_name()
        if self._flights.get(key) is flight:
            del self._flights[key]

    def _landed(self, task: asyncio.Task[V]) -> None:
        self._abandoned.discard(task)
        flight = self._flights.get(task.get_name())
        if flight is not None and flight.task is task:
            self._forget(flight)
        if not task.cancelled():
            task.exception()  # retrieved here, so a task whose callers all left never warns
