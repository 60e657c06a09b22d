"""servers/blockstore.py as a real process, as in production."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from blobsdk.chunks.call import Call
from blobsdk.errors import BlockNotFound, IncompatibleFormat, PayloadTooLarge, Unauthorized
from blobsdk.sources import HttpBlockStore, LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.wire import ErrorBody, ListBlocksResponse
from servers import blockstore as block_server
from servers._common.metrics import sample_sum, sample_values
from servers.blockstore import PIECE, Spindles
from tests.helpers import ROOT, running_app, server_process

MiB = 1 << 20


def blockstore(tmp: Path, *args: str) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m servers.blockstore --dir tmp/blocks *args``: (base URL, process)."""
    return server_process("servers.blockstore", "--dir", str(tmp / "blocks"), *args, tmp=tmp)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One server without emulation, shared by the module: (base URL, block directory)."""
    tmp = tmp_path_factory.mktemp("plain")
    with blockstore(tmp, "--max-block-mb", "1") as (url, _):
        yield url, tmp / "blocks"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def block(plain: tuple[str, Path], session: aiohttp.ClientSession) -> str:
    """A stored block of 1000 bytes, 0..255 repeating."""
    block_id = new_block_id()
    await HttpBlockStore(session, plain[0]).write_block(block_id, [bytes(range(256)) * 3, bytes(range(232))])
    return block_id


async def error_of(resp: aiohttp.ClientResponse) -> ErrorBody:
    return msgspec.msgpack.decode(await resp.read(), type=ErrorBody)


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_help_exits_zero() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "servers.blockstore", "--help"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, check=False)
    assert done.returncode == 0
    for flag in (b"--dir", b"--latency-ms", b"--bandwidth-mbps", b"--spindles", b"--max-block-mb", b"--token"):
        assert flag in done.stdout


async def test_healthz_and_metrics(plain: tuple[str, Path], session: aiohttp.ClientSession) -> None:
    async with session.get(f"{plain[0]}/healthz") as resp:
        assert resp.status == 200
    async with session.get(f"{plain[0]}/metrics") as resp:
        text = await resp.text()
    assert sample_values(text, "blobsdk_blockstore_queued_requests") == [({}, 0.0)]
    assert sample_values(text, "blobsdk_blockstore_in_service_requests") == [({}, 0.0)]


async def test_metrics_count_the_bytes_moved_either_way(
    plain: tuple[str, Path], session: aiohttp.ClientSession, block: str
) -> None:
    async with session.get(f"{plain[0]}/v1/blocks/{block}", headers={"Range": "bytes=100-399"}) as resp:
        assert len(await resp.read()) == 300
    async with session.get(f"{plain[0]}/metrics") as resp:
        text = await resp.text()
    assert sample_sum(text, "blobsdk_blockstore_bandwidth_bytes_total") == 1300  # the 1000-byte PUT, then 300 out
    assert sample_sum(text, "blobsdk_blockstore_response_bytes_total", route="/v1/blocks/{block_id}") == 300


@pytest.mark.parametrize("bad_id", ["ABC", "0" * 31, "z" * 32, "0" * 33])
async def test_invalid_block_id_is_400(plain: tuple[str, Path], session: aiohttp.ClientSession, bad_id: str) -> None:
    for method in ("GET", "PUT", "DELETE"):
        async with session.request(method, f"{plain[0]}/v1/blocks/{bad_id}", data=b"x") as resp:
            assert resp.status == 400
            assert (await error_of(resp)).code == "bad_request"


async def test_whole_block_and_exact_ranges(plain: tuple[str, Path], session: aiohttp.ClientSession, block: str) -> None:
    data = (bytes(range(256)) * 4)[:1000]
    async with session.get(f"{plain[0]}/v1/blocks/{block}") as resp:
        assert resp.status == 200 and await resp.read() == data
    for header, want in [("bytes=0-0", data[:1]), ("bytes=10-509", data[10:510]), ("bytes=990-", data[990:])]:
        async with session.get(f"{plain[0]}/v1/blocks/{block}", headers={"Range": header}) as resp:
            assert resp.status == 206 and await resp.read() == want
            assert resp.headers["Content-Range"].endswith("/1000")


@pytest.mark.parametrize("header", ["bytes=a-b", "bytes=5-2", "items=0-1", "bytes=-5", "bytes=0-1,3-4", "bytes="])
async def test_malformed_range_is_400(plain: tuple[str, Path], session: aiohttp.ClientSession, block: str, header: str) -> None:
    async with session.get(f"{plain[0]}/v1/blocks/{block}", headers={"Range": header}) as resp:
        assert resp.status == 400
        assert (await error_of(resp)).code == "bad_request"


@pytest.mark.parametrize("header", ["bytes=0-1000", "bytes=1000-1000", "bytes=5000-", "bytes=999-99999", f"bytes={10**19 - 1}-"])
async def test_range_past_the_end_is_416(
    plain: tuple[str, Path], session: aiohttp.ClientSession, block: str, header: str
) -> None:
    async with session.get(f"{plain[0]}/v1/blocks/{block}", headers={"Range": header}) as resp:
        assert resp.status == 416
        assert (await error_of(resp)).code == "corrupt_data"


async def test_spans_of_one_piece_and_of_many_are_answered_alike(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    data = bytes(range(251)) * 10_000  # 2.4 MiB: up to three pieces
    with blockstore(tmp_path) as (url, _):
        block_id, empty_id = new_block_id(), new_block_id()
        await HttpBlockStore(session, url).write_block(block_id, [data])
        await HttpBlockStore(session, url).write_block(empty_id, [])
        spans = [(0, 99), (5, PIECE + 4), (100, 2_200_000), (PIECE, None), (len(data) - 1, None)]
        for first, last in spans:  # one piece answered at once, more streamed: same reply
            header = f"bytes={first}-{'' if last is None else last}"
            last = len(data) - 1 if last is None else last
            async with session.get(f"{url}/v1/blocks/{block_id}", headers={"Range": header}) as resp:
                assert resp.status == 206 and await resp.read() == data[first : last + 1], header
                assert resp.headers["Content-Range"] == f"bytes {first}-{last}/{len(data)}"
                assert resp.headers["Content-Type"] == "application/octet-stream"
                assert resp.content_length == last + 1 - first
        for block, want in [(block_id, data), (empty_id, b"")]:
            async with session.get(f"{url}/v1/blocks/{block}") as resp:
                assert resp.status == 200 and await resp.read() == want
                assert resp.content_length == len(want) and "Content-Range" not in resp.headers
        async with session.get(f"{url}/v1/blocks/{empty_id}", headers={"Range": "bytes=0-"}) as resp:
            assert resp.status == 416


async def test_missing_block_is_404(plain: tuple[str, Path], session: aiohttp.ClientSession) -> None:
    async with session.get(f"{plain[0]}/v1/blocks/{new_block_id()}") as resp:
        assert resp.status == 404
        assert (await error_of(resp)).code == "block_not_found"


async def test_oversized_put_is_413_and_leaves_no_block(plain: tuple[str, Path], session: aiohttp.ClientSession) -> None:
    store = HttpBlockStore(session, plain[0])
    block_id = new_block_id()
    with pytest.raises(PayloadTooLarge, match="too large"):
        await store.write_block(block_id, [os.urandom(2 * MiB)])
    await store.aclose()  # writes use the session; its reads would need closing

    async def unsized_body() -> AsyncIterator[bytes]:  # chunked: the limit holds while streaming
        for _ in range(4):
            yield os.urandom(MiB // 2)

    async with session.put(f"{plain[0]}/v1/blocks/{block_id}", data=unsized_body()) as resp:
        assert resp.status == 413 and "too large" in (await error_of(resp)).message
    async with HttpBlockStore(session, plain[0]) as store:
        with pytest.raises(BlockNotFound):
            await store.read_range(block_id, 0, 1)
    assert not any(block_id in p.name for p in files_under(plain[1]))


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_client_that_hangs_up_mid_body_leaves_nothing(plain: tuple[str, Path], session: aiohttp.ClientSession) -> None:
    block_id = new_block_id()
    host, port = plain[0].removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    head = f"PUT /v1/blocks/{block_id} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {MiB - 1}\r\n\r\n"
    writer.write(head.encode() + b"z" * (MiB // 2))
    await writer.drain()
    await wait_until(lambda: any(block_id in p.name for p in files_under(plain[1])))  # its temp file
    writer.close()
    await writer.wait_closed()
    await wait_until(lambda: not any(block_id in p.name for p in files_under(plain[1])))
    async with HttpBlockStore(session, plain[0]) as store:
        with pytest.raises(BlockNotFound):
            await store.read_range(block_id, 0, 1)


async def test_list_pages_and_limits(plain: tuple[str, Path], session: aiohttp.ClientSession) -> None:
    store = HttpBlockStore(session, plain[0])
    for _ in range(3):
        await store.write_block(new_block_id(), [b"x"])
    everything = [info.block_id async for info in store.list_blocks()]
    async with session.get(f"{plain[0]}/v1/blocks", params={"limit": "2"}) as resp:
        page = msgspec.msgpack.decode(await resp.read(), type=ListBlocksResponse)
    assert [b.block_id for b in page.blocks] == everything[:2] and page.next_start_after == everything[1]
    for bad in ({"limit": "0"}, {"limit": "10001"}, {"limit": "many"}, {"start_after": "../etc"}):
        async with session.get(f"{plain[0]}/v1/blocks", params=bad) as resp:
            assert resp.status == 400


async def test_delete_is_204_and_idempotent(plain: tuple[str, Path], session: aiohttp.ClientSession, block: str) -> None:
    for _ in range(2):
        async with session.delete(f"{plain[0]}/v1/blocks/{block}") as resp:
            assert resp.status == 204
    async with HttpBlockStore(session, plain[0]) as store:
        with pytest.raises(BlockNotFound):
            await store.read_range(block, 0, 1)


async def test_token_is_required(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with blockstore(tmp_path, "--token", "s3cret") as (url, _):
        with pytest.raises(Unauthorized):
            await HttpBlockStore(session, url).write_block(new_block_id(), [b"x"])
        async with HttpBlockStore(session, url, token="wrong") as store:
            with pytest.raises(Unauthorized):
                await store.read_range(new_block_id(), 0, 1)
        async with HttpBlockStore(session, url, token="s3cret") as store:
            block_id = new_block_id()
            await store.write_block(block_id, [b"secret"])
            assert await store.read_range(block_id, 0, 6) == b"secret"
        async with session.get(f"{url}/healthz") as resp:
            assert resp.status == 200


async def timed_read(store: HttpBlockStore, block_id: str, length: int) -> float:
    start = time.perf_counter()
    await store.read_range(block_id, 0, length)
    return time.perf_counter() - start


async def test_latency_is_paid_per_request(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with blockstore(tmp_path, "--latency-ms", "50") as (url, _):
        async with HttpBlockStore(session, url) as store:
            block_id = new_block_id()
            await store.write_block(block_id, [b"x" * 100])
            assert await timed_read(store, block_id, 100) >= 0.05


async def test_one_spindle_serves_one_request_at_a_time(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with blockstore(tmp_path, "--latency-ms", "100", "--spindles", "1") as (url, _):
        async with HttpBlockStore(session, url) as store:
            block_id = new_block_id()
            await store.write_block(block_id, [b"x" * 100])
            start = time.perf_counter()
            await asyncio.gather(store.read_range(block_id, 0, 100), store.read_range(block_id, 0, 100))
            assert time.perf_counter() - start >= 0.2


async def test_a_request_cancelled_while_seeking_frees_its_spindle() -> None:
    spindles = Spindles(1, latency_s=0.2)

    async def serve() -> None:
        async with spindles:
            pass

    seeking = asyncio.create_task(serve())
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(serve())
    await asyncio.sleep(0.01)
    assert (spindles.in_service, spindles.queued) == (1, 1)
    for task in (seeking, waiting):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (spindles.in_service, spindles.queued) == (0, 0)
    await asyncio.wait_for(serve(), 1.0)  # the spindle is free again


async def test_a_get_whose_client_left_gives_its_place_in_the_queue_up(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with blockstore(tmp_path, "--latency-ms", "300", "--spindles", "1") as (url, _):
        async with HttpBlockStore(session, url) as store:
            block_id = new_block_id()
            await store.write_block(block_id, [b"x" * 100])
            start = time.perf_counter()
            reads = [asyncio.create_task(store.read_range(block_id, 0, 100)) for _ in range(3)]
            await until_metric(session, url, 2, "blobsdk_blockstore_queued_requests")
            for read in reads[1:]:  # two clients give up while queued behind the first
                read.cancel()
            await until_metric(session, url, 0, "blobsdk_blockstore_queued_requests")
            assert await reads[0] == b"x" * 100
            assert await store.read_range(block_id, 0, 100) == b"x" * 100
            # Two seeks (0.6 s), not four: the next read waited for no abandoned one.
            assert time.perf_counter() - start < 0.9
            await until_metric(session, url, 2, "blobsdk_blockstore_requests_total", route=BLOCK_ROUTE, status="499")  # given up


BLOCK_ROUTE = "/v1/blocks/{block_id}"


async def until_metric(
    session: aiohttp.ClientSession, url: str, value: float, name: str, timeout: float = 5.0, **labels: str
) -> None:
    """Wait until /metrics's samples ``name`` with ``labels`` sum to ``value``."""
    deadline = time.monotonic() + timeout
    while True:
        async with session.get(f"{url}/metrics") as resp:
            if sample_sum(text := await resp.text(), name, **labels) == value:
                return
        assert time.monotonic() < deadline, f"{name}{labels} != {value} in {text}"
        await asyncio.sleep(0.02)


