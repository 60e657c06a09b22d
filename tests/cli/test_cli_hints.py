"""The CLI's errors that say what to change: ``prefetch --tier l2`` on a config with no L2
names the ``[l2]`` table to add (the cluster's own client.toml has none: L2 is this host's);
``prefetch`` into L3, the default, with no L3 nodes says where they go, or what to use."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_cli import run

L2_TABLE = '[l2]\ndir = "{dir}"\ncapacity_bytes = 10737418240  # 10 GiB\n'


def test_prefetch_into_l2_on_a_client_toml_without_one_says_what_to_add(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"  # as blobsdk-cluster writes it: no [l2] (nothing listens: nothing is called)
    config.write_text('api_url = "http://127.0.0.1:9"\nblock_urls = ["http://127.0.0.1:9"]\nl3_urls = ["http://127.0.0.1:9"]\n')
    result = run("--config", str(config), "prefetch", "--tier", "l2", "/b/")
    expected = (
        f"blobsdk: error: --tier l2 warms this host's L2 cache, and {config} has no [l2] table: add one (dir: a directory"
        " on this host's local flash; capacity_bytes: the most it may hold), e.g.\n\n" + L2_TABLE.format(dir=tmp_path / "l2")
    )
    assert (result.returncode, result.stdout, result.stderr.decode()) == (2, b"", expected)


def test_the_table_it_names_is_one_that_works(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text(
        f'api_url = "http://127.0.0.1:9"\nblock_urls = ["http://127.0.0.1:9"]\n\n{L2_TABLE.format(dir=tmp_path / "l2")}'
    )
    result = run("--config", str(config), "prefetch", "--tier", "l2", "/b/x")  # now it runs: the API server is not there
    assert result.returncode == 1 and b"[l2]" not in result.stderr


def test_prefetch_into_l2_on_a_local_store_says_it_has_none(tmp_path: Path) -> None:
    result = run("--create", "prefetch", "--tier", "l2", "/b/", store=tmp_path / "store")
    expected = (
        "blobsdk: error: --tier l2 warms an L2 cache, and a --local store has none: pass --config FILE, a client.toml"
        " with an [l2] table\n"
    )
    assert (result.returncode, result.stderr.decode()) == (2, expected)


def test_prefetch_into_l3_on_a_local_store_says_it_has_no_shared_cache(tmp_path: Path) -> None:
    result = run("--create", "prefetch", "/b/", store=tmp_path / "store")
    expected = (
        "blobsdk: error: prefetch warms a shared cache (--tier l3, the default: the L3 flash nodes; --tier l2: this host's"
        " L2), and a --local store has neither: pass --config FILE, a cluster's client.toml (blobsdk-cluster writes one)\n"
    )
    assert (result.returncode, result.stdout, result.stderr.decode()) == (2, b"", expected)


def test_prefetch_into_l3_on_a_config_without_nodes_says_where_they_go(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"  # nothing listens: nothing is called
    config.write_text('api_url = "http://127.0.0.1:9"\nblock_urls = ["http://127.0.0.1:9"]\n')
    result = run("--config", str(config), "prefetch", "/b/")
    expected = (
        f"blobsdk: error: --tier l3 (the default) warms the L3 flash nodes, and {config} names none: list them in"
        " l3_urls, or warm this host's L2 with --tier l2\n"
    )
    assert (result.returncode, result.stdout, result.stderr.decode()) == (2, b"", expected)


def test_prefetch_checks_its_paths_as_every_command_does(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"  # nothing listens: the path is refused before any call
    config.write_text('api_url = "http://127.0.0.1:9"\nblock_urls = ["http://127.0.0.1:9"]\nl3_urls = ["http://127.0.0.1:9"]\n')
    result = run("--config", str(config), "prefetch", "a/b")
    assert (result.returncode, result.stderr.decode()) == (1, "blobsdk: error: path must be absolute (start with '/'): 'a/b'\n")
