"""Fault injection for every blobsdk server: a middleware that does nothing unless switched on.

A :class:`FaultConfig` is a list of :class:`FaultRule` and the seed of their random draws.
A rule selects requests by ``route`` and ``methods``; every rule that matches a request
applies to it.  What a matched request goes through, in order:

1. overload (``max_in_service``): wait for one of N service slots, FIFO.  At most
   ``queue_limit`` requests may wait; beyond that, ``overload="reject"`` answers 429 with
   ErrorBody code ``unavailable``, and ``overload="slow"`` first sleeps
   ``overload_delay_ms`` for each place the request is past the bound.
2. latency: ``latency_ms`` + a ``latency_lognormal`` draw + ``slow_ms`` for a
   ``slow_fraction`` of requests (slept inside the slot, so latency is service time).
3. ``error_rate``: 503 with ErrorBody code ``unavailable``; the handler does not run.
4. ``stall_rate``: never answered; held until the client hangs up or the server shuts down,
   then the connection is closed.
5. the handler runs; ``corrupt_rate`` flips one byte of its body, ``truncate_rate`` sends
   only part of it and closes the connection.  Content-Length stays that of the whole body.
   Both work on ``web.Response`` bodies and on StreamResponse writes.

/healthz, /metrics and /admin/faults are never faulted.  Random draws come from one
``random.Random(seed)`` per config; for each request each matching rule draws, in this
order, only for what it sets: lognormal, slow_fraction, error_rate, stall_rate,
corrupt_rate (+ where), truncate_rate (+ where).  Requests sent one at a time therefore see
the same faults on every run with the same seed.

Switching it on (every server's ``make_app`` passes :func:`fault_extensions` to ``base_app``)::

    --fault 'route=/v1/blocks;methods=GET;error_rate=10%;latency_ms=5'   (repeatable)
    --fault-seed 42
    BLOBSDK_FAULTS='<FaultConfig as JSON>' or 'SPEC|SPEC'   (read by the servers' main())
    --admin-token T      GET/PUT/DELETE /admin/faults with ``Authorization: Bearer T``

A SPEC's form is servers/_common/faultrules.py's (with the rule types; re-exported here).
PUT /admin/faults takes a FaultConfig (JSON or msgpack) and affects requests that arrive
afterwards; GET answers a :class:`FaultStatus`; DELETE switches faults off.  Injected
faults are counted per kind in both GET /admin/faults and /metrics (counter
``<server>_faults_injected_total{kind}``; gauge ``<server>_faults_stalled_now`` is the
requests held by stalls).  How a body is damaged is servers/_common/faultbodies.py.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import hdrs, web

from blobsdk.errors import Overloaded, Unauthorized, Unavailable

from .._common.http import (
    ADMIN_FAULTS_ROUTE,
    METRICS_KEY,
    PUBLIC_ROUTES,
    Handler,
    error_reply,
    read_body,
    reply,
)
from .faultbodies import Damage, writes_wrapped
from .faultrules import FAULTS_ENV, FaultConfig, FaultRule, FaultStatus, Lognormal, config_of_args, parse_env, parse_rule

__all__ = [  # the rule types and their text forms live in faultrules.py; servers import them from here
    "FAULTS_ENV",
    "FAULTS_KEY",
    "KINDS",
    "FaultConfig",
    "FaultInjector",
    "FaultRule",
    "FaultStatus",
    "Lognormal",
    "config_of_args",
    "fault_extensions",
    "parse_env",
    "parse_rule",
    "writes_wrapped",
]

KINDS = ("latency", "error", "stall", "corrupt", "truncate", "overload_reject", "overload_slow")
STALL_POLL_S = 0.05  # how soon a stalled request notices a hang-up or shutdown


# --- per-request decisions ----------------------------------------------------------------


class _Gate:
    """One rule's overload emulation: ``max_in_service`` slots taken in FIFO order."""

    def __init__(self, rule: FaultRule, counts: Counter[str]) -> None:
        assert rule.max_in_service is not None
        self._rule = rule
        self._slots = asyncio.Semaphore(rule.max_in_service)
        self._counts = counts
        self.queued = 0

    @asynccontextmanager
    async def service(self) -> AsyncIterator[None]:
        """Hold a slot for the body; Overloaded (before waiting) if the queue is full."""
        await self._admit()
        try:
            yield
        finally:
            self._slots.release()

    async def _admit(self) -> None:
        over = self._places_over_limit()
        if over and self._rule.overload == "reject":
            self._counts["overload_reject"] += 1
            raise Overloaded(f"injected overload: {self.queued} requests already wait for a slot")
        self.queued += 1
        try:
            if over:
                self._counts["overload_slow"] += 1
                await asyncio.sleep(over * self._rule.overload_delay_ms / 1000)
            await self._slots.acquire()
        finally:
            self.queued -= 1

    def _places_over_limit(self) -> int:
        """How far past ``queue_limit`` an arriving request would wait (0: within it)."""
        limit = self._rule.queue_limit
        if not self._slots.locked() or (limit is None and self._rule.overload == "reject"):
            return 0
        return max(0, self.queued + 1 - (limit or 0))


