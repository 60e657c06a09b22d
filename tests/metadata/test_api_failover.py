"""A client with several API servers (``api_urls``; blobsdk/metadata/_apiservers.py) against
real API server processes over one real redis-server: reads and writes fail over from a
killed server and from a stopped one (bounded by ``[timeouts] api_failover``), a server that
comes back serves again, a write whose answer was lost after it was applied is retried
elsewhere and applied once, and when every server is down the error names each."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

import blobsdk
from blobsdk.config import ClientConfig, Timeouts
from blobsdk.errors import BadRequest, Unavailable, Unreachable
from blobsdk.metadata import HttpMetadataStore
from blobsdk.net import new_session
from blobsdk.testing.plans import make_plan
from blobsdk.wire import CommitOp
from servers.redisd import start_redis

from ..helpers import server_process

pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


class Api:
    """One API server process over the test's Redis, which may be killed, stopped and
    started again on its port."""

    def __init__(self, stack: ExitStack, tmp: Path, redis_url: str, *flags: str) -> None:
        self.stack, self.tmp, self.flags = stack, tmp, ["--metadata", redis_url, *flags]
        self.url, self.proc = stack.enter_context(server_process("servers.api", *self.flags, tmp=tmp))
        self.port = self.url.rsplit(":", 1)[1]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def restart(self) -> None:
        self.url, self.proc = self.stack.enter_context(
            server_process("servers.api", *self.flags, "--port", self.port, tmp=self.tmp)
        )

    @contextmanager
    def stopped(self):
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def two(tmp_path, redis_url):
    with ExitStack() as stack:
        yield Api(stack, tmp_path, redis_url), Api(stack, tmp_path, redis_url)


@pytest.fixture
async def session():
    async with new_session(Timeouts()) as session:
        yield session


def store_of(session, apis, **kwargs) -> HttpMetadataStore:
    return HttpMetadataStore(session, [api.url for api in apis], **kwargs)


def path_of(tmp_path: Path, name: str) -> str:
    return f"/t{abs(hash(tmp_path)) % 10**8}/{name}"  # the Redis is shared by the module's tests


async def test_reads_and_writes_fail_over_from_a_killed_server(two, session, tmp_path):
    a, _ = two
    store = store_of(session, two)
    path = path_of(tmp_path, "k")
    await store.commit(path, make_plan(path))
    a.kill()
    assert (await store.get_plan(path)).version == 1  # a read: to b
    assert store.servers.down() == [a.url]
    assert store.servers.counts["failovers"] == 1
    assert (await store.commit(path, make_plan(path, seed=1), if_version=1)).version == 2  # b, a skipped while down
    assert store.servers.counts["failovers"] == 1
    assert (await store.delete(path, if_version=2)).version == 2
    assert [info.path async for info in store.list(path)] == []


async def test_a_stopped_server_costs_one_api_failover_wait_not_sock_read(two, session, tmp_path):
    """A SIGSTOPped server accepts the connection and never answers: the call is bounded by
    ``api_failover`` (5 s, against a 60 s ``sock_read``), then goes to the next server,
    and the stopped one is skipped until it is down no longer."""
    a, _ = two
    store = store_of(session, two, timeouts=Timeouts(sock_read=60.0, api_failover=5.0))
    path = path_of(tmp_path, "k")
    await store.commit(path, make_plan(path))
    with a.stopped():
        began = time.monotonic()
        assert (await store.get_plan(path)).version == 1
        assert time.monotonic() - began < 60.0  # the failover bound, not sock_read's
        assert store.servers.down() == [a.url]
        assert (await store.commit(path, make_plan(path, seed=1), if_version=1)).version == 2
    assert store.servers.counts["failovers"] == 1


async def test_a_server_that_comes_back_serves_again(two, session, tmp_path):
    a, b = two
    clock = Clock()
    store = store_of(session, two, clock=clock, down_s=5.0)
    path = path_of(tmp_path, "k")
    await store.commit(path, make_plan(path))
    a.kill()
    assert (await store.get_plan(path)).version == 1
    a.restart()
    b.kill()
    assert (await store.get_plan(path)).version == 1  # a is down, tried last, not never: it answers
    assert store.servers.down() == [b.url]
    b.restart()
    clock.now += 5.0  # b's time down is over: first in order again
    assert store.servers.down() == []
    assert (await store.get_plan(path)).version == 1
    assert store.servers.counts["failovers"] == 2


async def test_a_write_applied_whose_answer_was_lost_is_retried_elsewhere_and_applied_once(tmp_path, redis_url, session):
    """Server a applies every commit and delete, then closes the connection without its answer
    (``truncate_rate=100%``: as a server killed between the store's reply and its own).  The
    client sends the same write, with its request id, to b: b answers what a applied.  Without
    the id, the create-only commit would fail with PreconditionFailed against its own write,
    and the delete with BlobNotFound."""
    faults = ["--fault", "route=/v1/commit;truncate_rate=100%", "--fault", "route=/v1/delete;truncate_rate=100%"]
    with ExitStack() as stack:
        a = Api(stack, tmp_path, redis_url, *faults)
        b = Api(stack, tmp_path, redis_url)
        clock = Clock()
        store = store_of(session, [a, b], clock=clock, down_s=5.0)
        path = path_of(tmp_path, "k")
        (created,) = await store.commit_many([CommitOp(path=path, plan=make_plan(path), if_version=0)])
        assert created.version == 1
        assert store.servers.counts["failovers"] == 1
        assert (await store.get_plan(path)).version == 1  # applied once
        clock.now += 5.0  # a is first in order again
        deleted = await store.delete(path, if_version=1)
        assert deleted.version == 1
        assert store.servers.counts["failovers"] == 2
        assert await store.get_plans([path]) == [None]


async def test_every_server_down_is_unreachable_naming_each(two, session):
    a, b = two
    store = store_of(session, two)
    a.kill()
    b.kill()
    hint = "nothing listens there: the cluster is down, or client.toml is from an earlier run"
    with pytest.raises(Unreachable) as caught:
        await store.get_plans(["/b/k"])
    address_a, address_b = a.url.removeprefix("http://"), b.url.removeprefix("http://")
    assert str(caught.value) == (
        f"cannot reach any of the 2 API servers (POST /v1/plans): "
        f"{address_a}: connection refused; {address_b}: connection refused ({hint})"
    )
    assert (caught.value.role, caught.value.address) == ("the API server", f"{address_a}, {address_b}")


async def test_one_server_down_and_one_failing_is_unavailable_naming_each(tmp_path, redis_url, session):
    with ExitStack() as stack:
        a = Api(stack, tmp_path, redis_url)
        b = Api(stack, tmp_path, redis_url, "--fault", "route=/v1/plans;error_rate=100%")
        a.kill()
        store = store_of(session, [a, b])
        with pytest.raises(Unavailable) as caught:
            await store.get_plans(["/b/k"])
        assert not isinstance(caught.value, Unreachable)
        assert str(caught.value).startswith(
            f"none of the 2 API servers answered (POST /v1/plans): {a.url}: cannot reach the API server at "
        )
        assert f"; {b.url}: " in str(caught.value) and "injected fault: POST /v1/plans failed" in str(caught.value)


async def test_api_servers_over_sqlite_refuse_a_retryable_write(tmp_path, session):
    """A store that cannot apply a write once per request id refuses one, rather than let a
    retry apply it twice."""
    with ExitStack() as stack:
        urls = [stack.enter_context(server_process("servers.api", "--db", str(tmp_path / "m.sqlite"), tmp=tmp_path))[0]]
        urls.append(urls[0])  # the same server twice: enough for the client to send request ids
        store = HttpMetadataStore(session, urls)
        with pytest.raises(BadRequest) as caught:
            await store.commit("/b/k", make_plan("/b/k"))
        assert str(caught.value) == (
            "this API server's metadata store cannot recognise a retried write (request_id): "
            "a client with several api_urls needs API servers over Redis (--metadata redis://...)"
        )
        assert await store.get_plans(["/b/k"]) == [None]


async def test_a_client_with_api_urls_puts_and_gets_through_a_failover(two, tmp_path):
    a, b = two
    with server_process("servers.blockstore", "--dir", str(tmp_path / "blocks"), tmp=tmp_path) as (block_url, _):
        config = ClientConfig(api_urls=(a.url, b.url), block_urls=(block_url,))
        async with blobsdk.Client(config) as client:
            path = path_of(tmp_path, "blob")
            await client.put(path, b"x" * 1000)
            a.kill()
            await client.put(path, b"y" * 1000)
            assert await client.get(path) == b"y" * 1000
            assert (await client.stat(path)).version == 2
