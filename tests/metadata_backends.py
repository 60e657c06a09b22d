"""Every metadata backend, as a fixture: ``metadata`` is an open, empty store of SQLite, the API
server over SQLite, Redis and a three-master Redis Cluster in turn.  A test module imports the
three ``*_fixture`` functions (the Redis servers are module-scoped: each test takes a namespace
of its own on the module's), named apart from their fixtures so a test's argument shadows none.

``CAPABILITIES`` says what each backend has (the protocols of blobsdk/metadata/base.py), as
the conformance suites split (blobsdk/testing/metadata.py); :func:`backends_with` names the
backends that have some.  ``metadata`` is the backends with every one: a whole MetadataStore,
what ``Client.from_stores`` takes.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from blobsdk.metadata import HttpMetadataStore, RedisMetadataStore, SqliteMetadataStore
from blobsdk.metadata.base import BlockFences, BlockIndex, MetadataStore, PlanLister, PlanReader, PlanWriter
from servers import api
from servers.redisd import RedisCluster, RedisServer, start_redis, start_redis_cluster
from tests.helpers import running_app

EVERY_CAPABILITY = (PlanReader, PlanWriter, PlanLister, BlockFences, BlockIndex)
CAPABILITIES: dict[str, tuple[type, ...]] = dict.fromkeys(("sqlite", "api", "redis", "redis-cluster"), EVERY_CAPABILITY)


def backends_with(*capabilities: type) -> list[str]:
    """The backends that have every one of ``capabilities``."""
    return [name for name, has in CAPABILITIES.items() if set(capabilities) <= set(has)]


BACKENDS = backends_with(*EVERY_CAPABILITY)


@pytest.fixture(scope="module", name="redis_server")
def redis_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module", name="redis_cluster")
def redis_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"), masters=3) as cluster:
        yield cluster


@pytest.fixture(params=BACKENDS, name="metadata")
async def metadata_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    """An open, empty metadata store of each backend."""
    async with AsyncExitStack() as stack:
        store: Any
        if request.param == "sqlite":
            store = SqliteMetadataStore(tmp_path / "meta.sqlite")
        elif request.param == "api":
            url = await stack.enter_async_context(running_app(api.make_app(SqliteMetadataStore(tmp_path / "meta.sqlite"))))
            store = HttpMetadataStore(await stack.enter_async_context(aiohttp.ClientSession()), url)
        else:
            server = request.getfixturevalue("redis_server" if request.param == "redis" else "redis_cluster")
            store = RedisMetadataStore(server.url, namespace=f"t{secrets.token_hex(6)}")
        await stack.enter_async_context(store)
        if isinstance(store, RedisMetadataStore):
            assert store.cluster is (request.param == "redis-cluster")  # found out once open
        assert all(isinstance(store, has) for has in CAPABILITIES[request.param])
        yield store
