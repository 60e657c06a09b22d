"""pytest fixtures for a suite whose code reads through blobsdk: an embedded store, a local
cluster of real servers, and its ``client.toml``.  Installing blobsdk registers this module
as a pytest plugin (the ``pytest11`` entry point ``blobsdk_servers.testing``: servers/ is
installed as the package ``blobsdk_servers``); without the entry point, ``pytest -p
blobsdk_servers.testing`` or ``pytest_plugins = ["blobsdk_servers.testing"]`` loads it, and
``-p no:blobsdk_servers.testing`` keeps it out.

    blob_client           an open async blobsdk.Client on an embedded store in tmp_path
                          (needs pytest-asyncio: an async fixture runs on its event loop)
    blob_sync_client      an open blobsdk.SyncClient on an embedded store in tmp_path
    blob_cluster          a running local cluster (a :class:`BlobCluster`): the API server
                          and 3 block servers; ``indirect`` parametrization passes options,
                          e.g. ``{"l3_nodes": 2, "trackers": 1, "faults": True}``
    blob_cluster_factory  ``start(**options)`` starts one more cluster per call
    blob_client_toml      the path of blob_cluster's client.toml

Options are :class:`servers.cluster.ClusterOptions` fields (``block_servers`` (3),
``l3_nodes`` (0), ``trackers`` (0), ``startup_timeout`` (120 s), ``write_quorum``,
``latency_ms``, ...) and ``faults``: ``False`` (default),
``True`` (every server mounts ``/admin/faults``: :meth:`BlobCluster.set_faults` switches
faults on while the test runs) or a mapping of server kind (``"api"``, ``"block"``,
``"l3"``, ``"tracker"``) to fault specs the servers start with (servers/_common/faults.py),
e.g. ``{"block": ["route=/v1/blocks;methods=GET;error_rate=100%"]}``.

Every server listens on a free loopback port and holds a lifeline to this process: the
fixture's teardown stops them all (and checks that they exited), and they stop themselves
if pytest is killed, whatever the test forked (servers/_common/lifeline.py).  Each test gets
its own directories: nothing is shared between tests.

Loading the plugin imports only pytest (and pytest-asyncio if installed): pytest loads it
in every run, so blobsdk and the servers are imported by the fixtures that use them.  It
lives in ``servers`` because it starts them, and the SDK never imports the servers
(tests/project/test_imports.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

try:  # already imported by pytest when installed (it is a plugin too)
    import pytest_asyncio
except ImportError:
    pytest_asyncio = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from blobsdk import Client, ClientConfig, SyncClient

    from .cluster import Cluster

__all__ = ("BlobCluster", "ClusterFactory")

KINDS = ("api", "block", "l3", "tracker")  # servers.cluster.KINDS' names
# A shared CI box may take a while to start a dozen Python processes: more time than servers.cluster's 30 s.
DEFAULTS: dict[str, Any] = {"block_servers": 3, "l3_nodes": 0, "trackers": 0, "startup_timeout": 120.0}
FaultsOption = bool | Mapping[str, str | Sequence[str]]
ClusterFactory = Callable[..., "BlobCluster"]


@dataclass
class BlobCluster:
    """A running local cluster as a test sees it; ``cluster`` is the
    :class:`servers.cluster.Cluster` (its processes, logs and directory)."""

    cluster: Cluster
    admin_token: str | None  # set when the cluster was started with faults

    @property
    def config(self) -> ClientConfig:
        assert self.cluster.config is not None, "a BlobCluster is started"
        return self.cluster.config

    @property
    def config_path(self) -> Path:
        """Its ``client.toml`` (``blobsdk.ClientConfig.from_toml``, the CLI's ``--config``)."""
        return self.cluster.config_path

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.cluster.processes]

    def urls(self, kind: str) -> list[str]:
        """The base URLs of the servers of ``kind``: "api", "block", "l3" or "tracker"."""
        return [p.url for p in self.cluster.processes if p.kind == kind]

    def client(self) -> Client:
        """An async client of this cluster, to open with ``async with``."""
        from blobsdk import Client

        return Client(self.config)

    def sync_client(self) -> SyncClient:
        """A blocking client of this cluster, to open with ``with``."""
        from blobsdk import SyncClient

        return SyncClient(self.config)

    def set_faults(self, target: str, *rules: str | Mapping[str, Any], seed: int | None = None) -> None:
        """Make the servers of ``target`` (a kind or one server's URL) inject ``rules`` (fault
        specs or FaultRule fields as a dict) in requests that arrive from now on."""
        import msgspec

        from ._common.faults import FaultConfig, FaultRule, parse_rule

        parsed = tuple(parse_rule(r) if isinstance(r, str) else FaultRule(**r) for r in rules)
        body = msgspec.json.encode(FaultConfig(rules=parsed, seed=seed))
        for url in self._targets(target):
            self._admin(url, "PUT", body)

    def clear_faults(self, target: str) -> None:
        """Switch the faults of ``target``'s servers off."""
        for url in self._targets(target):
            self._admin(url, "DELETE")

    def injected(self, target: str) -> dict[str, int]:
        """Faults injected so far by ``target``'s servers, per kind ("error", "stall", ...)."""
        totals: dict[str, int] = {}
        for url in self._targets(target):
            for kind, n in json.loads(self._admin(url, "GET"))["injected"].items():
                totals[kind] = totals.get(kind, 0) + n
        return totals

    def _targets(self, target: str) -> list[str]:
        if self.admin_token is None:
            raise RuntimeError("this cluster was started without faults: start it with faults=True")
        urls = [target] if target.startswith("http") else self.urls(target)
        if not urls:
            raise ValueError(f"no {target!r} server in this cluster: give a kind ({', '.join(KINDS)}) or a server's URL")
        return urls

    def _admin(self, url: str, method: str, body: bytes | None = None) -> bytes:
        import urllib.request

        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy for loopback
        headers = {"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"}
        request = urllib.request.Request(f"{url}/admin/faults", data=body, headers=headers, method=method)
        with direct.open(request, timeout=10.0) as response:
            data: bytes = response.read()
            return data


