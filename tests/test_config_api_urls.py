"""``api_url`` (one API server) and ``api_urls`` (several, failed over between): the same
checks and messages from client.toml, from Python and from ``BLOBSDK_API_URL``."""

from __future__ import annotations

import pytest

from blobsdk.config import ClientConfig

BLOCKS = ("http://b:1",)


def from_toml(tmp_path, text: str) -> ClientConfig:
    path = tmp_path / "client.toml"
    path.write_text(text + '\nblock_urls = ["http://b:1"]\n')
    return ClientConfig.from_toml(path)


def test_api_urls_name_several_servers_and_api_url_one():
    several = ClientConfig(api_urls=("http://a:1", "http://a:2"), block_urls=BLOCKS)
    assert several.api_servers == ("http://a:1", "http://a:2") and several.api_url is None
    assert ClientConfig(api_url="http://a:1", block_urls=BLOCKS).api_servers == ("http://a:1",)
    assert ClientConfig().api_servers == ()


def test_api_urls_in_toml_and_round_trip(tmp_path):
    config = from_toml(tmp_path, 'api_urls = ["http://a:1", "http://a:2"]')
    assert config.api_servers == ("http://a:1", "http://a:2")
    assert ClientConfig.from_dict({"api_urls": ["http://a:1", "http://a:2"], "block_urls": list(BLOCKS)}) == config
    (tmp_path / "again.toml").write_text(config.to_toml())
    assert ClientConfig.from_toml(tmp_path / "again.toml") == config
    assert "api_urls" not in ClientConfig(api_url="http://a:1", block_urls=BLOCKS).to_toml()


def test_the_environment_takes_one_or_several_comma_separated():
    one = ClientConfig.from_env({"BLOBSDK_API_URL": "http://a:1", "BLOBSDK_BLOCK_URLS": "http://b:1"})
    assert (one.api_url, one.api_urls) == ("http://a:1", ())
    several = ClientConfig.from_env({"BLOBSDK_API_URL": "http://a:1, http://a:2", "BLOBSDK_BLOCK_URLS": "http://b:1"})
    assert (several.api_url, several.api_urls) == (None, ("http://a:1", "http://a:2"))


BAD = [
    (
        {"api_url": "http://a:1", "api_urls": ["http://a:2", "http://a:3"]},
        "api_url and api_urls both name the API servers: set one (api_urls lists several)",
    ),
    ({"api_urls": ["http://a:1", "a:2"]}, "api_urls must be http:// or https:// URLs, got 'a:2'"),
    ({"api_urls": ["http://a:1", "http://a:1"]}, "api_urls names 'http://a:1' twice"),
    (
        {"api_urls": ["http://a:1", "http://a:2"], "metadata_url": "redis://r:1/0"},
        "api_urls and metadata_url both name the metadata: set one",
    ),
    ({"api_urls": []}, "L4 needs its metadata: an api_url (the metadata API server) or a metadata_url (Redis)"),
]


@pytest.mark.parametrize(("raw", "message"), BAD)
def test_bad_api_urls_have_one_message_from_toml_and_python(raw, message):
    with pytest.raises(ValueError) as from_dict:
        ClientConfig.from_dict({**raw, "block_urls": list(BLOCKS)})
    assert str(from_dict.value) == message
    python = {key: tuple(value) if isinstance(value, list) else value for key, value in raw.items()}
    with pytest.raises(ValueError) as built:
        ClientConfig(**python, block_urls=BLOCKS)
    assert str(built.value) == message


def test_a_list_in_api_url_points_to_api_urls(tmp_path):
    message = "api_url must be a str, got ['http://a:1', 'http://a:2']: several API servers go in api_urls"
    with pytest.raises(ValueError) as caught:
        from_toml(tmp_path, 'api_url = ["http://a:1", "http://a:2"]')
    assert str(caught.value) == message
    with pytest.raises(TypeError) as typed:
        ClientConfig(api_url=["http://a:1", "http://a:2"], block_urls=BLOCKS)  # type: ignore[arg-type]
    assert str(typed.value) == message


def test_a_str_in_api_urls_is_refused(tmp_path):
    with pytest.raises(ValueError) as caught:
        from_toml(tmp_path, 'api_urls = "http://a:1"')
    assert str(caught.value) == "api_urls must be a list of str, got 'http://a:1'"
    with pytest.raises(TypeError) as typed:
        ClientConfig(api_urls="http://a:1", block_urls=BLOCKS)  # type: ignore[arg-type]
    assert str(typed.value) == "api_urls must be a list of str, got 'http://a:1'"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://a:1, a:2", "api_urls must be http:// or https:// URLs, got 'a:2'"),
        ("http://a:1,http://a:1", "api_urls names 'http://a:1' twice"),
        ("a:1", "api_url must be an http:// or https:// URL, got 'a:1'"),
    ],
)
def test_bad_environment_values_have_the_same_messages(value, message):
    with pytest.raises(ValueError) as caught:
        ClientConfig.from_env({"BLOBSDK_API_URL": value, "BLOBSDK_BLOCK_URLS": "http://b:1"})
    assert str(caught.value) == message


def test_a_bad_api_failover_timeout_is_refused():
    with pytest.raises(ValueError) as caught:
        ClientConfig.from_dict({"timeouts": {"api_failover": 0}})
    assert str(caught.value) == "timeouts.api_failover must be > 0, got 0"
