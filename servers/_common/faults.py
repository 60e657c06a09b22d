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

A SPEC is ``KEY=VALUE`` pairs separated by ``;``, KEY a :class:`FaultRule` field; rates
take ``0.1`` or ``10%``; ``methods=GET,PUT``; ``latency_lognormal=MEDIAN_MS,SIGMA``.
PUT /admin/faults takes a FaultConfig (JSON or msgpack) and affects requests that arrive
afterwards; GET answers a :class:`FaultStatus`; DELETE switches faults off.  Injected
faults are counted per kind in both GET /admin/faults and /metrics (counter
``<server>_faults_injected_total{kind}``; gauge ``<server>_faults_stalled_now`` is the
requests held by stalls).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
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

FAULTS_ENV = "BLOBSDK_FAULTS"
KINDS = ("latency", "error", "stall", "corrupt", "truncate", "overload_reject", "overload_slow")
STALL_POLL_S = 0.05  # how soon a stalled request notices a hang-up or shutdown
_INF = math.inf


class Lognormal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A latency of ``median_ms * exp(sigma * N(0, 1))`` milliseconds."""

    median_ms: float
    sigma: float

    def __post_init__(self) -> None:
        if not (0 < self.median_ms < _INF and 0 <= self.sigma < _INF):
            raise ValueError("latency_lognormal needs median_ms > 0 and sigma >= 0")


class FaultRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Faults for the requests one rule selects (see the module docstring for the order).

    ``route`` is ``"*"`` (every route but /healthz, /metrics, /admin/faults), an aiohttp
    canonical route such as ``"/v1/blocks/{block_id}"`` (matched exactly), or a path prefix
    matched by whole segments (``"/v1/blocks"`` matches ``/v1/blocks/x``, not ``/v1/blocksx``).
    ``methods`` are upper-case names; empty means all.  Rates are probabilities in [0, 1].
    """

    route: str = "*"
    methods: tuple[str, ...] = ()
    latency_ms: float = 0.0
    latency_lognormal: Lognormal | None = None
    slow_fraction: float = 0.0
    slow_ms: float = 0.0
    error_rate: float = 0.0
    stall_rate: float = 0.0
    corrupt_rate: float = 0.0
    truncate_rate: float = 0.0
    max_in_service: int | None = None  # None: no overload emulation
    queue_limit: int | None = None  # requests that may wait for a slot; None: no bound
    overload: Literal["reject", "slow"] = "reject"
    overload_delay_ms: float = 10.0  # "slow": per place past queue_limit (0 if None)

    def __post_init__(self) -> None:
        problems = [msg for bad, msg in _rule_checks(self) if bad]
        if problems:
            raise ValueError("invalid fault rule: " + "; ".join(problems))

    def matches(self, request: web.Request) -> bool:
        if self.methods and request.method not in self.methods:
            return False
        if self.route == "*":
            return True
        if "{" in self.route:
            resource = request.match_info.route.resource
            return resource is not None and resource.canonical == self.route
        prefix = self.route.rstrip("/")
        return request.path == prefix or request.path.startswith(prefix + "/")


def _rule_checks(r: FaultRule) -> list[tuple[bool, str]]:
    rates = (r.slow_fraction, r.error_rate, r.stall_rate, r.corrupt_rate, r.truncate_rate)
    return [
        (r.route != "*" and not r.route.startswith("/"), "route must be '*' or start with '/'"),
        (any(not m or m != m.upper() for m in r.methods), "methods must be upper-case names such as GET"),
        (not all(0 <= p <= 1 for p in rates), "rates and slow_fraction must be in [0, 1]"),
        (not all(0 <= ms < _INF for ms in (r.latency_ms, r.slow_ms, r.overload_delay_ms)), "*_ms must be >= 0"),
        (r.max_in_service is not None and r.max_in_service < 1, "max_in_service must be >= 1"),
        (r.queue_limit is not None and r.queue_limit < 0, "queue_limit must be >= 0"),
        (r.queue_limit is not None and r.max_in_service is None, "queue_limit needs max_in_service"),
    ]


class FaultConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The faults one server injects: rules, each applied to every request it matches, and
    the seed of their random draws (None: a fresh random seed)."""

    rules: tuple[FaultRule, ...] = ()
    seed: int | None = None


class FaultStatus(msgspec.Struct, frozen=True, kw_only=True):
    """GET /admin/faults: the config in force, faults injected so far per kind (since the
    server started), and requests stalled right now."""

    config: FaultConfig
    injected: dict[str, int]
    stalled: int


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


# --- damaged bodies -------------------------------------------------------------------------


def _offset(fraction: float, size: int) -> int:
    return min(int(fraction * size), size - 1)


class _Damage:
    """The body damage planned for one request, applied to whichever response it gets."""

    def __init__(self, plan: _Plan, counts: Counter[str]) -> None:
        self.flip, self.cut, self.counts = plan.flip, plan.cut, counts

    def apply_to_body(self, response: web.Response) -> None:
        """Damage a response whose body is bytes and not sent yet."""
        body = response.body
        if not isinstance(body, (bytes, bytearray)) or not body:
            return
        data = bytearray(body)
        if self.flip is not None:
            data[_offset(self.flip, len(data))] ^= 0xFF
            self.counts["corrupt"] += 1
        if self.cut is None:
            response.body = data
            return
        response.body = data[: _offset(self.cut, len(data))]
        response.headers[hdrs.CONTENT_LENGTH] = str(len(data))  # the whole length: the client waits for more
        response.force_close()
        self.counts["truncate"] += 1

    def wrap_stream(self, request: web.Request, response: web.StreamResponse) -> None:
        """Damage a StreamResponse's writes from now on (called as it is prepared)."""
        size = response.content_length
        if size == 0:
            return
        size = size or 1  # unknown length (chunked): damage its first byte
        flip_at = None if self.flip is None else _offset(self.flip, size)
        cut_at = None if self.cut is None else _offset(self.cut, size)
        _DamagedStream(request, response, flip_at, cut_at, self.counts)


