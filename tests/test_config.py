import pytest

import blobsdk
from blobsdk.assembly import GivenStores
from blobsdk.config import ClientConfig, WriteConfig
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.sources import LocalBlockStore, ReplicatedBlockStore

TOML = """
api_url = "http://127.0.0.1:7001"
block_urls = ["http://127.0.0.1:7101", "http://127.0.0.1:7102"]
l3_urls = []
[l1]
capacity_bytes = 123
[l2]
dir = "/tmp/l2"
capacity_bytes = 456
"""


def test_from_toml(tmp_path):
    path = tmp_path / "client.toml"
    path.write_text(TOML)
    cfg = ClientConfig.from_toml(path)
    assert cfg.api_url == "http://127.0.0.1:7001"
    assert cfg.block_urls == ("http://127.0.0.1:7101", "http://127.0.0.1:7102")
    assert cfg.l1.capacity_bytes == 123
    assert cfg.l2 is not None and cfg.l2.dir == "/tmp/l2" and cfg.l2.capacity_bytes == 456
    assert cfg.tracker_urls == ()


def test_to_toml_round_trip(tmp_path):
    cfg = ClientConfig.from_dict({"api_url": "http://a", "block_urls": ["http://b"], "token": 'x"y'})
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert ClientConfig.from_toml(path) == cfg


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^unknown key nope$"):
        ClientConfig.from_dict({"api_url": "http://a", "block_urls": ["http://b"], "nope": 1})
    with pytest.raises(ValueError, match=r"^unknown key l2\.capacity; did you mean l2\.capacity_bytes\?$"):
        ClientConfig.from_dict({"l2": {"dir": "/x", "capacity": 1}})


def test_wrong_type_is_named():
    with pytest.raises(ValueError, match=r"^api_url must be a str, got 5$"):
        ClientConfig.from_dict({"api_url": 5, "block_urls": ["http://b"]})


def test_no_block_urls():
    with pytest.raises(ValueError, match="block_urls must name at least one L4 block server"):
        ClientConfig(api_url="http://a", block_urls=())


def test_write_quorum_bounds():
    with pytest.raises(ValueError, match="write_quorum 3 must be between 1 and the 2 block_urls"):
        ClientConfig(api_url="http://a", block_urls=("http://b", "http://c"), write=WriteConfig(write_quorum=3))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'api_url = "http://a\n', "Illegal character '\\n' (at line 1, column 20)"),
        (b"\xff = 1\n", "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ],
)
def test_a_file_that_is_not_toml_is_a_value_error_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "client.toml"
    path.write_bytes(text)
    with pytest.raises(ValueError) as raised:
        ClientConfig.from_toml(path)
    assert str(raised.value) == f"{str(path)!r} is not a valid TOML file: {problem}"


def test_block_smaller_than_chunk():
    with pytest.raises(ValueError, match="block_size 10 is smaller than chunk_size 20"):
        ClientConfig(api_url="http://a", block_urls=("http://b",), write=WriteConfig(chunk_size=20, block_size=10))


def test_from_env_config_file(tmp_path):
    path = tmp_path / "client.toml"
    path.write_text(TOML)
    assert ClientConfig.from_env({"BLOBSDK_CONFIG": str(path)}).api_url == "http://127.0.0.1:7001"


def test_from_env_urls():
    cfg = ClientConfig.from_env({"BLOBSDK_API_URL": "http://a", "BLOBSDK_BLOCK_URLS": "http://b, http://c", "BLOBSDK_TOKEN": "t"})
    assert cfg.block_urls == ("http://b", "http://c") and cfg.token == "t"


def test_from_env_missing():
    with pytest.raises(ValueError, match="set BLOBSDK_CONFIG, or BLOBSDK_API_URL and BLOBSDK_BLOCK_URLS"):
        ClientConfig.from_env({})


def test_to_toml_keeps_non_default_tables(tmp_path):
    cfg = ClientConfig.from_dict(
        {
            "api_url": "http://a",
            "block_urls": ["http://b", "http://c"],
            "write": {"write_quorum": 1, "chunk_size": 1024},
            "timeouts": {"sock_read": 2.5},
            "l2": {"dir": "/x"},
        }
    )
    text = cfg.to_toml()
    assert "[write]" in text and "[timeouts]" in text and "[read]" not in text
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert ClientConfig.from_toml(path) == cfg


async def test_repair_settings_come_from_client_toml_and_reach_the_l4_tier(tmp_path):
    cfg = ClientConfig.from_dict({"repair": {"queue": 8, "demote_seconds": 5.0}})
    assert (cfg.repair.queue, cfg.repair.batch, cfg.repair.demote_seconds) == (8, 16, 5.0)
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert "[repair]" in path.read_text() and ClientConfig.from_toml(path) == cfg
    with pytest.raises(ValueError, match=r"^repair\.batch must be >= 1, got 0$"):
        ClientConfig.from_dict({"repair": {"batch": 0}})
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        ReplicatedBlockStore([LocalBlockStore(tmp_path / "r0"), LocalBlockStore(tmp_path / "r1")]) as blocks,
        blobsdk.Client(cfg, stores=GivenStores(meta, blocks)) as c,
    ):
        l4, repairer = c._open.readpath.tiers[-1], c._open.repairer
        assert repairer is not None and repairer.config == cfg.repair and l4.health.bad_bytes_seconds == 5.0


@pytest.mark.parametrize("quorum", [0, -1])
def test_a_write_quorum_below_one_is_refused(quorum):
    message = f'write.write_quorum must be a number of replicas >= 1, "all", or unset (a majority), got {quorum}'
    with pytest.raises(ValueError) as info:
        ClientConfig.from_dict({"write": {"write_quorum": quorum}})
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:
        ClientConfig(api_url="http://a", block_urls=("http://b",), write=WriteConfig(write_quorum=quorum))
    assert str(info.value) == message


def test_write_quorum_takes_all_or_a_number_and_defaults_to_a_majority():
    assert WriteConfig().write_quorum is None  # a majority of block_urls (blobsdk/sources/_replicated.py)
    config = ClientConfig.from_dict({"api_url": "http://a", "block_urls": ["http://b"], "write": {"write_quorum": "all"}})
    assert config.write.write_quorum == "all"
    assert ClientConfig.from_dict({"write": {"write_quorum": 2}}).write.write_quorum == 2
    with pytest.raises(ValueError) as info:
        ClientConfig.from_dict({"write": {"write_quorum": "most"}})
    most = "write.write_quorum must be a number of replicas >= 1, \"all\", or unset (a majority), got 'most'"
    assert str(info.value) == most
    with pytest.raises(ValueError) as info:
        WriteConfig(write_quorum="most")
    assert str(info.value) == most