async def test_bandwidth_is_capped(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with blockstore(tmp_path, "--bandwidth-mbps", "10") as (url, _):
        async with HttpBlockStore(session, url) as store:
            block_id = new_block_id()
            await store.write_block(block_id, [os.urandom(2 * MiB)])  # ~0.2 s in, too
            assert await timed_read(store, block_id, 2 * MiB) >= 2 * MiB / 10e6 * 0.9


async def test_a_store_of_another_format_stops_the_server_at_startup(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text("blobsdk block-store format 2\n")
    with pytest.raises(IncompatibleFormat, match=f"block store {tmp_path} is in format 2"):
        async with running_app(block_server.make_app(tmp_path)):
            pass


def one_spindle_app(root: Path) -> tuple[aiohttp.web.Application, Spindles]:
    """The block server over ``root`` with one spindle (no seek) that the test can hold."""
    spindles = Spindles(1, latency_s=0.0)
    server = block_server.BlockServer(
        LocalBlockStore(root), spindles=spindles, bandwidth=block_server.Bandwidth(0), max_block_bytes=MiB
    )
    app = block_server.base_app("blobsdk_blockstore", None)
    block_server._install(app, server)
    return app, spindles


async def test_a_read_queued_for_a_spindle_hears_102_processing_and_is_neither_hung_nor_hedged(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """A spindle is held for a whole send, so on a full link a read waits seconds behind
    other clients' sends with no byte of its own: the client alone cannot tell that from a
    hung server.  While it queues the server says so (``102 Processing``, asked for by every
    read of ``HttpBlockStore``): the attempt is told (``progress``), so its hedger neither
    fails it over as hung nor hedges it into another queue; then its bytes land."""
    data = os.urandom(1000)
    block_id = new_block_id()
    async with LocalBlockStore(tmp_path) as local:
        await local.write_block(block_id, [data])
    app, spindles = one_spindle_app(tmp_path)
    async with running_app(app) as url, HttpBlockStore(session, url) as store:
        await spindles.__aenter__()  # another client's read holds the one spindle
        told = asyncio.Event()
        attempt = Call(on_progress=told.set)
        out = bytearray(len(data))
        read = asyncio.ensure_future(store.read_into(block_id, 0, memoryview(out), call=attempt))
        try:
            async with asyncio.timeout(30):
                await told.wait()
            assert attempt.upstream and not read.done() and spindles.queued == 1
        finally:
            await spindles.__aexit__(None, None, None)
            if not told.is_set():  # failing: end the read rather than leave it behind
                read.cancel()
        await read
    assert bytes(out) == data


async def test_a_read_that_gets_its_spindle_at_once_costs_the_server_no_progress_task(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """Every read of ``HttpBlockStore`` asks for ``102 Processing``, and nearly every one gets
    its spindle before the first is due: the ask then costs the server no task (one made and
    cancelled per read was most of what it cost a server that never queued)."""
    data = os.urandom(1000)
    block_id = new_block_id()
    async with LocalBlockStore(tmp_path) as local:
        await local.write_block(block_id, [data])
    app, _ = one_spindle_app(tmp_path)
    made: list[str] = []
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()

    def recording(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        made.append(coro.cr_code.co_filename if hasattr(coro, "cr_code") else "")
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(recording)
    try:
        async with running_app(app) as url, HttpBlockStore(session, url) as store:
            for _ in range(5):
                out = bytearray(len(data))
                await store.read_into(block_id, 0, memoryview(out))
                assert bytes(out) == data
    finally:
        loop.set_task_factory(factory)
    assert made and not [name for name in made if name.endswith(os.path.join("_common", "http.py"))]


async def test_a_malformed_progress_ask_is_400_before_queueing(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    app, spindles = one_spindle_app(tmp_path)
    async with running_app(app) as url:
        await spindles.__aenter__()  # a read that queued would wait: the refusal comes first
        try:
            headers = {"X-Blobsdk-Progress": "fast", "Range": "bytes=0-0"}
            async with session.get(f"{url}/v1/blocks/{new_block_id()}", headers=headers) as resp:
                assert resp.status == 400
                assert (await error_of(resp)).message == "X-Blobsdk-Progress must be 10 to 60000 ms, got 'fast'"
        finally:
            await spindles.__aexit__(None, None, None)