_WRAPPED = web.ResponseKey("blobsdk_faults_wrapped_writes", bool)


def writes_wrapped(response: web.StreamResponse) -> bool:
    """Whether this prepared response's writes are damaged: a handler that would send its
    body around ``response.write`` (sendfile) must write it through them instead."""
    return bool(response.get(_WRAPPED, False))


class _DamagedStream:
    """Stands in for one StreamResponse's ``write``/``write_eof``: flips the body byte at
    ``flip_at``, and after ``cut_at`` bytes closes the connection and drops the rest."""

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        flip_at: int | None,
        cut_at: int | None,
        counts: Counter[str],
    ) -> None:
        self._request, self._response, self._counts = request, response, counts
        self._flip_at, self._cut_at = flip_at, cut_at
        self._sent = 0
        self._hung_up = False
        self._write, self._write_eof = response.write, response.write_eof
        response.write = self.write  # type: ignore[method-assign]
        response.write_eof = self.write_eof  # type: ignore[method-assign]
        response[_WRAPPED] = True

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._hung_up:
            return
        view = memoryview(data).cast("B")
        if self._cut_at is not None:
            view = view[: self._cut_at - self._sent]
        if view.nbytes:
            await self._write(self._flipped(view))
        self._sent += view.nbytes
        if self._sent == self._cut_at:
            self._hang_up()

    async def write_eof(self, data: bytes = b"") -> None:
        if data:
            await self.write(data)
        if not self._hung_up:
            await self._write_eof()

    def _flipped(self, view: memoryview) -> memoryview | bytearray:
        """``view``, or a copy with the byte at ``flip_at`` flipped (never the caller's buffer)."""
        at = self._flip_at
        if at is None or not self._sent <= at < self._sent + view.nbytes:
            return view
        piece = bytearray(view)
        piece[at - self._sent] ^= 0xFF
        self._counts["corrupt"] += 1
        return piece

    def _hang_up(self) -> None:
        self._hung_up = True
        self._counts["truncate"] += 1
        self._response.force_close()
        if (transport := self._request.transport) is not None:
            transport.close()  # sends what is buffered, then closes: the body stays short


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
        self._damages: dict[int, _Damage] = {}  # id(request) -> body damage, while its handler runs
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
        return await self._damaged(request, handler, _Damage(plan, self.injected))

    async def _damaged(self, request: web.Request, handler: Handler, damage: _Damage) -> web.StreamResponse:
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


# --- command line -------------------------------------------------------------------------


_RULE_FIELDS = FaultRule.__struct_fields__


def parse_rule(spec: str) -> FaultRule:
    """A rule from ``KEY=VALUE;KEY=VALUE`` (see the module docstring); ValueError if invalid."""
    fields: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in _RULE_FIELDS:
            raise ValueError(f"fault spec {spec!r}: {item!r} is not KEY=VALUE, KEY one of {', '.join(_RULE_FIELDS)}")
        fields[key] = _spec_value(key, value)
    try:
        return msgspec.convert(fields, FaultRule, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"fault spec {spec!r}: {exc}") from exc


def _spec_value(key: str, value: str) -> Any:
    if key == "methods":
        return [m.strip().upper() for m in value.split(",") if m.strip()]
    if key == "latency_lognormal":
        median, _, sigma = value.partition(",")
        return {"median_ms": median.strip(), "sigma": sigma.strip()}
    try:
        return float(value[:-1]) / 100 if value.endswith("%") else value
    except ValueError:
        return value  # not a number: msgspec names the field that wanted one


def parse_env(value: str) -> FaultConfig:
    """The value of BLOBSDK_FAULTS: a FaultConfig as JSON, or specs separated by ``|``."""
    if value.lstrip().startswith("{"):
        try:
            return msgspec.json.decode(value, type=FaultConfig)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{FAULTS_ENV}: {exc}") from exc
    return FaultConfig(rules=tuple(parse_rule(spec) for spec in value.split("|") if spec.strip()))


def config_of_args(args: argparse.Namespace, env_value: str | None) -> FaultConfig | None:
    """The rules of ``env_value`` (BLOBSDK_FAULTS, read by the caller's main) then of
    ``--fault``, seeded by ``--fault-seed`` if given; None if there is nothing to inject.
    ValueError if a spec is invalid."""
    base = parse_env(env_value) if env_value else FaultConfig()
    rules = (*base.rules, *(parse_rule(spec) for spec in args.fault))
    seed = base.seed if args.fault_seed is None else args.fault_seed
    if not rules and seed is None:
        return None
    return FaultConfig(rules=rules, seed=seed)
