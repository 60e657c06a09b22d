"""Every number of every client.toml table is checked when its struct is built, from TOML or
in Python, with the same message naming the field: out of range, nan and the infinities,
bools where numbers are meant, floats where ints are (ValueError), strings (TypeError in
Python; from a file every refusal is a ValueError)."""

from __future__ import annotations

import json
import math
import types
from typing import Any

import msgspec
import pytest

from blobsdk.config import (
    ClientConfig,
    HedgeConfig,
    L1Config,
    L2Config,
    L3Config,
    LimiterConfig,
    PeerConfig,
    ReadConfig,
    RepairConfig,
    Timeouts,
    WriteConfig,
)

TABLES: dict[str, tuple[type[msgspec.Struct], dict[str, Any]]] = {
    "l1": (L1Config, {}),
    "l2": (L2Config, {"dir": "/tmp/l2"}),
    "l3": (L3Config, {}),
    "peer": (PeerConfig, {}),
    "timeouts": (Timeouts, {}),
    "write": (WriteConfig, {}),
    "read": (ReadConfig, {}),
    "hedge": (HedgeConfig, {}),
    "limiter": (LimiterConfig, {}),
    "repair": (RepairConfig, {}),
}

# table, field, int or float, what it must be, a value out of that range
RULES: list[tuple[str, str, type, str, Any]] = [
    ("l1", "capacity_bytes", int, ">= 0", -5),
    ("l1", "ttl_seconds", float, "> 0", 0),
    ("l2", "capacity_bytes", int, ">= 0", -1),
    ("l2", "min_free_ratio", float, "in [0, 1)", 1.0),
    ("l2", "ttl_seconds", float, "> 0", -1.0),
    ("l3", "replicas", int, ">= 1", 0),
    ("l3", "down_seconds", float, ">= 0", -0.5),
    ("peer", "port", int, "from 0 to 65535", 70000),
    ("peer", "budget_bytes", int, ">= 0", -1),
    ("peer", "max_uploads", int, ">= 1", 0),
    ("peer", "timeout_s", float, "> 0", 0),
    ("peer", "wait_s", float, "> 0", -1),
    ("peer", "tracker_timeout_s", float, "> 0", 0.0),
    ("peer", "fetch_budget_s", float, "> 0", 0.0),
    ("timeouts", "connect", float, "> 0", -1),
    ("timeouts", "sock_read", float, "> 0", 0),
    ("timeouts", "total", float, "> 0", -300.0),
    ("timeouts", "stall", float, "> 0", 0),
    ("timeouts", "api_failover", float, "> 0", 0),
    ("write", "chunk_size", int, "from 1 to 67108864", 0),
    ("write", "block_size", int, ">= 1", 0),
    ("write", "parallel_blocks", int, ">= 1", -1),
    ("write", "max_write_seconds", float, "> 0", 0),
    ("read", "parallel_chunks", int, ">= 1", -1),
    ("read", "plan_cache_ttl_seconds", float, ">= 0", -1),
    ("read", "plan_cache_entries", int, ">= 1", 0),
    ("read", "shared_plan_cache_ttl_seconds", float, "> 0", 0),
    ("hedge", "min_delay_ms", float, ">= 0", -1),
    ("hedge", "max_delay_ms", float, ">= 0", -2.5),
    ("hedge", "quantile", float, "in (0, 1]", 0),
    ("hedge", "budget_ratio", float, ">= 0", -0.1),
    ("hedge", "budget_burst", float, ">= 0", -1),
    ("hedge", "max_parallel", int, ">= 1", 0),
    ("hedge", "window", int, ">= 8", 7),
    ("hedge", "hang_factor", float, "> 0", 0),
    ("hedge", "hang_min_ms", float, "> 0", 0),
    ("hedge", "hang_max_ms", float, "> 0", -1),
    ("hedge", "probe_after_s", float, "> 0", 0),
    ("hedge", "probe_max_s", float, "> 0", 0),
    ("limiter", "initial", int, ">= 1", 0),
    ("limiter", "min_limit", int, ">= 1", 0),
    ("limiter", "max_limit", int, ">= 1", -1),
    ("limiter", "backoff", float, "in (0, 1)", 1),
    ("limiter", "tolerance", float, ">= 1", 0.5),
    ("limiter", "smoothing", float, "in (0, 1]", 0),
    ("limiter", "min_rtt_window_s", float, "> 0", 0),
    ("repair", "queue", int, ">= 1", 0),
    ("repair", "batch", int, ">= 1", -1),
    ("repair", "concurrency", int, ">= 1", 0),
    ("repair", "demote_seconds", float, ">= 0", -1),
    ("repair", "retry_seconds", float, "> 0", 0),
    ("repair", "retry_max_seconds", float, "> 0", -1),
]


