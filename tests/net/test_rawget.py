"""blobsdk.net.rawget: the data path's lean HTTP/1.1 GET, against real sockets.

Most tests run a scripted TCP server in the test's loop (127.0.0.1, port 0) that sends
exact bytes, so every way a reply can be wrong is reproduced byte for byte; the happy path
also runs against a real ``servers.blockstore`` app.  No mocks: a Permit comes from a real
AdaptiveLimiter.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Self

import aiohttp
import msgspec
import pytest
from aiohttp import web

from blobsdk.chunks.call import Call
from blobsdk.config import LimiterConfig
from blobsdk.errors import (
    BadRequest,
    BlobError,
    BlobNotFound,
    BlockNotFound,
    CorruptData,
    PreconditionFailed,
    QuotaExceeded,
    ReplyStalled,
    TimedOut,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from blobsdk.net.endpoint import Endpoint
from blobsdk.net.limiter import AdaptiveLimiter
from blobsdk.net.rawget import MAX_ERROR_BODY, MAX_HEAD, RawGetEndpoint
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.wire import ErrorBody, encode
from servers._common.auth import ServerAuth
from servers.blockstore import make_app
from tests.helpers import running_app

# Generous enough never to fire in a passing test, short enough that a hung one fails fast.
TIMEOUT = aiohttp.ClientTimeout(total=3.0, connect=1.0, sock_read=2.0)
ROUTE = "/v1/blocks/b1"


# --- helpers -----------------------------------------------------------------------------


def open_sockets() -> set[str]:
    """This process's open sockets (by inode), where /proc tells."""
    fds = Path("/proc/self/fd")
    found = set()
    for fd in fds.iterdir() if fds.is_dir() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed while listing
        if target.startswith("socket:"):
            found.add(target)
    return found


@pytest.fixture(autouse=True)
async def no_leftovers() -> AsyncIterator[None]:
    """Each test ends with no task of its own still running and no socket of its own open
    (one that is garbage also shows up as a ResourceWarning, an error here, at the collect)."""
    before = open_sockets()
    yield
    await asyncio.sleep(0)
    current = asyncio.current_task()
    assert {t for t in asyncio.all_tasks() if t is not current and not t.done()} == set()
    gc.collect()
    assert open_sockets() - before == set()


@contextmanager
def raises_exactly(cls: type[BaseException], message: str) -> Iterator[pytest.ExceptionInfo[Any]]:
    """pytest.raises for exactly ``cls`` (not a subclass) with exactly ``message``."""
    with pytest.raises(cls, match=f"^{re.escape(message)}$") as info:
        yield info
    assert type(info.value) is cls


def reply(
    status: int = 206,
    body: bytes = b"",
    *,
    reason: str = "Partial Content",
    headers: dict[str, str] | None = None,
    length: int | None = None,
    version: str = "HTTP/1.1",
) -> bytes:
    """A reply's bytes; Content-Length is ``len(body)`` unless ``length`` says otherwise."""
    fields = {"Content-Length": str(len(body) if length is None else length), **(headers or {})}
    head = f"{version} {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + body


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """One request head (through its blank line), or b"" if the client closed first."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise AssertionError(f"the client closed mid-head: {exc.partial!r}") from exc
        return b""
    except ConnectionError:
        return b""


async def wait_eof(reader: asyncio.StreamReader) -> None:
    """Until the client closes the connection (FIN or reset); nothing else may arrive."""
    try:
        data = await reader.read()
    except ConnectionError:
        return
    assert data == b""


Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """A TCP server on 127.0.0.1:0 running ``handler(server, reader, writer, index)`` per
    accepted connection (``index`` counts from 0).  It counts connections, keeps the request
    heads handlers record, and on exit stops every handler and closes every socket."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed_by_client: list[int] = []  # connections whose handler saw the client's EOF
        self.errors: list[Exception] = []  # raised by handlers
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.url = ""
        self.port = 0

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()
        await asyncio.sleep(0)
        if self.errors and exc_info[0] is None:
            raise self.errors[0]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        try:
            await self._handler(self, reader, writer, index)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or __aexit__ stops this handler
        except Exception as exc:  # noqa: BLE001 - a handler's assertion fails the test at __aexit__
            self.errors.append(exc)
        finally:
            writer.close()

    async def answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes) -> None:
        """Read one request (recorded in ``heads``) and send ``answer``."""
        self.heads.append(await read_head(reader))
        writer.write(answer)
        await writer.drain()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes, index: int) -> None:
        """Answer every request on this connection with ``answer`` until the client closes."""
        while head := await read_head(reader):
            self.heads.append(head)
            writer.write(answer)
            await writer.drain()
        self.closed_by_client.append(index)


def answering(first: bytes, then: bytes | None = None) -> Handler:
    """Connection 0 answers every request with ``first``, later ones with ``then``."""

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await server.serve(reader, writer, first if index == 0 or then is None else then, index)

    return handler


