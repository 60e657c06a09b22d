"""The faults a server may inject, as data: :class:`FaultRule` (which requests, what they go
through), :class:`FaultConfig` (the rules and the seed of their draws), :class:`FaultStatus`
(what GET /admin/faults answers), and their text forms: a ``--fault`` SPEC
(:func:`parse_rule`), the value of ``BLOBSDK_FAULTS`` (:func:`parse_env`) and a server's fault
flags (:func:`config_of_args`).  What the rules do to a request is servers/_common/faults.py
(the middleware); how a body is damaged is servers/_common/faultbodies.py.

A SPEC is ``KEY=VALUE`` pairs separated by ``;``, KEY a :class:`FaultRule` field; rates
take ``0.1`` or ``10%``; ``methods=GET,PUT``; ``latency_lognormal=MEDIAN_MS,SIGMA``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Literal

import msgspec
from aiohttp import web

FAULTS_ENV = "BLOBSDK_FAULTS"
_INF = math.inf


class Lognormal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A latency of ``median_ms * exp(sigma * N(0, 1))`` milliseconds."""

    median_ms: float
    sigma: float

    def __post_init__(self) -> None:
        if not (0 < self.median_ms < _INF and 0 <= self.sigma < _INF):
            raise ValueError("latency_lognormal needs median_ms > 0 and sigma >= 0")


class FaultRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Faults for the requests one rule selects (servers/_common/faults.py says in which order).

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


# --- text forms: --fault, BLOBSDK_FAULTS ----------------------------------------------------


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
