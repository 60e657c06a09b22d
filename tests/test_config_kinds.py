"""Every setting of every client.toml table is checked when its struct is built, with the same
message whichever way it is built: in Python or from client.toml (blobsdk/_settings.py).  Its
kind (a str, a bool, a list of str, one of a Literal's values, a table), a server URL's scheme,
and (tests/test_config_numbers.py) each number's kind and range.  In Python a value of the
wrong kind is a TypeError; from a file every refusal is a ValueError."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import msgspec
import pytest

from blobsdk.config import ClientConfig, L1Config, S3Config
from tests.test_config_numbers import TABLES, toml_value

ALL_TABLES: dict[str, tuple[type[msgspec.Struct], dict[str, Any]]] = {"": (ClientConfig, {}), **TABLES, "s3": (S3Config, {})}

COMPRESSION = 'write.compression must be one of "auto", "lz4", "none", got '

# table ("" for the top level), key, value, the error in Python, its message (the same from TOML)
CASES: list[tuple[str, str, Any, type[Exception], str]] = [
    ("write", "compression", "zstd", ValueError, COMPRESSION + "'zstd'"),
    ("write", "compression", 4, TypeError, COMPRESSION + "4"),
    ("", "block_urls", "http://127.0.0.1:7101", TypeError, "block_urls must be a list of str, got 'http://127.0.0.1:7101'"),
    ("", "l3_urls", ["http://a", 3], TypeError, "l3_urls must be a list of str, got ['http://a', 3]"),
    ("", "tracker_urls", [["http://a"]], TypeError, "tracker_urls must be a list of str, got [['http://a']]"),
    ("", "block_urls", ["localhost:7101"], ValueError, "block_urls must be http:// or https:// URLs, got 'localhost:7101'"),
    ("", "api_url", "localhost:7001", ValueError, "api_url must be an http:// or https:// URL, got 'localhost:7001'"),
    ("", "api_url", 5, TypeError, "api_url must be a str, got 5"),
    ("", "token", True, TypeError, "token must be a str, got True"),
    ("", "l1", 3, TypeError, "l1 must be an L1Config, not int"),
    ("", "l2", "/nvme/l2", TypeError, "l2 must be None or an L2Config, not str"),
    ("", "hedge", [1], TypeError, "hedge must be a HedgeConfig, not list"),
    ("s3", "allow_http", "yes", TypeError, "s3.allow_http must be a bool, got 'yes'"),
    ("s3", "endpoint", 9000, TypeError, "s3.endpoint must be a str, got 9000"),
    ("hedge", "enabled", 1, TypeError, "hedge.enabled must be a bool, got 1"),
    ("limiter", "algorithm", "AIMD", ValueError, 'limiter.algorithm must be one of "gradient", "aimd", got \'AIMD\''),
    ("peer", "allowed_networks", "10.0.0.0/8", TypeError, "peer.allowed_networks must be a list of str, got '10.0.0.0/8'"),
    ("peer", "host", 127, TypeError, "peer.host must be a str, got 127"),
    ("l2", "dir", 3, TypeError, "l2.dir must be a str, got 3"),
    ("read", "shared_plan_cache_url", ["redis://r"], TypeError, "read.shared_plan_cache_url must be a str, got ['redis://r']"),
    ("write", "chunk_size", "4MiB", TypeError, "write.chunk_size must be an int from 1 to 67108864, got '4MiB'"),
    ("timeouts", "connect", -1, ValueError, "timeouts.connect must be > 0, got -1"),
]


def built_in_python(table: str, key: str, value: Any) -> Any:
    struct, required = ALL_TABLES[table]
    return struct(**{**required, key: value})


def built_from_toml(tmp_path: Path, table: str, key: str, value: Any) -> ClientConfig:
    _, required = ALL_TABLES[table]
    lines = [*([f"[{table}]"] if table else []), *(f"{k} = {toml_value(v)}" for k, v in {**required, key: value}.items())]
    path = tmp_path / "client.toml"
    path.write_text("\n".join(lines) + "\n")
    return ClientConfig.from_toml(path)


@pytest.mark.parametrize(
    ("table", "key", "value", "error", "message"), CASES, ids=[f"{t}.{k}={v!r}".lstrip(".") for t, k, v, *_ in CASES]
)
def test_a_bad_setting_is_refused_with_the_same_message_in_python_and_in_toml(
    tmp_path: Path, table: str, key: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as in_python:
        built_in_python(table, key, value)
    with pytest.raises(ValueError) as in_toml:
        built_from_toml(tmp_path, table, key, value)
    assert (type(in_python.value), str(in_python.value), str(in_toml.value)) == (error, message, message)


def wrong_kind(annotation: Any) -> Any:
    """A value of the wrong kind for a field so annotated (one TOML can hold)."""
    options = get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if any(option in (int, float) for option in options):
        return "3"
    if bool in options:
        return "yes"
    if str in options or any(get_origin(option) is Literal for option in options):
        return 3
    return "x"  # a list of str, or a table


FIELDS = [
    pytest.param(table, field.name, wrong_kind(field.type), id=f"{table}.{field.name}".lstrip("."))
    for table, (struct, _) in ALL_TABLES.items()
    for field in msgspec.structs.fields(struct)
]


@pytest.mark.parametrize(("table", "key", "value"), FIELDS)
def test_every_field_of_every_table_refuses_a_value_of_the_wrong_kind_either_way(
    tmp_path: Path, table: str, key: str, value: Any
) -> None:
    """So a field added later is checked too, or this fails."""
    with pytest.raises((TypeError, ValueError)) as in_python:
        built_in_python(table, key, value)
    with pytest.raises(ValueError) as in_toml:
        built_from_toml(tmp_path, table, key, value)
    assert str(in_python.value) == str(in_toml.value)
    assert f"{table}.{key}" in str(in_python.value) if table else str(in_python.value).startswith(key)


def test_a_list_of_str_is_kept_as_a_tuple_either_way(tmp_path: Path) -> None:
    urls = ["http://127.0.0.1:7101", "http://127.0.0.1:7102"]
    config = ClientConfig(api_url="http://127.0.0.1:7001", block_urls=urls)
    (tmp_path / "client.toml").write_text(f'api_url = "http://127.0.0.1:7001"\nblock_urls = {toml_value(urls)}\n')
    assert config.block_urls == tuple(urls) and hash(config) == hash(ClientConfig.from_toml(tmp_path / "client.toml"))


def test_a_table_is_a_struct_in_python_and_a_toml_table_in_a_file(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"^l1 must be an L1Config, not dict$"):
        ClientConfig(l1={"capacity_bytes": 0})
    (tmp_path / "client.toml").write_text("[l1]\ncapacity_bytes = 0\n")
    assert ClientConfig.from_toml(tmp_path / "client.toml").l1 == L1Config(capacity_bytes=0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"block_url": ["http://b"]}, "unknown key block_url; did you mean block_urls?"),
        ({"l2": {"dir": "/x", "capacity": 1}}, "unknown key l2.capacity; did you mean l2.capacity_bytes?"),
        ({"peer": {"nope": 1}}, "unknown key peer.nope"),
        ({"l2": {"capacity_bytes": 1}}, "l2.dir is required"),
        ([], "a client config must be a table of keys, got []"),
    ],
)
def test_a_file_with_a_key_no_table_has_or_without_a_required_one_is_refused_naming_it(raw: Any, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        ClientConfig.from_dict(raw)
    assert str(exc.value) == message