@asynccontextmanager
async def endpoint(
    url: str, token: str | None = None, *, timeout: aiohttp.ClientTimeout = TIMEOUT, stall_s: float | None = None
) -> AsyncIterator[RawGetEndpoint]:
    ep = RawGetEndpoint(url, token, timeout=timeout, stall_s=stall_s)
    try:
        yield ep
    finally:
        await ep.aclose()
        await asyncio.sleep(0)  # let the aborted transports finish closing


async def get(
    ep: RawGetEndpoint, size: int = 10, *, expect: int = 206, limiter: AdaptiveLimiter | None = None, **kwargs: Any
) -> tuple[bytes, dict[str, str]]:
    """One GET into a fresh buffer; with ``limiter``, holding one of its permits (which the
    GET tells about overload and timeouts)."""
    out = bytearray(size)
    if limiter is None:
        headers = await ep.get_into(ROUTE, memoryview(out), expect=expect, **kwargs)
    else:
        async with limiter.acquire(size=size) as permit:
            headers = await ep.get_into(ROUTE, memoryview(out), expect=expect, permit=permit, **kwargs)
    return bytes(out), headers


GOOD = reply(206, b"0123456789")


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` for up to a second."""
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


# --- 1. the happy path ------------------------------------------------------------------


async def test_get_lands_in_out_and_reuses_the_connection() -> None:
    answer = reply(206, b"0123456789", headers={"Content-Range": "bytes 0-9/100", "X-Served-From": "Hit"})
    async with Server(answering(answer)) as server, endpoint(server.url + "/prefix/", "s3cret") as ep:
        assert ep.base_url == server.url + "/prefix"
        body, headers = await get(ep, headers={"Range": "bytes=0-9"})
        assert body == b"0123456789"
        assert headers == {"content-length": "10", "content-range": "bytes 0-9/100", "x-served-from": "Hit"}
        assert await get(ep, headers={"Range": "bytes=10-19"}) == (body, headers)
        assert server.connections == 1
        assert server.heads == [
            (
                f"GET /prefix/v1/blocks/b1 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                f"Accept: application/msgpack\r\nAuthorization: Bearer s3cret\r\nRange: bytes={r}\r\n\r\n"
            ).encode()
            for r in ("0-9", "10-19")
        ]


async def test_interim_replies_are_skipped_and_told_to_on_interim_each_as_it_comes() -> None:
    """An L3 node reading through says ``102 Processing`` while it waits (in its own packets,
    or with the reply): each is told to ``on_interim`` when it arrives, then the reply lands
    in ``out``, and the connection is reused."""
    interim = b"HTTP/1.1 102 Processing\r\n\r\n"
    heard: list[int] = []
    told = asyncio.Event()

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while True:
            await read_head(reader)
            writer.write(interim)
            await writer.drain()
            await told.wait()  # the client was told before the reply came
            writer.write(interim + interim + GOOD)
            await writer.drain()

    def on_interim() -> None:
        heard.append(len(heard))
        told.set()

    async with Server(handler) as server, endpoint(server.url) as ep:
        assert (await get(ep, on_interim=on_interim))[0] == b"0123456789" and heard == [0, 1, 2]
        assert (await get(ep))[0] == b"0123456789" and server.connections == 1  # no callback: skipped all the same


async def test_each_arrival_of_a_replys_bytes_is_told_to_on_bytes_and_to_the_attempt() -> None:
    """A body on a full link arrives in pieces over seconds: each arrival is told (the head
    with the first bytes, then the rest, sent only once the client was told of the first), so
    the hedger times its hang deadline from the last bytes, not from the request.  Through
    an ``Endpoint``, they are the attempt's ``receiving()``: its ``heard`` moves on, and its
    target is heard from (``on_progress``) without being taken off hedging."""
    told = asyncio.Event()
    head = GOOD[: GOOD.index(b"\r\n\r\n") + 4]

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while await read_head(reader):
            told.clear()
            writer.write(head + b"01234")
            await writer.drain()
            await told.wait()  # the client heard the first piece before the rest is sent
            writer.write(b"56789")
            await writer.drain()

    arrivals: list[int] = []

    def on_bytes() -> None:
        arrivals.append(len(arrivals))
        told.set()

    async with Server(handler) as server, endpoint(server.url) as ep:
        assert (await get(ep, on_bytes=on_bytes))[0] == b"0123456789" and len(arrivals) >= 2
    now = [0.0]
    spoke: list[float] = []

    def clock() -> float:
        now[0] += 1.0  # every look at the clock is a second later: past the throttle
        return now[0]

    def on_progress() -> None:
        spoke.append(now[0])
        told.set()

    attempt = Call(clock=clock, on_progress=on_progress)
    async with Server(handler) as server, aiohttp.ClientSession() as session:
        data = Endpoint(session, server.url)
        try:
            out = bytearray(10)
            await data.get_into(ROUTE, memoryview(out), expect=206, call=attempt)
        finally:
            await data.aclose()
    assert bytes(out) == b"0123456789"
    assert len(spoke) >= 2 and attempt.heard == spoke[-1] > attempt.begun
    assert not attempt.upstream  # still hedged when slow: bytes are no word that it waits upstream


async def test_without_token_or_extra_headers_the_request_is_minimal() -> None:
    async with Server(answering(reply(200, b"abc", reason="OK"))) as server, endpoint(server.url) as ep:
        assert await get(ep, 3, expect=200) == (b"abc", {"content-length": "3"})
        head = f"GET {ROUTE} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAccept: application/msgpack\r\n\r\n"
        assert server.heads == [head.encode()]


@pytest.fixture
async def blockstore(tmp_path: Path) -> AsyncIterator[tuple[str, list[object], str, bytes]]:
    """A real block server (token "s3cret") holding one 100 KiB block; yields its URL, the
    peer address of every request it got, the block id and the block's bytes."""
    root = tmp_path / "blocks"
    block, data = new_block_id(), random.Random(1).randbytes(100 << 10)
    async with LocalBlockStore(root) as local:
        await local.write_block(block, [data])
    peers: list[object] = []

    @web.middleware
    async def record_peer(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return await handler(request)

    app = make_app(root, auth=ServerAuth("s3cret"))
    app.middlewares.insert(0, record_peer)
    async with running_app(app) as url:
        yield url, peers, block, data


async def test_ranged_gets_from_a_real_block_server(blockstore: tuple[str, list[object], str, bytes]) -> None:
    url, peers, block, data = blockstore
    async with endpoint(url, "s3cret") as ep:
        out = bytearray(4096)
        headers = await ep.get_into(f"/v1/blocks/{block}", memoryview(out), expect=206, headers={"Range": "bytes=1000-5095"})
        assert out == data[1000:5096]
        assert headers["content-length"] == "4096"
        assert headers["content-range"] == f"bytes 1000-5095/{len(data)}"
        assert headers["content-type"] == "application/octet-stream"
        assert all(name == name.lower() for name in headers)
        whole = bytearray(len(data))
        await ep.get_into(f"/v1/blocks/{block}", memoryview(whole))  # expect=200: no Range
        assert whole == data
        missing = new_block_id()
        with raises_exactly(BlockNotFound, f"block {missing} not found"):
            await ep.get_into(f"/v1/blocks/{missing}", memoryview(bytearray(1)), expect=206, headers={"Range": "bytes=0-0"})
        with raises_exactly(CorruptData, f"range 0-{len(data)} is past the end of block {block} ({len(data)} bytes)"):
            await ep.get_into(
                f"/v1/blocks/{block}", memoryview(bytearray(len(data) + 1)), expect=206, headers={"Range": f"bytes=0-{len(data)}"}
            )
        await ep.get_into(f"/v1/blocks/{block}", memoryview(out), expect=206, headers={"Range": "bytes=0-4095"})
        assert out == data[:4096]
    assert len(peers) == 5 and len(set(peers)) == 1  # one keep-alive connection, error replies included


async def test_a_real_block_server_refuses_a_wrong_token(blockstore: tuple[str, list[object], str, bytes]) -> None:
    url, _, block, _ = blockstore
    async with endpoint(url, "wrong") as ep:
        with raises_exactly(Unauthorized, "missing or wrong bearer token"):
            await ep.get_into(f"/v1/blocks/{block}", memoryview(bytearray(1)), expect=206, headers={"Range": "bytes=0-0"})


# --- 2, 3, 11. a body that is not exactly the bytes asked for ------------------------------


async def test_a_content_length_other_than_outs_size_is_unavailable_and_not_reused() -> None:
    async with Server(answering(reply(206, b"01234"), GOOD)) as server, endpoint(server.url) as ep:
        out = bytearray(b"_" * 10)
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: Content-Length 5, expected 10"):
            await ep.get_into(ROUTE, memoryview(out), expect=206)
        assert out == b"_" * 10
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2
        await until(lambda: server.closed_by_client == [0], "the client to close connection 0")


async def test_up_to_takes_a_shorter_body_into_the_start_of_out_and_refuses_a_longer_one() -> None:
    """``up_to`` (an S3 range that runs past an object's end, a link block's small body):
    any Content-Length up to out's size; its header says how much landed."""
    async with Server(answering(reply(206, b"01234"), reply(206, b"0123456789AB"))) as server, endpoint(server.url) as ep:
        out = bytearray(b"_" * 10)
        headers = await ep.get_into(ROUTE, memoryview(out), expect=206, up_to=True)
        assert (out, headers["content-length"]) == (bytearray(b"01234_____"), "5")
        assert await ep.get_into(ROUTE, memoryview(out), expect=206, up_to=True) == {"content-length": "5"}
        assert server.connections == 1  # a whole reply: the connection was reused
    async with Server(answering(reply(206, b"0123456789AB"))) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: Content-Length 12, expected at most 10"):
            await ep.get_into(ROUTE, memoryview(bytearray(10)), expect=206, up_to=True)


async def test_a_body_cut_short_by_the_server_is_unavailable() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        writer.write(reply(206, b"01234", length=10))
        await writer.drain()  # then hang up, 5 bytes short

    async with Server(handler) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: connection closed by the server after 5 body bytes"):
            await get(ep)


async def test_a_body_cut_short_after_its_head_came_alone_is_unavailable() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        writer.write(reply(206, length=10))
        await writer.drain()
        await asyncio.sleep(0.02)
        for piece in (b"012", b"3456"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)

    async with Server(handler) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: connection closed by the server after 7 body bytes"):
            await get(ep)


async def test_bytes_past_the_content_length_in_the_same_packet_are_unavailable() -> None:
    async with Server(answering(GOOD + b"EXTRA", GOOD)) as server, endpoint(server.url) as ep:
        out = bytearray(10)
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: more bytes than the reply's Content-Length"):
            await ep.get_into(ROUTE, memoryview(out), expect=206)
        assert out == bytes(10)
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2


async def test_bytes_arriving_between_replies_close_the_idle_connection() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if index > 0:
            return await server.serve(reader, writer, GOOD, index)
        await server.answer_one(reader, writer, GOOD)
        await asyncio.sleep(0.02)
        writer.write(b"HTTP/1.1 200 OK\r\n")  # nobody asked
        await writer.drain()
        await wait_eof(reader)
        server.closed_by_client.append(index)

    async with Server(handler) as server, endpoint(server.url) as ep:
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        await until(lambda: server.closed_by_client == [0], "the client to drop the out-of-step connection")
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2


# --- 4. replies that cannot be read -----------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n",
            "HTTP 206 reply is chunked; a data GET needs a Content-Length",
        ),
        (b"HTTP/1.1 206 Partial Content\r\nServer: x\r\n\r\n0123456789", "HTTP 206 reply has no Content-Length"),
        (
            b"HTTP/2 206 Partial Content\r\nContent-Length: 10\r\n\r\n0123456789",
            "malformed status line b'HTTP/2 206 Partial Content'",
        ),
        (b"HTTP/1.1 OK\r\nContent-Length: 10\r\n\r\n0123456789", "malformed status line b'HTTP/1.1 OK'"),
        (b"ICY 206 OK\r\nContent-Length: 10\r\n\r\n0123456789", "malformed status line b'ICY 206 OK'"),
        (
            b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nno colon here\r\n\r\n0123456789",
            "malformed header line b'no colon here'",
        ),
        (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1O\r\n\r\n0123456789", "bad Content-Length '1O'"),
        (b"HTTP/1.1 206 Partial Content\r\nContent-Length: -10\r\n\r\n0123456789", "bad Content-Length '-10'"),
        (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 0x0a\r\n\r\n0123456789", "bad Content-Length '0x0a'"),
        (
            b"HTTP/1.1 2060 Partial Content\r\nContent-Length: 10\r\n\r\n0123456789",
            "malformed status line b'HTTP/1.1 2060 Partial Content'",
        ),
    ],
    ids=["chunked", "no-length", "http2", "no-status", "not-http", "no-colon", "letter-o", "negative", "hex", "4-digits"],
)
async def test_a_malformed_reply_is_unavailable_and_its_connection_closed(answer: bytes, message: str) -> None:
    async with Server(answering(answer, GOOD)) as server, endpoint(server.url) as ep:
        out = bytearray(10)
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: {message}"):
            await ep.get_into(ROUTE, memoryview(out), expect=206)
        assert out == bytes(10)
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2
        await until(lambda: server.closed_by_client == [0], "the client to close connection 0")


async def test_a_content_length_of_non_ascii_digits_is_unavailable() -> None:
    answer = b"HTTP/1.1 206 Partial Content\r\nContent-Length: \xb9\xb2\r\n\r\n"  # latin-1 superscript 1, 2
    async with Server(answering(answer)) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: bad Content-Length '\xb9\xb2'"):
            await get(ep, 12)


async def test_a_whole_head_larger_than_max_head_in_one_piece_is_unavailable() -> None:
    oversized = b"HTTP/1.1 206 Partial Content\r\nX-Pad: " + b"a" * MAX_HEAD + b"\r\nContent-Length: 10\r\n\r\n0123456789"
    async with Server(answering(oversized)) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: reply head over {MAX_HEAD} bytes"):
            await get(ep)


async def test_a_read_only_out_is_refused_before_any_request() -> None:
    async with Server(answering(GOOD)) as server, endpoint(server.url) as ep:
        with raises_exactly(BadRequest, "out must be a writable buffer"):
            await ep.get_into(ROUTE, memoryview(bytes(10)), expect=206)
        assert server.connections == 0


async def test_credentials_in_the_url_never_reach_the_host_header() -> None:
    async with Server(answering(GOOD)) as server:
        url = server.url.replace("http://", "http://user:secret@")
        async with endpoint(url) as ep:
            await get(ep)
        assert b"secret" not in server.heads[0]
        assert f"Host: {server.url.removeprefix('http://')}\r\n".encode() in server.heads[0]


async def test_a_head_larger_than_max_head_is_unavailable() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 206 Partial Content\r\nX-Pad: " + b"a" * MAX_HEAD)  # no end of head, ever
        await writer.drain()
        await wait_eof(reader)
        server.closed_by_client.append(index)

    async with Server(handler) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: reply head over {MAX_HEAD} bytes"):
            await get(ep)
        await until(lambda: server.closed_by_client == [0], "the client to close the connection")


# --- 5, 6, 7. error replies -------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (404, "not_found", BlobNotFound),
        (404, "block_not_found", BlockNotFound),
        (412, "precondition_failed", PreconditionFailed),
        (401, "unauthorized", Unauthorized),
        (400, "bad_request", BadRequest),
        (502, "corrupt_data", CorruptData),
        (503, "unavailable", Unavailable),
        (500, "no_such_code", BlobError),
    ],
)
async def test_an_error_reply_raises_its_error_and_keeps_the_connection(status: int, code: str, cls: type[BlobError]) -> None:
    error = reply(status, encode(ErrorBody(code=code, message=f"{code}: no /a/b")), reason="Whatever")
    async with Server(answering(error)) as server, endpoint(server.url) as ep:
        for _ in range(2):
            with raises_exactly(cls, f"{code}: no /a/b"):
                await get(ep)
        assert server.connections == 1


async def test_after_an_error_reply_the_same_connection_serves_the_next_get() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        error = reply(404, encode(ErrorBody(code="not_found", message="no blob /a")), reason="Not Found")
        for answer in (error, GOOD):
            await server.answer_one(reader, writer, answer)
        await wait_eof(reader)

    async with Server(handler) as server, endpoint(server.url) as ep:
        with raises_exactly(BlobNotFound, "no blob /a"):
            await get(ep)
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 1 and len(server.heads) == 2


async def test_an_error_reply_in_json_or_no_error_body_at_all() -> None:
    json_error = reply(412, msgspec.json.encode(ErrorBody(code="precondition_failed", message="version 3")), reason="X")
    async with Server(answering(json_error)) as server, endpoint(server.url) as ep:
        with raises_exactly(PreconditionFailed, "version 3"):
            await get(ep)
    async with Server(answering(reply(500, b"oops", reason="Internal Server Error"))) as server, endpoint(server.url) as ep:
        with raises_exactly(BlobError, f"{server.url}{ROUTE}: HTTP 500: b'oops'"):
            await get(ep)
    async with Server(answering(reply(502, reason="Bad Gateway"))) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"{server.url}{ROUTE}: HTTP 502"):
            await get(ep)


async def test_an_error_body_over_max_error_body_is_unavailable_and_not_reused() -> None:
    big = reply(500, length=MAX_ERROR_BODY + 1, reason="X") + b"x" * 100
    async with Server(answering(big, GOOD)) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: HTTP 500 with a {MAX_ERROR_BODY + 1}-byte body"):
            await get(ep)
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2


def limiter() -> AdaptiveLimiter:
    return AdaptiveLimiter("test", LimiterConfig(initial=16, backoff=0.5))


async def test_a_503_without_body_is_unavailable_and_backs_the_limiter_off() -> None:
    lim = limiter()
    async with Server(answering(reply(503, reason="Service Unavailable"))) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"{server.url}{ROUTE}: HTTP 503"):
            await get(ep, limiter=lim)
    assert lim.limit == 8 < lim.config.initial
    assert lim.stats()["drops"] == 1 and lim.in_flight == 0


async def test_a_429_without_body_backs_the_limiter_off() -> None:
    lim = limiter()
    async with Server(answering(reply(429, reason="Too Many Requests"))) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"{server.url}{ROUTE}: HTTP 429"):
            await get(ep, limiter=lim)
    assert lim.limit == 8 and lim.stats()["drops"] == 1


async def test_a_429_quota_exceeded_does_not_back_the_limiter_off() -> None:
    lim = limiter()
    quota = reply(429, encode(ErrorBody(code="quota_exceeded", message="tenant t is over 1 GiB")), reason="Too Many Requests")
    async with Server(answering(quota)) as server, endpoint(server.url) as ep:
        with raises_exactly(QuotaExceeded, "tenant t is over 1 GiB"):
            await get(ep, limiter=lim)
    assert lim.limit == 16
    assert lim.stats()["drops"] == 0 and lim.stats()["ignored"] == 1


async def test_a_404_does_not_back_the_limiter_off() -> None:
    lim = limiter()
    missing = reply(404, encode(ErrorBody(code="not_found", message="gone")), reason="Not Found")
    async with Server(answering(missing)) as server, endpoint(server.url) as ep:
        with raises_exactly(BlobNotFound, "gone"):
            await get(ep, limiter=lim)
    assert lim.limit == 16 and lim.stats()["drops"] == 0


async def test_a_success_other_than_the_expected_status_is_unavailable() -> None:
    async with Server(answering(reply(200, b"0123456789", reason="OK"))) as server, endpoint(server.url) as ep:
        for _ in range(2):
            out = bytearray(10)
            with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: unexpected HTTP 200"):
                await ep.get_into(ROUTE, memoryview(out), expect=206)
            assert out == bytes(10)  # the 200's body went elsewhere
        assert server.connections == 1  # the whole reply was read: the connection stays usable


# --- 8. timeouts ------------------------------------------------------------------------


async def silent(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
    server.heads.append(await read_head(reader))
    await wait_eof(reader)
    server.closed_by_client.append(index)


async def test_a_server_that_never_answers_times_out_after_sock_read() -> None:
    timeout = aiohttp.ClientTimeout(total=30.0, connect=1.0, sock_read=0.2)
    async with Server(silent) as server, endpoint(server.url, timeout=timeout) as ep:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with raises_exactly(TimedOut, f"GET {server.url}{ROUTE}: timed out waiting for the server"):
            await get(ep)
        elapsed = loop.time() - started
        assert 0.19 <= elapsed < 5.0  # sock_read fired (real time): not before it, and long before total
        await until(lambda: server.closed_by_client == [0], "the client to close the timed-out connection")


async def test_a_server_that_drips_bytes_times_out_after_total() -> None:
    async def drip(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        for byte in reply(206, b"0123456789"):  # 45 bytes: 2.25 s at this pace
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    timeout = aiohttp.ClientTimeout(total=0.5, connect=1.0, sock_read=0.2)
    async with Server(drip) as server, endpoint(server.url, timeout=timeout) as ep:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with raises_exactly(TimedOut, f"GET {server.url}{ROUTE}: timed out waiting for the server"):
            await get(ep)
        elapsed = loop.time() - started
        # Not sock_read (every 0.05 s a byte came): total, and before the reply's 2.25 s (it raised).
        assert 0.49 <= elapsed < 2.5


async def test_a_slow_but_steady_reply_within_total_succeeds() -> None:
    async def slow(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        for piece in (GOOD[:20], GOOD[20:30], GOOD[30:40], GOOD[40:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.1)

    timeout = aiohttp.ClientTimeout(total=1.0, connect=1.0, sock_read=0.2)
    async with Server(slow) as server, endpoint(server.url, timeout=timeout) as ep:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert loop.time() - started >= 0.29  # longer than sock_read in all, but no gap that long


async def test_a_timeout_backs_the_limiter_off() -> None:
    lim = limiter()
    timeout = aiohttp.ClientTimeout(total=5.0, connect=1.0, sock_read=0.1)
    async with Server(silent) as server, endpoint(server.url, timeout=timeout) as ep:
        with raises_exactly(TimedOut, f"GET {server.url}{ROUTE}: timed out waiting for the server") as info:
            await get(ep, limiter=lim)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert lim.stats()["drops"] == 1 and lim.limit == 8  # as aiohttp's timeouts did before _rawget


async def half_then_silent(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
    """The head and 5 of the body's 10 bytes, then nothing until the client hangs up."""
    server.heads.append(await read_head(reader))
    writer.write(GOOD[:-5])
    await writer.drain()
    await wait_eof(reader)
    server.closed_by_client.append(index)


LONG_READ = aiohttp.ClientTimeout(total=30.0, connect=1.0, sock_read=30.0)


async def test_a_body_that_stalls_mid_transfer_is_reply_stalled_after_stall_s_not_sock_read() -> None:
    lim = limiter()
    async with Server(half_then_silent) as server, endpoint(server.url, timeout=LONG_READ, stall_s=0.2) as ep:
        loop = asyncio.get_running_loop()
        started = loop.time()
        message = f"GET {server.url}{ROUTE}: the reply's body stalled after 5 bytes: none for 0.2s"
        with raises_exactly(ReplyStalled, message) as info:
            await get(ep, limiter=lim)
        elapsed = loop.time() - started
        assert 0.19 <= elapsed < 10.0  # the stall bound fired (real time): not before it, long before sock_read
        await until(lambda: server.closed_by_client == [0], "the client to close the stalled connection")
    assert isinstance(info.value, TimedOut) and isinstance(info.value.__cause__, TimeoutError)
    assert lim.stats()["drops"] == 1  # a stall is a timeout to the limiter


async def test_the_stall_bound_never_cuts_a_slow_start_only_a_silent_body() -> None:
    """Before the reply's head only ``sock_read`` bounds the wait: a server that takes longer
    than the stall bound to begin, then sends its reply at once, is answered."""

    async def late(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        await asyncio.sleep(0.3)  # the fault: a slow first byte
        writer.write(GOOD)
        await writer.drain()
        await wait_eof(reader)

    async with Server(late) as server, endpoint(server.url, stall_s=0.05) as ep:
        assert await get(ep) == (b"0123456789", {"content-length": "10"})


async def test_a_body_that_begins_after_the_stall_bound_and_stalls_is_reply_stalled() -> None:
    """The first look at the stall bound finds no body yet; the body that begins later
    brings the GET's timer forward to its own stall bound, not ``sock_read``."""

    async def late_then_silent(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        await asyncio.sleep(0.3)  # the fault: a slow first byte, then half the body and nothing more
        writer.write(GOOD[:-5])
        await writer.drain()
        await wait_eof(reader)

    async with Server(late_then_silent) as server, endpoint(server.url, timeout=LONG_READ, stall_s=0.1) as ep:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with raises_exactly(ReplyStalled, f"GET {server.url}{ROUTE}: the reply's body stalled after 5 bytes: none for 0.1s"):
            await get(ep)
        assert 0.39 <= loop.time() - started < 10.0  # the head's 0.3 s, then the stall bound; long before sock_read


async def test_a_body_with_short_gaps_within_the_stall_bound_is_answered() -> None:
    async def steady(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await read_head(reader)
        for piece in (GOOD[:-10], GOOD[-10:-6], GOOD[-6:-2], GOOD[-2:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)
        await wait_eof(reader)

    async with Server(steady) as server, endpoint(server.url, timeout=LONG_READ, stall_s=2.0) as ep:
        assert await get(ep) == (b"0123456789", {"content-length": "10"})


async def test_fresh_sends_a_get_on_a_new_connection_though_one_is_idle() -> None:
    async with Server(answering(GOOD)) as server, endpoint(server.url) as ep:
        await get(ep)
        await get(ep, fresh=True)
        await get(ep)
        assert server.connections == 2 and len(server.heads) == 3


# --- 9, 13. when a connection is reused -------------------------------------------------


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def once(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await server.answer_one(reader, writer, GOOD)  # and hang up

    async with Server(once) as server, endpoint(server.url) as ep:
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        await asyncio.sleep(0.05)  # the FIN reaches the idle connection
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2 and len(server.heads) == 2


async def test_a_reused_connection_closed_as_the_get_went_out_is_retried_once() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if index > 0:
            return await server.serve(reader, writer, GOOD, index)
        await server.answer_one(reader, writer, GOOD)
        server.heads.append(await read_head(reader))  # the second GET arrives, and is dropped

    async with Server(handler) as server, endpoint(server.url) as ep:
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2
        assert len(server.heads) == 3 and server.heads[1] == server.heads[2]  # sent twice


async def test_a_reused_connection_that_fails_on_the_retry_too_is_unavailable() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if index == 0:
            await read_head(reader)
            writer.write(GOOD)
            await writer.drain()
        server.heads.append(await read_head(reader))  # then hang up without a reply

    async with Server(handler) as server, endpoint(server.url) as ep:
        await get(ep)
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: connection closed by the server after 0 body bytes"):
            await get(ep)
        assert server.connections == 2  # one retry, not more


async def test_a_reused_connection_closed_mid_reply_is_not_retried() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if index > 0:
            return await server.serve(reader, writer, GOOD, index)
        await read_head(reader)
        writer.write(GOOD)
        await writer.drain()
        await read_head(reader)
        writer.write(b"HTTP/1.1 206 Part")  # part of a reply, then hang up
        await writer.drain()

    async with Server(handler) as server, endpoint(server.url) as ep:
        await get(ep)
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: connection closed by the server after 0 body bytes"):
            await get(ep)
        assert server.connections == 1
        assert await get(ep) == (b"0123456789", {"content-length": "10"})  # the next GET connects anew
        assert server.connections == 2


async def test_a_new_connection_closed_before_any_reply_is_not_retried() -> None:
    async def hang_up(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        server.heads.append(await read_head(reader))

    async with Server(hang_up) as server, endpoint(server.url) as ep:
        with raises_exactly(Unavailable, f"GET {server.url}{ROUTE}: connection closed by the server after 0 body bytes"):
            await get(ep)
        assert server.connections == 1


@pytest.mark.parametrize(
    ("answer", "connections"),
    [
        (reply(206, b"0123456789", headers={"Connection": "close"}), 2),
        (reply(206, b"0123456789", headers={"Connection": "Keep-Alive, Close"}), 2),
        (reply(206, b"0123456789", version="HTTP/1.0"), 2),
        (reply(206, b"0123456789", version="HTTP/1.0", headers={"Connection": "keep-alive"}), 1),
        (reply(206, b"0123456789", headers={"Connection": "keep-alive"}), 1),
    ],
    ids=["close", "close-in-a-list", "http1.0", "http1.0-keep-alive", "http1.1-keep-alive"],
)
async def test_keep_alive_is_what_the_reply_says(answer: bytes, connections: int) -> None:
    async with Server(answering(answer)) as server, endpoint(server.url) as ep:
        for _ in range(2):
            body, headers = await get(ep)
            assert body == b"0123456789" and headers["content-length"] == "10"
        assert server.connections == connections
        if connections == 2:  # the client closed each one after its reply
            await until(lambda: sorted(server.closed_by_client) == [0, 1], "the client to close both connections")


# --- 10. cancellation -------------------------------------------------------------------


async def test_a_get_cancelled_mid_body_closes_its_connection() -> None:
    sent_part = asyncio.Event()

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if index > 0:
            return await server.serve(reader, writer, GOOD, index)
        await read_head(reader)
        writer.write(reply(206, b"x" * 1000, length=1 << 20))
        await writer.drain()
        sent_part.set()
        await wait_eof(reader)
        server.closed_by_client.append(index)

    async with Server(handler) as server, endpoint(server.url) as ep:
        out = bytearray(1 << 20)
        task = asyncio.create_task(ep.get_into(ROUTE, memoryview(out), expect=206))
        await sent_part.wait()
        await until(lambda: out[999] == ord("x"), "the first body bytes to land")
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: server.closed_by_client == [0], "the server to see the connection closed")
        assert await get(ep) == (b"0123456789", {"content-length": "10"})
        assert server.connections == 2


async def test_a_get_cancelled_before_any_reply_closes_its_connection() -> None:
    async with Server(silent) as server, endpoint(server.url) as ep:
        task = asyncio.create_task(get(ep))
        await until(lambda: len(server.heads) == 1, "the request to arrive")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: server.closed_by_client == [0], "the server to see the connection closed")


# --- 12. connecting, bad URLs, a closed endpoint ----------------------------------------


async def test_connection_refused_is_unreachable_naming_the_server_and_the_likely_cause() -> None:
    async with Server(silent) as server:
        url, port = server.url, server.port
    async with endpoint(url) as ep:  # nothing listens there any more
        message = (
            f"cannot reach the server at 127.0.0.1:{port} (GET {ROUTE}): connection refused"
            " (nothing listens there: it is not running, or its URL is wrong)"
        )
        with raises_exactly(Unreachable, message) as info:
            await get(ep)
        assert isinstance(info.value.__cause__, ConnectionRefusedError)
        where = (info.value.role, info.value.address, info.value.reason)
        assert where == ("the server", f"127.0.0.1:{port}", "connection refused")


@pytest.mark.parametrize("url", ["ftp://x", "http://", "127.0.0.1:8080", "https:///path", ""])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with raises_exactly(ValueError, f"need an http:// or https:// URL, got {url!r}"):
        RawGetEndpoint(url, timeout=TIMEOUT)


async def test_aclose_closes_idle_connections_and_refuses_further_gets() -> None:
    async with Server(answering(GOOD)) as server:
        ep = RawGetEndpoint(server.url + "/", timeout=TIMEOUT)
        await get(ep)
        await ep.aclose()
        await until(lambda: server.closed_by_client == [0], "the idle connection to close")
        with raises_exactly(Unavailable, f"{server.url}: endpoint closed"):
            await get(ep)
        await ep.aclose()  # twice is fine
        assert server.connections == 1


async def test_a_get_running_during_aclose_closes_its_connection_when_it_ends() -> None:
    release = asyncio.Event()

    async def late(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        server.heads.append(await read_head(reader))
        await release.wait()
        writer.write(GOOD)
        await writer.drain()
        await wait_eof(reader)
        server.closed_by_client.append(index)

    async with Server(late) as server:
        ep = RawGetEndpoint(server.url, timeout=TIMEOUT)
        task = asyncio.create_task(get(ep))
        await until(lambda: len(server.heads) == 1, "the request to arrive")
        await ep.aclose()
        release.set()
        assert await task == (b"0123456789", {"content-length": "10"})
        await until(lambda: server.closed_by_client == [0], "the connection to close after its GET")


# --- 14, 15. how the bytes arrive -------------------------------------------------------


async def test_a_head_in_single_bytes_and_a_large_body_in_pieces() -> None:
    body = random.Random(14).randbytes(1 << 20)
    sizes = random.Random(15)

    async def trickle(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while head := await read_head(reader):
            server.heads.append(head)
            for byte in reply(206, headers={"X-Long": "v" * 300}, length=len(body)):
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0)
            at = 0
            while at < len(body):
                step = sizes.randint(1, 200_000)
                writer.write(body[at : at + step])
                await writer.drain()
                at += step

    async with Server(trickle) as server, endpoint(server.url) as ep:
        for _ in range(2):
            out = bytearray(len(body))
            headers = await ep.get_into(ROUTE, memoryview(out), expect=206)
            assert out == body
            assert headers == {"content-length": str(len(body)), "x-long": "v" * 300}
        assert server.connections == 1


async def test_a_head_and_body_in_one_write() -> None:
    body = random.Random(16).randbytes(300 << 10)
    async with Server(answering(reply(206, body))) as server, endpoint(server.url) as ep:
        out = bytearray(len(body))
        await ep.get_into(ROUTE, memoryview(out), expect=206)
        assert out == body


async def test_a_zero_length_body_leaves_out_untouched() -> None:
    answer = reply(206, headers={"X-Empty": "yes"})
    async with Server(answering(answer)) as server, endpoint(server.url) as ep:
        buf = bytearray(b"abc")
        for _ in range(2):
            headers = await ep.get_into(ROUTE, memoryview(buf)[1:1], expect=206)
            assert headers == {"content-length": "0", "x-empty": "yes"}
            assert buf == b"abc"
        assert server.connections == 1


async def test_a_204_without_content_length_is_an_empty_reply() -> None:
    answer = b"HTTP/1.1 204 No Content\r\nX-Empty: yes\r\n\r\n"
    async with Server(answering(answer)) as server, endpoint(server.url) as ep:
        for _ in range(2):
            assert await ep.get_into(ROUTE, memoryview(bytearray()), expect=204) == {"x-empty": "yes"}
        assert server.connections == 1


async def test_concurrent_gets_use_connections_of_their_own() -> None:
    gate = asyncio.Event()

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while head := await read_head(reader):
            server.heads.append(head)
            await gate.wait()
            body = f"conn{index:06d}".encode()
            writer.write(reply(206, body))
            await writer.drain()

    async with Server(handler) as server, endpoint(server.url) as ep:
        tasks = [asyncio.create_task(get(ep)) for _ in range(3)]
        await until(lambda: len(server.heads) == 3, "three requests")
        gate.set()
        results = await asyncio.gather(*tasks)
        assert sorted(body for body, _ in results) == [b"conn000000", b"conn000001", b"conn000002"]
        for _ in range(3):  # all three went idle; the later GETs reuse them
            await get(ep)
        assert server.connections == 3
