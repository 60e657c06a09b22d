"""blobsdk/metadata/_redis.py through Redis Sentinel (``redis+sentinel://``, blobsdk/_redisurl.py):
the conformance suite against the primary three Sentinels name, and a failover they perform
when the primary is killed: the same store object goes on committing, against the promoted
replica, with every write acknowledged before the kill still there."""

from __future__ import annotations

import secrets
import subprocess
import time

import pytest

from blobsdk.errors import Unavailable
from blobsdk.metadata import RedisMetadataStore
from blobsdk.testing.metadata import MetadataStoreTests
from blobsdk.testing.plans import make_plan, put
from servers.redisd import RedisFailover, RedisServer, start_redis_failover

from ..helpers import until

FAILOVER_BOUND_S = 30.0  # 1 s to call the primary down, an election, a promotion: seconds on a loaded host


@pytest.fixture(scope="module")
def failover(tmp_path_factory):
    with start_redis_failover(tmp_path_factory.mktemp("sentinel")) as ha:
        yield ha


class TestSentinelMetadataStore(MetadataStoreTests):
    @pytest.fixture
    async def store(self, failover):
        async with RedisMetadataStore(failover.url, namespace=f"t{secrets.token_hex(6)}") as store:
            assert store.cluster is False
            yield store


def _cli(server: RedisServer, *command: str) -> str:
    argv = ["redis-cli", "-h", server.address, "-p", str(server.port), *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def _ready_to_fail_over(ha: RedisFailover) -> bool:
    """Every Sentinel knows the replica and the other Sentinels (learnt over a few seconds
    of hellos): only then can a majority agree and promote."""
    for sentinel in ha.sentinels:
        argv = ["redis-cli", "-p", str(sentinel.port), "sentinel", "master", "blobsdk"]
        fields = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.split()
        state = dict(zip(fields[::2], fields[1::2], strict=False))
        if state.get("num-slaves") != "1" or state.get("num-other-sentinels") != str(len(ha.sentinels) - 1):
            return False
    return True


async def test_a_store_follows_the_primary_the_sentinels_promote(tmp_path):
    with start_redis_failover(tmp_path) as ha:
        until(lambda: _ready_to_fail_over(ha), timeout=FAILOVER_BOUND_S)
        async with RedisMetadataStore(ha.url, namespace="ha", timeout=2.0) as store:
            acked = [await put(store, f"/b/k{i}", seed=i) for i in range(20)]
            assert _cli(ha.primary, "wait", "1", "5000").strip() == "1"  # on the replica before the kill
            ha.primary.stop()
            until(lambda: ha.sentinels[0].primary() == (ha.replica.address, ha.replica.port), timeout=FAILOVER_BOUND_S)
            failures = await _commit_until_served(store, "/b/after")
            assert all(isinstance(e, Unavailable) for e in failures), failures
            found = await store.get_plans([plan.path for plan in acked])
            assert [(p.path, p.version, p.etag) for p in found if p] == [(p.path, p.version, p.etag) for p in acked]
            assert "role:master" in _cli(ha.replica, "info", "replication")


async def _commit_until_served(store: RedisMetadataStore, path: str) -> list[BaseException]:
    """Commit ``path`` until a call succeeds (the pooled connections to the dead primary fail
    first); the failures seen on the way."""
    failures: list[BaseException] = []
    deadline = time.monotonic() + FAILOVER_BOUND_S
    while time.monotonic() < deadline:
        try:
            await store.commit(path, make_plan(path), None)
            return failures
        except Unavailable as exc:
            failures.append(exc)
    pytest.fail(f"no commit served within {FAILOVER_BOUND_S} s of the failover: {failures[-3:]}")
