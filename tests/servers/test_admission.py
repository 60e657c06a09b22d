"""servers/_common/admission.py: tenants' shares of a server's request slots, and the
per-tenant token buckets; ordering checked with events and a fake clock, never with time."""

from __future__ import annotations

import asyncio

import pytest

from servers._common.admission import TenantBuckets, TenantGate, Ticket


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def settled() -> None:
    """Let every task that can run now run until it waits again."""
    for _ in range(5):
        await asyncio.sleep(0)


def queue(gate: TenantGate, tenant: str, n: int) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(gate.acquire(tenant)) for _ in range(n)]


async def test_a_tenant_alone_runs_every_slot_and_queues_past_them() -> None:
    gate = TenantGate(4, clock=FakeClock())
    for _ in range(4):
        await gate.acquire("flood")
    waiting = queue(gate, "flood", 3)
    await settled()
    assert (gate.running("flood"), gate.waiting("flood")) == (4, 3)
    gate.release("flood")
    await settled()
    assert waiting[0].done() and not waiting[1].done()
    assert (gate.running("flood"), gate.waiting("flood")) == (4, 2)
    for task in waiting[1:]:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert gate.waiting() == 0


async def test_another_tenant_is_admitted_ahead_of_a_flooders_queue() -> None:
    gate = TenantGate(4, clock=FakeClock())
    for _ in range(4):
        await gate.acquire("flood")
    flood = queue(gate, "flood", 5)
    await settled()
    async with asyncio.timeout(10):  # a guard: it must not wait at all
        await gate.acquire("victim")
    assert gate.share() == 2 and gate.running("victim") == 1 and gate.waiting("flood") == 5
    await gate.acquire("victim")  # its share is 2
    victim_third = asyncio.create_task(gate.acquire("victim"))
    await settled()
    assert not victim_third.done()  # over its own share: it queues behind its own requests
    # The flooder runs 4 > its share of 2: its ends wake none of its queue until it is under.
    gate.release("flood")
    gate.release("flood")
    await settled()
    assert (gate.running("flood"), gate.waiting("flood")) == (2, 5) and not any(t.done() for t in flood)
    gate.release("flood")
    await settled()
    assert flood[0].done() and not flood[1].done() and gate.running("flood") == 2
    gate.release("victim")
    await settled()
    assert victim_third.done() and gate.running("victim") == 2
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_a_tenant_stays_present_for_the_window_after_its_last_request() -> None:
    clock = FakeClock()
    gate = TenantGate(4, window=1.0, clock=clock)
    for _ in range(2):
        await gate.acquire("flood")
    await gate.acquire("victim")
    gate.release("victim")
    clock.now += 0.9  # between two of the victim's requests: still present
    assert gate.share() == 2
    third = queue(gate, "flood", 1)
    await settled()
    assert not third[0].done()
    clock.now += 0.2  # the victim left: the flooder's share is every slot again
    assert gate.share() == 4
    gate.release("flood")  # its next end wakes its queue up to the new share
    await settled()
    assert third[0].done() and gate.running("flood") == 2


async def test_a_waiter_cancelled_leaves_the_queue_and_a_slot_granted_as_it_was_cancelled_passes_on() -> None:
    gate = TenantGate(1, clock=FakeClock())
    await gate.acquire("t")
    first, second, third = queue(gate, "t", 3)
    await settled()
    first.cancel()
    await settled()
    assert gate.waiting("t") == 2
    gate.release("t")  # granted to the second ...
    second.cancel()  # ... which is cancelled before it resumed: the slot goes to the third
    await asyncio.gather(first, second, return_exceptions=True)
    await settled()
    assert third.done() and not third.cancelled()
    assert (gate.running("t"), gate.waiting("t")) == (1, 0)


async def test_a_slot_stepped_away_from_lets_the_tenants_next_request_in() -> None:
    gate = TenantGate(1, clock=FakeClock())
    async with gate.slot("t") as ticket:
        async with ticket.away():
            async with asyncio.timeout(10):  # a guard: the slot was given back
                await gate.acquire("t")
            assert not ticket.held
            gate.release("t")
        assert ticket.held and gate.running("t") == 1
    assert gate.running("t") == 0


def test_gate_settings_are_checked() -> None:
    with pytest.raises(ValueError) as gate:
        TenantGate(0)
    assert str(gate.value) == "a tenant gate needs slots >= 1 and window >= 0, got 0 and 1.0"
    with pytest.raises(ValueError) as bucket:
        TenantBuckets(0, 5)
    assert str(bucket.value) == "a token bucket needs rate > 0 and burst >= 1, got 0 and 5"


def test_each_tenant_has_its_own_bucket_refilled_at_its_rate() -> None:
    clock = FakeClock()
    buckets = TenantBuckets(2.0, 3, clock=clock)
    assert [buckets.take("a") for _ in range(4)] == [True, True, True, False]
    assert buckets.take("b")  # another tenant's bucket is full
    clock.now += 0.25  # half a token
    assert not buckets.take("a")
    clock.now += 0.25
    assert buckets.take("a") and not buckets.take("a")
    clock.now += 100
    assert [buckets.take("a") for _ in range(4)] == [True, True, True, False]  # at most the burst


async def test_a_request_that_fails_away_from_its_slot_ends_without_waiting_for_one() -> None:
    gate = TenantGate(1, clock=FakeClock())

    async def read_through(ticket: Ticket) -> None:
        async with asyncio.timeout(10), ticket.away():  # a guard: it must not wait
            await gate.acquire("t")  # another request of the tenant takes the slot given back
            raise ValueError("the read-through failed")

    async with gate.slot("t") as ticket:
        with pytest.raises(ValueError, match="the read-through failed"):
            await read_through(ticket)
        assert not ticket.held
    assert gate.running("t") == 1  # the other request's: nothing was released twice
    gate.release("t")
    assert gate.running("t") == 0
