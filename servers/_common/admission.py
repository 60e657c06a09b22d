"""What one tenant may take of a server, so that its flood cannot slow another tenant down.

:class:`TenantGate`, the request slots of a server (the L3 node's and the API server's
middleware): while it is alone, a tenant may run ``slots`` requests at once; while ``n``
tenants are *present* (a request of theirs running or waiting, or one that ended less than
``window`` seconds ago), each may run ``max(1, slots // n)``.  A request over its tenant's
share waits in that tenant's own queue, first come first served, until one of the tenant's
running requests ends.  So a flooding tenant queues behind its own requests, never in front
of another's: a request of a tenant under its share is admitted at once, however many of the
flooder's wait.  Why a share of the slots and not only a queue: the scarce resource of these
servers is their one event loop (and the API server's one SQLite thread), shared by every
running request in turn, so a request's latency grows with the number running beside it;
the share bounds how many of them are another tenant's.  The window keeps a tenant whose
requests come one at a time present between them (else the flooder would take every slot
back in each gap, and the next request would wait for them all).

Who passes without a slot: an admin (a static ``--token``, a signed admin token: the
operators and the servers among themselves), the public routes (health, metrics), and every
caller of a server without a keyring, where all requests are one tenant's and nothing
changes.  A handler that waits long on something else (the L3 node reading a chunk through
from L4) gives its slot back meanwhile (:func:`stepped_out`) and queues for one again after;
one with much work (the API server's lookup of 1000 paths) does it in units, queueing behind
its tenant's other requests between them (:func:`next_turn`), so another tenant's request
waits for at most one unit of each running request, not for the whole of it.

:class:`TenantBuckets`, a token bucket per tenant for work that costs the server more than its
request (the L3 node's bad-copy reports): ``rate`` per second, ``burst`` at once.

Both take an injected clock (tests).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import cachetools
from aiohttp import web

from .auth import AUTH_KEY, CLAIMS_KEY, Handler
from .http import METRICS_KEY

Clock = Callable[[], float]
WINDOW_S = 1.0  # a tenant stays present this long after its last request ended
MAX_TENANTS = 4096  # buckets kept (tenants come from signed tokens: few)


@dataclass
class _Tenant:
    """One tenant's running requests, its queue, and when it was last seen."""

    running: int = 0
    queue: deque[asyncio.Future[None]] = field(default_factory=deque)
    seen: float = 0.0

    @property
    def idle(self) -> bool:
        return self.running == 0 and not self.queue