def bad_values(kind: type, must: str, out_of_range: Any) -> list[tuple[Any, str]]:
    """(value, the words after "must be") for every way a value of this rule can be bad."""
    noun = "an int" if kind is int else "a number"
    cases = [(out_of_range, must), (True, f"{noun} {must}"), ("3", f"{noun} {must}")]
    if kind is int:
        return [*cases, (1.5, f"an int {must}"), (math.nan, f"an int {must}")]
    return [*cases, (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite")]


CASES = [
    pytest.param(table, field, value, f"{table}.{field} must be {words}, got {value!r}", id=f"{table}.{field}={value!r}")
    for table, field, kind, must, out_of_range in RULES
    for value, words in bad_values(kind, must, out_of_range)
]


@pytest.mark.parametrize(("table", "field", "value", "message"), CASES)
def test_a_bad_number_is_refused_in_python_with_the_fields_name(table: str, field: str, value: Any, message: str) -> None:
    struct, required = TABLES[table]
    with pytest.raises(TypeError if isinstance(value, str) else ValueError) as exc:
        struct(**required, **{field: value})
    assert str(exc.value) == message


@pytest.mark.parametrize(("table", "field", "value", "message"), CASES)
def test_a_bad_number_is_refused_in_client_toml_with_the_same_message(
    tmp_path, table: str, field: str, value: Any, message: str
) -> None:
    """Through the TOML file (nan and inf are TOML floats, true a bool, "3" a string)."""
    _, required = TABLES[table]
    lines = [f"[{table}]", *(f"{k} = {toml_value(v)}" for k, v in required.items()), f"{field} = {toml_value(value)}"]
    path = tmp_path / "client.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as exc:
        ClientConfig.from_toml(path)
    assert str(exc.value) == message


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def test_every_numeric_field_of_every_table_has_a_rule() -> None:
    """So a field added later without a rule fails here."""
    numeric = {
        (table, f.name) for table, (struct, _) in TABLES.items() for f in msgspec.structs.fields(struct) if _is_number(f.type)
    }
    # write.write_quorum (int | "all" | None) has its own rule: tests/test_config.py::test_a_write_quorum_below_one_is_refused
    assert numeric == {(table, field) for table, field, *_ in RULES}
    assert {f.name for f in msgspec.structs.fields(ClientConfig) if _is_number(f.type)} == set()


def _is_number(annotation: Any) -> bool:
    options = annotation.__args__ if isinstance(annotation, types.UnionType) else (annotation,)
    return any(option in (int, float) for option in options)


@pytest.mark.parametrize("table", list(TABLES))
def test_the_defaults_and_their_bounds_are_valid(table: str) -> None:
    struct, required = TABLES[table]
    assert struct(**required) == msgspec.convert(required, struct)


def test_a_replaced_value_is_checked_too() -> None:
    with pytest.raises(ValueError, match=r"^timeouts\.total must be finite, got inf$"):
        msgspec.structs.replace(Timeouts(), total=math.inf)


def test_good_values_at_the_edges_are_kept() -> None:
    assert L1Config(capacity_bytes=0, ttl_seconds=1).ttl_seconds == 1  # an int for a float is fine
    assert PeerConfig(port=65535).port == 65535 and L2Config(dir="d", min_free_ratio=0).min_free_ratio == 0
    assert HedgeConfig(quantile=1, window=8).window == 8 and LimiterConfig(smoothing=1).smoothing == 1
    assert WriteConfig(chunk_size=64 << 20, block_size=64 << 20).chunk_size == 64 << 20
    assert ReadConfig(plan_cache_ttl_seconds=0).plan_cache_ttl_seconds == 0