@dataclass
class _Plan:
    """What one request gets, drawn when it arrives."""

    gates: list[_Gate] = field(default_factory=list)
    delay_s: float = 0.0
    error: bool = False
    stall: bool = False
    flip: float | None = None  # where to flip a byte, as a fraction of the body's length
    cut: float | None = None  # where to cut the body, likewise


class _Active:
    """One FaultConfig in force: its rules with their gates, and its random draws."""

    def __init__(self, config: FaultConfig, counts: Counter[str]) -> None:
        self.rng = random.Random(config.seed)
        self.rules = [(r, _Gate(r, counts) if r.max_in_service else None) for r in config.rules]

    def plan(self, request: web.Request) -> _Plan | None:
        """The faults for ``request``; None if no rule matches it."""
        plan = None
        for rule, gate in self.rules:
            if rule.matches(request):
                plan = plan or _Plan()
                self._draw(rule, plan)
                if gate is not None:
                    plan.gates.append(gate)
        return plan

    def _draw(self, rule: FaultRule, plan: _Plan) -> None:
        plan.delay_s += rule.latency_ms / 1000
        if (lognormal := rule.latency_lognormal) is not None:
            plan.delay_s += self.rng.lognormvariate(math.log(lognormal.median_ms), lognormal.sigma) / 1000
        if self._hit(rule.slow_fraction):
            plan.delay_s += rule.slow_ms / 1000
        plan.error |= self._hit(rule.error_rate)
        plan.stall |= self._hit(rule.stall_rate)
        if self._hit(rule.corrupt_rate):
            plan.flip = self.rng.random()  # several rules: the last one's place
        if self._hit(rule.truncate_rate):
            plan.cut = self.rng.random()

    def _hit(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate


# --- the middleware -------------------------------------------------------------------------


class FaultInjector:
    """One server's fault middleware, its config and its counters.

    :meth:`configure` swaps the config; requests that arrive afterwards see the new one, those
    in flight keep what they drew.  With no rules the middleware costs one attribute check.
    """

    def __init__(self, config: FaultConfig | None = None, *, admin_token: str | None = None) -> None:
        self.injected: Counter[str] = Counter(dict.fromkeys(KINDS, 0))
        self.stalled = 0  # requests held by a stall right now
        self.config = FaultConfig()
        self._active: _Active | None = None
        self._damages: dict[int, Damage] = {}  # id(request) -> body damage, while its handler runs
        self._closing = False
        self._admin_token = admin_token
        self.configure(config or FaultConfig())

    def configure(self, config: FaultConfig) -> None:
        self.config = config
        self._active = _Active(config, self.injected) if config.rules else None

    def _injected(self) -> dict[tuple[str, ...], float]:
        return {(kind,): self.injected[kind] for kind in KINDS}

    def status(self) -> FaultStatus:
        return FaultStatus(config=self.config, injected=dict(self.injected), stalled=self.stalled)

    def install(self, app: web.Application) -> None:
        """Hook into ``app`` (base_app puts :meth:`middleware` in its chain): stream damage,
        stall release at shutdown, /metrics gauges, and /admin/faults if there is an admin token."""
        app[FAULTS_KEY] = self
        app.on_response_prepare.append(self._on_prepare)
        app.on_shutdown.append(self._release_stalls)
        metrics = app[METRICS_KEY]
        metrics.labelled(
            "counter", "faults_injected", "Faults injected, by kind (see servers/_common/faults.py).", ("kind",), self._injected
        )
        metrics.gauge("faults_stalled_now", "Requests held by an injected stall now.", lambda: self.stalled)
        if self._admin_token:
            _Admin(self, self._admin_token).mount(app)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        active = self._active
        if active is None or request.path in PUBLIC_ROUTES:
            return await handler(request)
        plan = active.plan(request)
        if plan is None:
            return await handler(request)
        async with AsyncExitStack() as slots:
            try:
                for gate in plan.gates:
                    await slots.enter_async_context(gate.service())
            except Overloaded as exc:
                return error_reply(request, exc)
            return await self._serve(request, handler, plan)

    async def _serve(self, request: web.Request, handler: Handler, plan: _Plan) -> web.StreamResponse:
        if plan.delay_s > 0:
            self.injected["latency"] += 1
            await asyncio.sleep(plan.delay_s)
        if plan.error:
            self.injected["error"] += 1
            return error_reply(request, Unavailable(f"injected fault: {request.method} {request.path} failed"))
        if plan.stall:
            return await self._stall(request)
        if plan.flip is None and plan.cut is None:
            return await handler(request)
        return await self._damaged(request, handler, Damage(plan.flip, plan.cut, self.injected))

    async def _damaged(self, request: web.Request, handler: Handler, damage: Damage) -> web.StreamResponse:
        self._damages[id(request)] = damage  # streamed bodies: _on_prepare wraps their writes
        try:
            response = await handler(request)
        finally:
            del self._damages[id(request)]
        if isinstance(response, web.Response) and not response.prepared:
            damage.apply_to_body(response)
        return response

    async def _on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        damage = self._damages.get(id(request))
        if damage is not None and not isinstance(response, web.Response):
            damage.wrap_stream(request, response)

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        """Never answer: hold the request until its client hangs up or the server shuts
        down, then close the connection."""
        self.injected["stall"] += 1
        self.stalled += 1
        try:
            while not self._closing and _connected(request):  # noqa: ASYNC110 - aiohttp has no event for a hang-up
                await asyncio.sleep(STALL_POLL_S)
        finally:
            self.stalled -= 1
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=499, reason="Stalled")  # never sent: the connection is gone

    async def _release_stalls(self, app: web.Application) -> None:
        self._closing = True  # on_shutdown runs before aiohttp waits for the handlers


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