class TenantGate:
    """The request slots of one server, shared fairly among tenants (module docstring)."""

    def __init__(self, slots: int, *, window: float = WINDOW_S, clock: Clock = time.monotonic) -> None:
        if slots < 1 or not window >= 0:
            raise ValueError(f"a tenant gate needs slots >= 1 and window >= 0, got {slots} and {window}")
        self.slots, self.window, self.clock = slots, window, clock
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()  # least recently seen first
        self.admitted = 0  # requests admitted at once
        self.queued = 0  # requests that waited for a slot

    def share(self) -> int:
        """The requests each present tenant may run now."""
        self._forget_absent()
        return max(1, self.slots // max(1, len(self._tenants)))

    def running(self, tenant: str) -> int:
        found = self._tenants.get(tenant)
        return 0 if found is None else found.running

    def waiting(self, tenant: str | None = None) -> int:
        """Requests waiting for a slot: ``tenant``'s, or everyone's."""
        if tenant is not None:
            found = self._tenants.get(tenant)
            return 0 if found is None else len(found.queue)
        return sum(len(t.queue) for t in self._tenants.values())

    async def acquire(self, tenant: str) -> None:
        """Wait for a slot of ``tenant``'s share (at once if it is under it and nobody of
        its own waits before it)."""
        state = self._seen(tenant)
        if not state.queue and state.running < self.share():
            state.running += 1
            self.admitted += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        state.queue.append(waiter)
        self.queued += 1
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.cancelled():  # granted as it was cancelled: pass the slot on
                self.release(tenant)
            elif waiter in state.queue:
                state.queue.remove(waiter)
            raise

    def release(self, tenant: str) -> None:
        """A slot of ``tenant``'s is free: its next waiters get it, up to its share."""
        state = self._seen(tenant)
        state.running -= 1
        share = self.share()
        while state.queue and state.running < share:
            waiter = state.queue.popleft()
            if not waiter.done():  # else cancelled, its task not yet resumed to leave the queue
                state.running += 1
                waiter.set_result(None)

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[Ticket]:
        """Hold a slot of ``tenant``'s for the block (see :func:`stepped_out`)."""
        await self.acquire(tenant)
        ticket = Ticket(self, tenant)
        try:
            yield ticket
        finally:
            if ticket.held:
                self.release(tenant)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request of a tenant (not an admin's, not a public route's) holds a slot."""
        claims = request.get(CLAIMS_KEY)
        if claims is None or claims.admin:
            return await handler(request)
        tenant = claims.tenant  # what slot() does, inline: this runs on every request
        await self.acquire(tenant)
        ticket = request[TICKET_KEY] = Ticket(self, tenant)
        try:
            return await handler(request)
        finally:
            if ticket.held:
                self.release(tenant)

    def stats(self) -> dict[str, int]:
        return {
            "tenants_present": len(self._tenants),
            "share": self.share(),
            "waiting": self.waiting(),
            "admitted": self.admitted,
            "queued": self.queued,
        }

    def _seen(self, tenant: str) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
        state.seen = self.clock()
        self._tenants.move_to_end(tenant)
        return state

    def _forget_absent(self) -> None:
        """Drop the tenants idle for ``window`` (least recently seen first: amortized O(1);
        a busy one found there is seen again, moved to the other end)."""
        deadline = self.clock() - self.window
        while self._tenants:
            tenant, state = next(iter(self._tenants.items()))
            if state.seen > deadline:
                return
            if state.idle:
                del self._tenants[tenant]
            else:
                self._seen(tenant)


class Ticket:
    """A request's slot, which it may give back while it waits on something else."""

    def __init__(self, gate: TenantGate, tenant: str) -> None:
        self.gate, self.tenant = gate, tenant
        self.held = True

    @asynccontextmanager
    async def away(self) -> AsyncIterator[None]:
        """Give the slot back for the block, and queue for one again after it (not after an
        error or a cancellation: the request then ends without waiting for a slot)."""
        self.held = False
        self.gate.release(self.tenant)
        yield
        await self.gate.acquire(self.tenant)
        self.held = True


TICKET_KEY = web.RequestKey("admission_ticket", Ticket)
GATE_KEY = web.AppKey("tenant_gate", TenantGate)


def holds_slot(request: web.Request) -> bool:
    """Whether the request holds a tenant's slot (it passed a gate, as a tenant)."""
    return TICKET_KEY in request


async def next_turn(request: web.Request) -> None:
    """Between two units of a long request's work: its slot goes to the next request of its
    tenant waiting (if any), and it queues behind them for the next unit."""
    ticket = request.get(TICKET_KEY)
    if ticket is not None:
        async with ticket.away():
            pass


@asynccontextmanager
async def stepped_out(request: web.Request) -> AsyncIterator[None]:
    """The block runs without the request's slot, if it holds one (see :class:`Ticket`)."""
    ticket = request.get(TICKET_KEY)
    if ticket is None:
        yield
        return
    async with ticket.away():
        yield


def install_gate(app: web.Application, slots: int, *, clock: Clock = time.monotonic) -> TenantGate | None:
    """A :class:`TenantGate` of ``slots`` in front of ``app``'s handlers (inside its auth
    middleware), with its figures on /metrics; None, and nothing installed, if ``app``'s
    server has no keyring (no tenants: every request is one tenant's)."""
    if app[AUTH_KEY].keyring is None:
        return None
    gate = app[GATE_KEY] = TenantGate(slots, clock=clock)
    app.middlewares.append(gate.middleware)
    metrics = app[METRICS_KEY]
    metrics.gauge("tenant_requests_waiting", "Tenants' requests waiting for a slot of their share.", gate.waiting)
    metrics.gauge("tenants_present", "Tenants sharing the request slots now.", lambda: gate.stats()["tenants_present"])
    metrics.counter("tenant_requests_queued", "Tenants' requests that waited for a slot.", lambda: gate.queued)
    return gate


class TenantBuckets:
    """A token bucket per tenant: ``rate`` tokens a second, at most ``burst`` saved up (a
    tenant not seen yet has a full bucket)."""

    def __init__(self, rate: float, burst: float, *, clock: Clock = time.monotonic) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got {rate} and {burst}")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: cachetools.LRUCache[str, tuple[float, float]] = cachetools.LRUCache(MAX_TENANTS)

    def take(self, tenant: str) -> bool:
        """Spend one of ``tenant``'s tokens; False (nothing spent) if it has none."""
        now = self.clock()
        tokens, then = self._buckets.get(tenant, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1:
            self._buckets[tenant] = (tokens, now)
            return False
        self._buckets[tenant] = (tokens - 1, now)
        return True
