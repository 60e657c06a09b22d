"""blobsdk/runtime/here.py: a Held value is given back in the process (and, per loop, on the event
loop) that put it; a forked child gets none and sets its parent's aside, never collected;
another loop's is let go when a new one is put; a pickled holder arrives empty.

Forked children are real (``os.fork``); each reports what it saw through a pipe, and the
test fails if one has not ended within its deadline (tests/helpers.py, in_a_forked_child)."""

from __future__ import annotations

import asyncio
import gc
import pickle
import threading
import weakref

import pytest

from blobsdk.runtime.here import Held
from tests.helpers import in_a_forked_child

pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


class Resource:
    """A stand-in for a client: weak-referenceable, and it knows whether it was closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False


# --- one process ------------------------------------------------------------------------------


def test_a_value_is_given_back_in_the_process_that_put_it_until_taken() -> None:
    held: Held[Resource] = Held()
    assert (held.get(), held.take(), held.inherited, held.loop) == (None, None, False, None)
    value = held.put(Resource("a"))
    assert held.get() is value and held.get_or_make(lambda: Resource("never made")) is value
    assert held.take() is value
    assert held.get() is None and held.take() is None
    made = held.get_or_make(lambda: Resource("b"))
    assert held.get() is made and made.name == "b"


async def test_a_value_not_per_loop_is_given_back_on_any_loop_and_off_any() -> None:
    held: Held[Resource] = Held()
    value = held.put(Resource("a"))
    assert held.loop is None
    assert await asyncio.to_thread(asyncio.run, _get(held)) is value  # another thread's loop
    assert await asyncio.to_thread(held.get) is value  # no loop running there


async def test_a_per_loop_value_is_given_back_only_on_its_loop() -> None:
    held: Held[Resource] = Held(per_loop=True)
    value = held.put(Resource("a"))
    here = asyncio.get_running_loop()
    assert held.get() is value and held.loop is here
    assert await asyncio.to_thread(asyncio.run, _get(held)) is None  # another thread's running loop
    assert await asyncio.to_thread(held.get) is None  # no loop running there
    assert held.get() is value  # still this loop's


def test_a_per_loop_value_on_a_closed_loop_is_let_go_when_another_loop_puts_one() -> None:
    held: Held[Resource] = Held(per_loop=True)

    async def put(name: str) -> tuple[weakref.ref[Resource], asyncio.AbstractEventLoop]:
        return weakref.ref(held.put(Resource(name))), asyncio.get_running_loop()

    first, first_loop = asyncio.run(put("first"))  # asyncio.run closes its loop
    assert first_loop.is_closed() and held.loop is first_loop
    assert asyncio.run(_get(held)) is None  # a new loop: not given the closed one's
    assert held.take() is first() and held.loop is None  # taken off: the caller's, if it wants it
    first, _ = asyncio.run(put("first"))
    second, second_loop = asyncio.run(put("second"))
    gc.collect()
    assert first() is None  # let go (this process's, so not set aside), never closed by the holder
    assert held.loop is second_loop and held.take() is second()


def test_a_per_loop_value_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match=r"^no running event loop$"):
        Held[Resource](per_loop=True).put(Resource("a"))


def test_a_pickled_holder_arrives_empty_and_keeps_per_loop() -> None:
    held: Held[threading.Lock] = Held(per_loop=True)
    asyncio.run(_put(held, threading.Lock()))  # a lock does not pickle: the holder does
    copy = pickle.loads(pickle.dumps(held))
    assert copy.get() is None and copy.loop is None and not copy.inherited
    with pytest.raises(RuntimeError, match=r"^no running event loop$"):
        copy.put(threading.Lock())
    assert pickle.loads(pickle.dumps(Held())).get() is None


async def _get(held: Held[Resource]) -> Resource | None:
    return held.get()


async def _put(held: Held[threading.Lock], value: threading.Lock) -> None:
    held.put(value)


# --- forked children --------------------------------------------------------------------------


def test_a_forked_child_gets_none_and_sets_the_parents_value_aside_never_collected() -> None:
    held: Held[Resource] = Held()
    ref = weakref.ref(held.put(Resource("parent")))

    def observe() -> object:
        before = (held.get(), held.inherited, held.loop)
        taken = held.take()  # not the child's to close: None
        gc.collect()
        kept = ref()
        return before, taken, held.inherited, kept is not None and kept.name, kept is not None and kept.closed

    assert in_a_forked_child(observe) == ((None, True, None), None, False, "parent", False)
    assert held.get() is ref() and not held.inherited  # the parent's is untouched


def test_a_child_puts_its_own_value_and_its_forked_child_inherits_that_one() -> None:
    held: Held[Resource] = Held()
    held.put(Resource("parent"))

    def child() -> object:
        untouched = in_a_forked_child(lambda: held.inherited)  # a grandchild of the parent's
        mine = held.put(Resource("child"))
        grandchild = in_a_forked_child(lambda: (held.get(), held.inherited))
        return untouched, held.get() is mine, held.inherited, grandchild

    assert in_a_forked_child(child) == (True, True, False, (None, True))
    value = held.get()
    assert value is not None and value.name == "parent"


def test_a_per_loop_value_is_none_in_a_forked_child_on_any_loop() -> None:
    held: Held[Resource] = Held(per_loop=True)

    async def in_the_parent() -> object:
        held.put(Resource("parent"))
        return in_a_forked_child(lambda: asyncio.run(in_the_child()))

    async def in_the_child() -> object:
        before = (held.get(), held.inherited, held.loop)
        mine = held.get_or_make(lambda: Resource("child"))
        return before, mine.name, held.loop is asyncio.get_running_loop()

    assert asyncio.run(in_the_parent()) == ((None, True, None), "child", True)