FAULTS_KEY = web.AppKey("faults", FaultInjector)


def fault_extensions(config: FaultConfig | None, admin_token: str | None) -> list[FaultInjector]:
    """What a server passes to ``base_app(extensions=...)``: an injector if ``config`` or
    ``admin_token`` is given (the admin token also mounts /admin/faults), else nothing, so a
    server nobody asked to fault has no fault middleware at all."""
    if config is None and not admin_token:
        return []
    return [FaultInjector(config, admin_token=admin_token)]


class _Admin:
    """GET/PUT/DELETE /admin/faults, behind their own bearer token."""

    def __init__(self, injector: FaultInjector, token: str) -> None:
        self._injector = injector
        self._expected = f"Bearer {token}".encode()

    def mount(self, app: web.Application) -> None:
        app.router.add_get(ADMIN_FAULTS_ROUTE, self.get, allow_head=False)
        app.router.add_put(ADMIN_FAULTS_ROUTE, self.put)
        app.router.add_delete(ADMIN_FAULTS_ROUTE, self.delete)

    async def get(self, request: web.Request) -> web.Response:
        self._check(request)
        return reply(request, self._injector.status())

    async def put(self, request: web.Request) -> web.Response:
        self._check(request)
        self._injector.configure(await read_body(request, FaultConfig))
        return reply(request, self._injector.status())

    async def delete(self, request: web.Request) -> web.Response:
        self._check(request)
        self._injector.configure(FaultConfig())
        return reply(request, self._injector.status())

    def _check(self, request: web.Request) -> None:
        given = request.headers.get(hdrs.AUTHORIZATION, "").encode()
        if not hmac.compare_digest(given, self._expected):
            raise Unauthorized("missing or wrong admin token")
