"""The pytest plugin servers/testing.py, and the conformance suites of blobsdk/testing/, as a
user's suite uses them: each test writes a small test module and runs pytest on it in a
subprocess (``pytester``), with the plugin loaded by ``-p blobsdk_servers.testing`` (the
installed name of servers/testing.py) or by its pytest11 entry point, or a backend's tests
subclassing the suites from the package, outside this repository's tests/."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tomllib

import pytest

from servers import cluster, testing
from tests.helpers import ROOT
from tests.project.test_examples import clean_env
from tests.servers.test_cluster import _alive as running
from tests.servers.test_cluster import _wait_for

pytest_plugins = ["pytester"]

# The user's suite: strict asyncio mode (async tests and fixtures are marked), warnings are errors.
INI = "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\nfilterwarnings = error\n"


@pytest.fixture
def user(pytester, monkeypatch):
    """pytester with this tree first on the subprocess's path (as the cluster's servers get it)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    pytester.makeini(INI)
    return pytester


def test_the_plugin_knows_every_kind_of_server():
    assert tuple(kind.name for kind in cluster.KINDS) == testing.KINDS


EMBEDDED = """
import pytest
import blobsdk

@pytest.mark.asyncio
async def test_async(blob_client):
    assert isinstance(blob_client, blobsdk.Client)
    await blob_client.put("/b/x", b"hello")
    assert await blob_client.get("/b/x") == b"hello"

def test_sync(blob_sync_client):
    blob_sync_client.put("/b/x", b"hello")
    assert blob_sync_client.get("/b/x") == b"hello"

def test_each_test_has_its_own_store(blob_sync_client):
    with pytest.raises(blobsdk.BlobNotFound):
        blob_sync_client.get("/b/x")
"""


def test_the_embedded_clients_are_open_on_a_store_of_their_own(user):
    user.makepyfile(EMBEDDED)
    user.runpytest_subprocess("-p", "blobsdk_servers.testing").assert_outcomes(passed=3)


def test_the_sync_fixtures_need_no_pytest_asyncio_and_the_async_one_says_it_does(user):
    user.makeini("[pytest]\nfilterwarnings = error\n")
    user.makepyfile(
        """
        def test_sync(blob_sync_client):
            blob_sync_client.put("/b/x", b"hello")

        def test_async(blob_client):
            pass
        """
    )
    result = user.runpytest_subprocess("-p", "no:asyncio", "-p", "blobsdk_servers.testing")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*blob_client is an async fixture and needs pytest-asyncio; blob_sync_client does not*"])


CLUSTERS = """
import os
import pytest
import blobsdk

def _record(cluster):
    with open(os.environ["PIDS_FILE"], "a") as out:
        out.writelines(f"{pid}\\n" for pid in cluster.pids)

def test_default_cluster(blob_cluster, blob_client_toml):
    _record(blob_cluster)
    assert len(blob_cluster.urls("block")) == 3 and blob_cluster.urls("l3") == [] and blob_cluster.urls("tracker") == []
    assert blobsdk.ClientConfig.from_toml(blob_client_toml) == blob_cluster.config
    with blob_cluster.sync_client() as c:
        c.put("/b/x", b"hello")
    with blob_cluster.sync_client() as c:
        assert c.get("/b/x") == b"hello"
    with pytest.raises(RuntimeError, match="^this cluster was started without faults: start it with faults=True$"):
        blob_cluster.set_faults("block", "error_rate=1")

@pytest.mark.parametrize("blob_cluster", [{"block_servers": 1, "l3_nodes": 1, "trackers": 1}], indirect=True)
@pytest.mark.asyncio
async def test_cluster_with_l3_and_a_tracker(blob_cluster):
    _record(blob_cluster)
    assert blob_cluster.config.l3_urls == tuple(blob_cluster.urls("l3")) and len(blob_cluster.urls("l3")) == 1
    assert blob_cluster.config.tracker_urls == tuple(blob_cluster.urls("tracker")) and len(blob_cluster.urls("tracker")) == 1
    async with blob_cluster.client() as c:
        await c.put("/b/x", b"hello")
        assert await c.get("/b/x") == b"hello"

def test_faults_from_the_start(blob_cluster_factory):
    cluster = blob_cluster_factory(block_servers=1, faults={"block": ["route=/v1/blocks;methods=GET;error_rate=100%"]})
    _record(cluster)
    with cluster.sync_client() as c:
        c.put("/b/x", b"hello")
    with cluster.sync_client() as c, pytest.raises(blobsdk.Unavailable):
        c.get("/b/x")
    assert cluster.injected("block")["error"] >= 1

def test_faults_switched_on_and_off(blob_cluster_factory):
    cluster = blob_cluster_factory(block_servers=1, faults=True)
    _record(cluster)
    with cluster.sync_client() as c:
        c.put("/b/x", b"hello")
    cluster.set_faults("block", {"route": "/v1/blocks", "methods": ["GET"], "error_rate": 1.0})
    with cluster.sync_client() as c, pytest.raises(blobsdk.Unavailable):
        c.get("/b/x")
    wrong = r"^no 'blocks' server in this cluster: give a kind \\(api, block, l3, tracker\\) or a server's URL$"
    with pytest.raises(ValueError, match=wrong):
        cluster.set_faults("blocks", "error_rate=1")
    cluster.clear_faults("block")
    with cluster.sync_client() as c:
        assert c.get("/b/x") == b"hello"

def test_a_fault_for_a_kind_that_is_not_one(blob_cluster_factory):
    with pytest.raises(ValueError, match=r"^faults: no server kind 'blocks': kinds are api, block, l3, tracker$"):
        blob_cluster_factory(faults={"blocks": "error_rate=1"})

@pytest.mark.parametrize("blob_cluster", ["l3"], indirect=True)
def test_a_parameter_that_is_not_options(blob_cluster):
    pass
"""


