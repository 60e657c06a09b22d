"""blobsdk/net/failures.py: a server nothing listens for is named by its role, its address
and the likely cause, wherever the client meets it (a control request, a data GET, a
write's quorum, an L3 node's stats, S3), never by an aiohttp class name."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from blobsdk.errors import Unavailable, Unreachable
from blobsdk.metadata import HttpMetadataStore
from blobsdk.net import HttpEndpoint
from blobsdk.net.failures import BLOCK_SERVER, SERVER, unreachable
from blobsdk.net.retry import Backoff
from blobsdk.net.sigv4 import Credentials
from blobsdk.sources import HttpBlockStore, ReplicatedBlockStore
from blobsdk.sources._s3get import S3Getter, S3Target
from blobsdk.sources.base import new_block_id
from blobsdk.tiers import L3Tier

CLUSTER_DOWN = "(nothing listens there: the cluster is down, or client.toml is from an earlier run)"


def dead_port() -> int:
    """A loopback port nothing listens on (free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_the_api_server_down_is_named_with_the_likely_cause(session) -> None:
    port = dead_port()
    store = HttpMetadataStore(session, f"http://127.0.0.1:{port}")
    with pytest.raises(Unreachable) as info:
        await store.list_page("/bucket/")
    assert (
        str(info.value) == f"cannot reach the API server at 127.0.0.1:{port} (POST /v1/list): connection refused {CLUSTER_DOWN}"
    )
    assert (info.value.role, info.value.address, info.value.reason) == (
        "the API server",
        f"127.0.0.1:{port}",
        "connection refused",
    )


async def test_a_block_server_down_is_named_on_writes_and_on_data_reads(session) -> None:
    port, block = dead_port(), new_block_id()
    async with HttpBlockStore(session, f"http://127.0.0.1:{port}") as store:
        with pytest.raises(Unreachable) as wrote:
            await store.write_block(block, [b"x"])
        with pytest.raises(Unreachable) as read:
            await store.read_range(block, 0, 1)
        with pytest.raises(Unreachable) as listed:
            await anext(store.list_blocks())
    where = f"cannot reach a block server at 127.0.0.1:{port}"
    assert str(wrote.value) == f"{where} (PUT /v1/blocks/{block}): connection refused {CLUSTER_DOWN}"
    assert str(read.value) == f"{where} (GET /v1/blocks/{block}): connection refused {CLUSTER_DOWN}"
    assert str(listed.value) == f"{where} (GET /v1/blocks): connection refused {CLUSTER_DOWN}"  # not its query


async def test_a_failed_quorum_groups_the_servers_nothing_listens_at(session) -> None:
    ports = [dead_port() for _ in range(3)]
    stores = [HttpBlockStore(session, f"http://127.0.0.1:{port}") for port in ports]
    async with ReplicatedBlockStore(stores, noun="block servers") as replicated:
        with pytest.raises(Unavailable) as info:
            await replicated.write_block(new_block_id(), [b"x"])
    message = str(info.value)
    head = "a write needs 2 of the 3 block servers and 3 failed: connection refused at "
    assert message.startswith(head) and message.endswith(f" {CLUSTER_DOWN}")
    listed = message.removeprefix(head).removesuffix(f" {CLUSTER_DOWN}").split(", ")  # in the order they failed
    assert sorted(listed) == sorted(f"127.0.0.1:{port}" for port in ports)


async def test_a_failed_quorum_names_each_other_failure_after_the_group(session, tmp_path) -> None:
    from blobsdk.sources import LocalBlockStore

    port = dead_port()
    (tmp_path / "file").write_bytes(b"")
    broken = LocalBlockStore(tmp_path / "file" / "blocks")  # its root cannot be made: a file is in the way
    stores = [HttpBlockStore(session, f"http://127.0.0.1:{port}"), broken]
    async with ReplicatedBlockStore(stores, write_quorum=1) as replicated:  # both fail before it gives up
        with pytest.raises(Unavailable) as info:
            await replicated.write_block(new_block_id(), [b"x"])
    group, other = str(info.value).split("; ", 1)
    assert group == f"a write needs 1 of the 2 replicas and 2 failed: connection refused at 127.0.0.1:{port} {CLUSTER_DOWN}"
    assert other.startswith(f"{broken.name}: ")


async def test_an_l3_node_down_is_named_in_the_node_stats(session) -> None:
    port = dead_port()
    url = f"http://127.0.0.1:{port}"
    async with L3Tier(session, [url]) as tier:
        stats = await tier.node_stats()
    assert stats == {
        url: {
            "error": f"Unreachable: cannot reach an L3 node at 127.0.0.1:{port} (GET /stats): connection refused {CLUSTER_DOWN}"
        }
    }


async def test_the_s3_endpoint_down_is_named_with_its_own_likely_cause() -> None:
    port = dead_port()
    target = S3Target(
        endpoint=f"http://127.0.0.1:{port}", region="us-east-1", credentials=Credentials(access_key_id="a", secret_access_key="b")
    )
    times = iter([0.0, 100.0, 100.0])  # the first try's start, then past the budget: one try
    getter = S3Getter(target, timeout_s=5.0, backoff=Backoff(clock=lambda: next(times)))
    try:
        with pytest.raises(Unreachable) as info:
            await getter.get_into("bkt", "a/b", memoryview(bytearray(1)), start=0)
    finally:
        await getter.aclose()
    assert str(info.value) == (
        f"cannot reach the S3 endpoint at 127.0.0.1:{port} (GET /bkt/a/b): connection refused (nothing listens there:"
        " the object store is down, or the endpoint in the config is wrong); gave up after 1 try in 100.0s"
        " (connection error: 1): another pause would pass the budget of 5s"
    )


def test_an_unknown_host_or_no_route_says_so() -> None:
    """As aiohttp's connector raises them: its ClientConnectorError carries the OSError."""
    key = ConnectionKey("nowhere.invalid", 8080, False, True, None, None, None)
    dns = aiohttp.ClientConnectorDNSError(key, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    error = unreachable(SERVER, "http://nowhere.invalid:8080", "GET /healthz", dns)
    assert (
        str(error)
        == "cannot reach the server at nowhere.invalid:8080 (GET /healthz): unknown host (check the address in the config)"
    )
    no_route = aiohttp.ClientConnectorError(key, OSError(errno.EHOSTUNREACH, "No route to host"))
    error = unreachable(BLOCK_SERVER, "http://10.0.0.9:7101", "PUT /v1/blocks/x", no_route)
    assert (
        str(error)
        == "cannot reach a block server at 10.0.0.9:7101 (PUT /v1/blocks/x): no route to host (check the address in the config)"
    )
    assert unreachable(SERVER, "http://h:1", "GET /", OSError(errno.ECONNRESET, "reset")) is None  # it connected


async def test_a_connection_dropped_once_made_is_worded_as_before(session) -> None:
    async def reset(reader, writer) -> None:
        writer.transport.abort()  # a connection made, then dropped: the server is there

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(Unavailable) as dropped:
            await HttpEndpoint(session, f"http://127.0.0.1:{port}").read("GET", "/healthz")
    assert type(dropped.value) is Unavailable
    assert str(dropped.value).startswith(f"GET http://127.0.0.1:{port}/healthz: ")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose listener never accepts and whose backlog is full: the kernel
    drops every further SYN, as a partitioned host's link does, so connecting times out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    for _ in range(8):  # past the backlog, whatever its rounding: until a connect is refused its SYN-ACK
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


NO_ANSWER = "no answer to connect (the host is down or cut off from this one, or its packets are dropped)"


async def test_a_server_that_never_answers_a_connect_is_named_on_control_requests_and_data_reads(silent_port) -> None:
    """A partitioned server: the connect times out, and the error names who and where, as for a refusal."""
    timeout = aiohttp.ClientTimeout(total=None, connect=0.2, sock_connect=0.2, sock_read=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        store = HttpMetadataStore(session, f"http://127.0.0.1:{silent_port}")
        with pytest.raises(Unreachable) as listed:
            await store.list_page("/bucket/")
        block = new_block_id()
        async with HttpBlockStore(session, f"http://127.0.0.1:{silent_port}") as blocks:
            with pytest.raises(Unreachable) as read:
                await blocks.read_range(block, 0, 1)
    assert str(listed.value) == f"cannot reach the API server at 127.0.0.1:{silent_port} (POST /v1/list): {NO_ANSWER}"
    assert str(read.value) == f"cannot reach a block server at 127.0.0.1:{silent_port} (GET /v1/blocks/{block}): {NO_ANSWER}"
    assert (listed.value.role, listed.value.reason) == ("the API server", "no answer to connect")