def _cluster_options(faults: FaultsOption, options: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """start_cluster's options for these fixture options, and the admin token of /admin/faults."""
    if faults is False:  # an admin_token among the options still mounts /admin/faults
        return {**DEFAULTS, **options}, options.get("admin_token")
    token = options.pop("admin_token", None) or secrets.token_urlsafe(16)
    specs = {} if faults is True else {kind: (s,) if isinstance(s, str) else tuple(s) for kind, s in faults.items()}
    if unknown := sorted(set(specs) - set(KINDS)):
        raise ValueError(f"faults: no server kind {', '.join(map(repr, unknown))}: kinds are {', '.join(KINDS)}")
    return {**DEFAULTS, **options, "admin_token": token, "faults": specs}, token


def _stop(cluster: Cluster) -> None:
    cluster.stop()
    running = [p.name for p in cluster.processes if p.popen.poll() is None]
    assert not running, f"blobsdk cluster servers still running after stop: {running}"


@pytest.fixture
def blob_cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """``start(faults=False, **options)`` starts a cluster in a fresh directory and returns
    it as a :class:`BlobCluster`; every cluster it started stops at teardown."""
    from .cluster import start_cluster

    started: list[Cluster] = []

    def start(*, faults: FaultsOption = False, **options: Any) -> BlobCluster:
        kwargs, token = _cluster_options(faults, options)
        cluster = start_cluster(tmp_path_factory.mktemp("blob_cluster"), **kwargs)
        started.append(cluster)
        cluster.__enter__()
        return BlobCluster(cluster, token)

    try:
        yield start
    finally:
        for cluster in reversed(started):
            _stop(cluster)


@pytest.fixture
def blob_cluster(request: pytest.FixtureRequest, blob_cluster_factory: ClusterFactory) -> BlobCluster:
    """A running cluster; ``@pytest.mark.parametrize("blob_cluster", [{...}], indirect=True)``
    passes its options (see the module docstring)."""
    options = getattr(request, "param", None) or {}
    if not isinstance(options, Mapping):
        raise TypeError(f"blob_cluster's parameter is a dict of cluster options, got {options!r}")
    return blob_cluster_factory(**options)


@pytest.fixture
def blob_client_toml(blob_cluster: BlobCluster) -> Path:
    """The path of ``blob_cluster``'s client.toml."""
    return blob_cluster.config_path


@pytest.fixture
def blob_sync_client(tmp_path: Path) -> Iterator[SyncClient]:
    """An open SyncClient on an embedded store (SQLite metadata, blocks on disk) in tmp_path."""
    from blobsdk import SyncClient

    with SyncClient.local(tmp_path / "blobsdk") as client:
        yield client


async def _embedded_client(tmp_path: Path) -> AsyncIterator[Client]:
    """An open async Client on an embedded store in tmp_path."""
    from blobsdk import Client

    async with Client.local(tmp_path / "blobsdk") as client:
        yield client


def _needs_pytest_asyncio() -> None:
    raise pytest.UsageError("blob_client is an async fixture and needs pytest-asyncio; blob_sync_client does not")


def pytest_configure(config: pytest.Config) -> None:
    """``blob_client`` is pytest-asyncio's fixture when that plugin runs (installed and not
    ``-p no:asyncio``), else one that says it is needed."""
    if pytest_asyncio is not None and config.pluginmanager.has_plugin("asyncio"):
        fixture = pytest_asyncio.fixture(_embedded_client, name="blob_client")
    else:
        fixture = pytest.fixture(_needs_pytest_asyncio, name="blob_client")
    holder = ModuleType(f"{__name__}.blob_client")  # pytest reads a plugin's fixtures from a module's attributes
    holder.blob_client = fixture  # type: ignore[attr-defined]
    config.pluginmanager.register(holder, holder.__name__)