def test_clusters_start_as_asked_show_their_faults_and_leave_no_process(user, monkeypatch):
    pids_file = user.path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids_file))
    user.makepyfile(CLUSTERS)
    result = user.runpytest_subprocess("-p", "blobsdk_servers.testing")
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(["E * TypeError: blob_cluster's parameter is a dict of cluster options, got 'l3'"])
    pids = [int(line) for line in pids_file.read_text().split()]
    assert len(pids) == 4 + 4 + 2 + 2  # api + block servers (+ l3 + tracker) of each cluster
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


FORKS = """
import json, multiprocessing, os, signal

def _linger():
    signal.pause()  # a process the test forked: it outlives pytest, with every file it inherited

def test_forks_a_process_that_lives_on(blob_cluster_factory):
    cluster = blob_cluster_factory(block_servers=2, l3_nodes=1)
    child = multiprocessing.get_context("fork").Process(target=_linger, daemon=True)
    child.start()
    with open(os.environ["PIDS_FILE"] + ".tmp", "w") as out:
        json.dump({"servers": cluster.pids, "child": child.pid}, out)
    os.replace(os.environ["PIDS_FILE"] + ".tmp", os.environ["PIDS_FILE"])
    signal.pause()  # pytest is killed here
"""


def test_every_server_stops_when_pytest_is_killed_whatever_the_test_forked(user, monkeypatch):
    """The plugin is loaded as ``servers.testing``, the tree under test (``blobsdk_servers``
    is wherever blobsdk was installed from)."""
    pids_file = user.path / "pids.json"
    monkeypatch.setenv("PIDS_FILE", str(pids_file))
    test_file = user.makepyfile(FORKS)
    plugin = ["-p", "no:blobsdk_servers.testing", "-p", "servers.testing"]
    argv = [sys.executable, "-m", "pytest", "-q", *plugin, f"--basetemp={user.path / 'basetemp'}", str(test_file)]
    killed = subprocess.Popen(argv, cwd=user.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: dict[str, list[int]] = {"servers": [], "child": []}
    try:
        _wait_for(lambda: pids_file.exists() or killed.poll() is not None, 120, "the test's cluster and its fork")
        assert killed.poll() is None
        found = json.loads(pids_file.read_text())
        pids = {"servers": found["servers"], "child": [found["child"]]}
        assert len(pids["servers"]) == 4 and running(found["child"])
        killed.kill()
        killed.wait()
        _wait_for(lambda: not any(running(pid) for pid in pids["servers"]), 30, "every server to stop")
        assert running(found["child"])  # the fork still holds what it inherited: the servers did not wait for it
    finally:
        killed.kill()
        killed.wait()
        for pid in pids["servers"] + pids["child"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_entry_point_loads_the_plugin_and_nothing_heavy(user, monkeypatch):
    """An installed distribution whose entry points are pyproject.toml's pytest11 table:
    pytest loads the plugin by itself, and loading it imports neither blobsdk nor torch."""
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    dist = user.mkdir("site") / "blobsdk_plugin_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: blobsdk-plugin-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(user.path / "site"), os.environ["PYTHONPATH"])))
    user.makeconftest(
        """
        import sys

        def pytest_configure(config):
            heavy = ("torch", "blobsdk", "blobsdk_servers.cluster", "servers.cluster", "aiohttp")
            heavy = sorted(m for m in heavy if m in sys.modules)
            assert heavy == [], heavy
        """
    )
    user.makepyfile("def test_sync(blob_sync_client):\n    blob_sync_client.put('/b/x', b'hello')\n")
    user.runpytest_subprocess().assert_outcomes(passed=1)
    result = user.runpytest_subprocess("-p", "no:blobsdk_servers.testing")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'blob_sync_client' not found*"])


# docs/testing.md's examples: each file behind a marker ``<!-- KIND: NAME -->``, KIND
# ``plugin-example`` (the fixtures) or ``backend-example`` (a backend of one's own and its suites).
_EXAMPLE = re.compile(r"^<!-- (plugin-example|backend-example): (\S+) -->\n```\w*\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def doc_example(kind: str) -> dict[str, str]:
    """The example project of ``kind``, file name -> text, each taken from the one page that shows it."""
    shown: dict[str, list[tuple[str, str]]] = {}  # file name -> (page, text) of each copy
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for found, name, text in _EXAMPLE.findall(page.read_text()):
            if found == kind:
                shown.setdefault(name, []).append((str(page.relative_to(ROOT)), text))
    assert all(len(copies) == 1 for copies in shown.values()), "each file of the example is shown once"
    return {name: copies[0][1] for name, copies in shown.items()}


def plugin_example() -> dict[str, str]:
    shown = doc_example("plugin-example")
    assert sorted(shown) == ["pytest.ini", "test_blobsdk_fixtures.py"], shown
    return shown


def test_the_docs_first_test_file_passes_as_is_in_a_fresh_project(tmp_path):
    """Copied from the doc into a project of its own (no conftest, no PYTHONPATH), plain
    ``pytest`` loads the plugin from the installed package by its entry point, in
    pytest-asyncio's default (strict) mode, and every test passes with no warning."""
    project = tmp_path / "project"
    project.mkdir()
    for name, text in plugin_example().items():
        (project / name).write_text(text)
    (tmp_path / "tmp").mkdir()
    env = clean_env(tmp_path / "tmp")
    done = subprocess.run(["pytest"], cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    lines = done.stdout.splitlines()
    assert f"rootdir: {project}" in lines and "configfile: pytest.ini" in lines
    assert any(line.startswith("plugins: ") and " blobsdk-" in line for line in lines), out  # the entry point's
    assert any(line.startswith("asyncio: mode=Mode.STRICT") for line in lines), out
    assert re.fullmatch(r"=+ 5 passed in [0-9.]+s( \([0-9:]+\))? =+", lines[-1]), out
    assert "warning" not in out.lower(), out


# What PlanReaderTests and PlanWriterTests hold, in tests (with their parameters): the number
# docs/testing.md says the example runs.
SUITES_TESTS = 71


def test_a_backend_written_outside_blobsdk_runs_the_shipped_suites(user):
    """docs/testing.md's dict store, in a project of its own (outside this repository's tests/),
    subclasses the suites from the package: every test of theirs runs there and passes, and a
    store that breaks one rule fails exactly the test of that rule."""
    example = doc_example("backend-example")
    assert sorted(example) == ["dictplans.py", "test_dictplans.py"], example
    for name, text in example.items():
        (user.path / name).write_text(text)
    passed = user.runpytest_subprocess("-p", "no:blobsdk_servers.testing")
    passed.assert_outcomes(passed=SUITES_TESTS)
    passed.stdout.no_fnmatch_line("*warning*")
    assert f"passes the suites' {SUITES_TESTS} tests" in (ROOT / "docs" / "testing.md").read_text().replace("\n", " ")

    broken = example["dictplans.py"].replace("versions.get(op.path, 0) + 1", "(current.version if current else 0) + 1")
    assert broken != example["dictplans.py"]
    (user.path / "dictplans.py").write_text(broken)  # versions restart after a delete
    failed = user.runpytest_subprocess("-p", "no:blobsdk_servers.testing", "-rf")
    failed.assert_outcomes(passed=SUITES_TESTS - 1, failed=1)
    failed.stdout.fnmatch_lines(["FAILED test_dictplans.py::TestDictPlans::test_version_monotonic_across_delete_and_recreate*"])


# Each suite's tests, with their parameters: MetadataStoreTests, BlockReplicaTests, ChunkCacheTests.
EVERY_SUITE_TESTS = {"TestSqlite": 102, "TestLocal": 32, "TestMemory": 51}

EVERY_SUITE = """
import pytest_asyncio

from blobsdk.cache import MemoryCache
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.sources import LocalBlockStore
from blobsdk.testing.cache import ChunkCacheTests
from blobsdk.testing.metadata import MetadataStoreTests
from blobsdk.testing.sources import BlockReplicaTests


class TestSqlite(MetadataStoreTests):
    @pytest_asyncio.fixture
    async def store(self, tmp_path):
        async with SqliteMetadataStore(tmp_path / "meta.sqlite") as store:
            yield store


class TestLocal(BlockReplicaTests):
    @pytest_asyncio.fixture
    async def store(self, tmp_path):
        async with LocalBlockStore(tmp_path / "blocks") as store:
            yield store


class TestMemory(ChunkCacheTests):
    @pytest_asyncio.fixture
    async def make_cache(self):
        made = []

        async def make(capacity_bytes, **options):
            made.append(MemoryCache(capacity_bytes, **options))
            return made[-1]

        yield make
        for cache in made:
            await cache.aclose()
"""


def test_every_shipped_suite_runs_in_a_users_strict_mode_project(user):
    """Each suite, subclassed outside this repository's tests/ over one of blobsdk's own
    backends, runs whole in pytest-asyncio's strict mode with warnings as errors: every test of
    the suite (and none of a suite class alone) is collected and passes."""
    user.makepyfile(test_backends=EVERY_SUITE)
    result = user.runpytest_subprocess("-p", "no:blobsdk_servers.testing", "-v")
    result.assert_outcomes(passed=sum(EVERY_SUITE_TESTS.values()))
    ran = {cls: sum(f"::{cls}::" in line and " PASSED" in line for line in result.outlines) for cls in EVERY_SUITE_TESTS}
    assert ran == EVERY_SUITE_TESTS
