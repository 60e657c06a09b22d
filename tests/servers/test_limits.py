"""Every server bounds slow and idle clients (blobsdk/net/serving.py), over real loopback
sockets: header, body and keep-alive timeouts, the connection cap, compressed and
oversized bodies, malformed requests."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import logging
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from blobsdk.errors import BadRequest, PayloadTooLarge, TimedOut, Unavailable
from blobsdk.net.failures import error_for
from blobsdk.net.serving import ACCEPT_IN_FLIGHT, FD_RESERVE, ServerLimits, limits_of_args
from blobsdk.wire import ErrorBody
from servers._common.http import add_serve_args, base_app, read_body
from tests.helpers import ROOT, running_app, stop_process

SHORT = 0.3  # the bound under test
LONG = 30.0  # the bounds not under test: far longer than any wait below
WAIT = 5.0  # how long a test waits for what should happen after SHORT


def limits(**short: float) -> ServerLimits:
    bounds = {"header_timeout": LONG, "body_timeout": LONG, "keepalive_timeout": LONG, **short}
    return ServerLimits(**bounds)  # type: ignore[arg-type]


class Handled:
    def __init__(self) -> None:
        self.calls = 0


def app_with_routes(handled: Handled) -> web.Application:
    app = base_app("limits_test", client_max_size=1000)

    async def small(request: web.Request) -> web.Response:
        handled.calls += 1
        await read_body(request, dict, max_bytes=100)
        return web.Response(text="ok")

    async def whole(request: web.Request) -> web.Response:
        handled.calls += 1
        return web.Response(text=str(len(await request.read())))

    async def late(request: web.Request) -> web.Response:  # reads only after 4 body timeouts
        await asyncio.sleep(4 * SHORT)
        total = 0
        while piece := await request.content.readany():
            total += len(piece)
        return web.Response(text=str(total))

    app.router.add_post("/small", small)
    app.router.add_post("/whole", whole)
    app.router.add_post("/late", late)
    return app


@pytest.fixture
def handled() -> Handled:
    return Handled()


async def serve(handled: Handled, bounds: ServerLimits) -> AsyncIterator[tuple[str, int]]:
    async with running_app(app_with_routes(handled), bounds) as url:
        yield url, int(url.rsplit(":", 1)[1])


@pytest.fixture
async def header_bound(handled: Handled) -> AsyncIterator[tuple[str, int]]:
    async for served in serve(handled, limits(header_timeout=SHORT)):
        yield served


@pytest.fixture
async def body_bound(handled: Handled) -> AsyncIterator[tuple[str, int]]:
    async for served in serve(handled, limits(body_timeout=SHORT)):
        yield served


@pytest.fixture
async def idle_bound(handled: Handled) -> AsyncIterator[tuple[str, int]]:
    async for served in serve(handled, limits(keepalive_timeout=SHORT)):
        yield served


@pytest.fixture
async def capped(handled: Handled) -> AsyncIterator[tuple[str, int]]:
    async for served in serve(
        handled, ServerLimits(header_timeout=LONG, body_timeout=LONG, keepalive_timeout=LONG, max_connections=3)
    ):
        yield served


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def response_of(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP/1.1 response with a Content-Length."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    status_line, *lines = head.decode().split("\r\n")[:-2]
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT)
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """True once the server closes the connection (within WAIT)."""
    try:
        return await asyncio.wait_for(reader.read(), WAIT) == b""
    except ConnectionResetError:
        return True


async def get_healthz(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> int:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    return (await response_of(reader))[0]


def error_body(body: bytes) -> ErrorBody:
    return msgspec.msgpack.decode(body, type=ErrorBody)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def post(url: str, data: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Status and body of one POST through aiohttp's client."""
    async with aiohttp.ClientSession() as session, session.post(url, data=data, headers=headers) as resp:
        return resp.status, await resp.read()


# --- header, keep-alive and body timeouts ----------------------------------------------


async def test_a_head_sent_a_byte_at_a_time_is_cut_off_after_the_header_timeout(header_bound: tuple[str, int]) -> None:
    reader, writer = await connect(header_bound[1])

    async def drip() -> None:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 1000:
            writer.write(bytes([byte]))
            await asyncio.sleep(SHORT / 10)

    dripping = asyncio.create_task(drip())
    try:
        assert await closed(reader)
        assert not dripping.done()  # cut off mid-head, long before the head could be complete
    finally:
        dripping.cancel()
        await close(writer)


async def test_a_head_that_arrives_in_time_is_answered(header_bound: tuple[str, int]) -> None:
    reader, writer = await connect(header_bound[1])
    for _ in range(3):  # the timer restarts with each head of a kept-alive connection
        await asyncio.sleep(SHORT * 1.5)
        assert await get_healthz(writer, reader) == 200
    await close(writer)


async def test_an_idle_connection_is_closed_after_the_keepalive_timeout(idle_bound: tuple[str, int]) -> None:
    reader, writer = await connect(idle_bound[1])
    assert await get_healthz(writer, reader) == 200
    assert await closed(reader)
    await close(writer)


async def test_a_stalled_body_is_answered_408_and_the_connection_closed(body_bound: tuple[str, int], handled: Handled) -> None:
    reader, writer = await connect(body_bound[1])
    writer.write(b"POST /small HTTP/1.1\r\nHost: t\r\nContent-Length: 50\r\n\r\n0123456789")
    status, _, body = await response_of(reader)
    assert status == 408 and handled.calls == 1
    err = error_for(status, body, "u")
    assert type(err) is TimedOut and "no request body bytes for" in str(err) and "(got 10)" in str(err)
    assert await closed(reader)
    await close(writer)


async def test_a_body_the_handler_reads_late_is_not_a_stall(body_bound: tuple[str, int], handled: Handled) -> None:
    assert await post(f"{body_bound[0]}/late", io.BytesIO(b"x" * (4 << 20))) == (200, str(4 << 20).encode())


async def test_a_body_that_keeps_coming_is_not_a_stall(body_bound: tuple[str, int]) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"x" * 10
            await asyncio.sleep(SHORT / 3)

    assert await post(f"{body_bound[0]}/whole", trickle()) == (200, b"80")


# --- the connection cap ----------------------------------------------------------------


async def test_connections_past_the_cap_get_503_while_the_open_ones_are_served(
    capped: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "servers.http")
    held = [await connect(capped[1]) for _ in range(3)]
    for _ in range(10):
        reader, writer = await connect(capped[1])
        status, headers, body = await response_of(reader)
        assert status == 503 and headers["connection"] == "close"
        assert type(error_for(status, body, "u")) is Unavailable
        assert await closed(reader)
        await close(writer)
    for reader, writer in held:
        assert await get_healthz(writer, reader) == 200
    cap_lines = [r for r in caplog.records if "at the cap of 3 connections" in r.getMessage()]
    assert len(cap_lines) == 1 and cap_lines[0].exc_info is None  # once per interval, not per refusal
    await close(held[0][1])
    for _ in range(50):  # a freed slot is usable again, once the server has seen the close
        reader, writer = await connect(capped[1])
        if await get_healthz(writer, reader) == 200:
            break
        await close(writer)
        await asyncio.sleep(0.1)
    else:
        pytest.fail("no connection admitted after one closed")
    for _, w in [*held[1:], (reader, writer)]:
        await close(w)


# --- bodies: compressed, oversized -----------------------------------------------------


async def test_a_compressed_body_is_refused_415_unread(header_bound: tuple[str, int], handled: Handled) -> None:
    # Not gzip at all: had anything tried to inflate it, aiohttp would answer 400 "Can not decode".
    status, body = await post(f"{header_bound[0]}/small", b"\x1f\x8bnot really gzip", {"Content-Encoding": "gzip"})
    assert status == 415 and handled.calls == 0
    err = error_for(status, body, "u")
    assert type(err) is BadRequest and "Content-Encoding 'gzip'" in str(err)


async def test_the_protocol_never_inflates_a_body() -> None:
    app = web.Application()  # no error middleware: what the handler gets is what was sent

    async def length(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    app.router.add_post("/length", length)
    bomb = gzip.compress(bytes(1 << 20))
    async with running_app(app) as url:
        assert await post(f"{url}/length", bomb, {"Content-Encoding": "gzip"}) == (200, str(len(bomb)).encode())


async def test_identity_encoding_is_accepted(header_bound: tuple[str, int]) -> None:
    assert await post(f"{header_bound[0]}/whole", b"abc", {"Content-Encoding": "identity"}) == (200, b"3")


@pytest.mark.parametrize(
    ("route", "message"),
    [("/small", "request body of 200 bytes exceeds 100"), ("/whole", "request body too large")],
)
async def test_an_oversized_body_is_413(header_bound: tuple[str, int], route: str, message: str) -> None:
    status, body = await post(f"{header_bound[0]}{route}", b"x" * (200 if route == "/small" else 2000))
    assert status == 413
    err = error_for(status, body, "u")
    assert type(err) is PayloadTooLarge and message in str(err)


async def test_an_oversized_chunked_body_is_413(header_bound: tuple[str, int]) -> None:
    async def unsized() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"x" * 60

    status, body = await post(f"{header_bound[0]}/small", unsized())
    assert status == 413 and "request body exceeds 100 bytes" in str(error_for(status, body, "u"))


# --- malformed requests ----------------------------------------------------------------


async def test_malformed_requests_are_one_log_line_not_a_traceback_each(
    header_bound: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(20):
        reader, writer = await connect(header_bound[1])
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n")
        status, _, _ = await response_of(reader)
        assert status == 400
        await close(writer)
    records = [r for r in caplog.records if r.name.startswith(("servers.http", "aiohttp"))]
    assert len(records) == 1
    assert records[0].exc_info is None and records[0].getMessage().startswith("malformed request (BadHttpMessage")


async def test_a_handler_traceback_is_still_logged_whole(caplog: pytest.LogCaptureFixture) -> None:
    app = base_app("limits_test")

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    app.router.add_get("/broken", broken)
    async with running_app(app) as url, aiohttp.ClientSession() as session, session.get(f"{url}/broken") as resp:
        assert resp.status == 500
    [record] = [r for r in caplog.records if r.name == "servers.http"]
    assert record.exc_info is not None and str(record.exc_info[1]) == "a bug"


# --- settings --------------------------------------------------------------------------


def test_limits_come_from_the_serve_flags() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(
        ["--header-timeout", "1.5", "--body-timeout", "2", "--keepalive-timeout", "3", "--max-connections", "7"]
    )
    assert limits_of_args(args) == ServerLimits(header_timeout=1.5, body_timeout=2.0, keepalive_timeout=3.0, max_connections=7)
    assert limits_of_args(parser.parse_args([])) == ServerLimits()


@pytest.mark.parametrize("flag", ["--header-timeout", "--body-timeout", "--keepalive-timeout", "--max-connections"])
def test_a_non_positive_limit_flag_is_a_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([flag, "0"])
    assert "invalid positive" in capsys.readouterr().err


def test_a_non_positive_limit_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="max_connections must be positive, not 0"):
        ServerLimits(max_connections=0)


# --- a real server flooded past its open-file limit (issue 9, finding 2) --------------

CHILD_NOFILE = 512  # the block server's open-file limit
CAP = CHILD_NOFILE - FD_RESERVE - ACCEPT_IN_FLIGHT  # its connection cap, from that limit
FLOOD = 700  # idle connections, far past both


def _low_nofile() -> None:  # in the child only, between fork and exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (CHILD_NOFILE, CHILD_NOFILE))


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT)


def _healthz(sock: socket.socket) -> int:
    """GET /healthz on a blocking ``sock``; the status (the response read whole, so the
    connection can be reused). Every read is bounded by the socket's timeout."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        if not (piece := sock.recv(4096)):
            raise ConnectionError(f"closed after {data!r}")
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    length = int({k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}["content-length"])
    while len(body) < length:
        if not (piece := sock.recv(4096)):
            raise ConnectionError("closed mid-body")
        body += piece
    return int(status_line.split()[1])


def _refused(flood: list[socket.socket], expected: int) -> int:
    """How many of ``flood`` got the 503 and were closed, waiting (at most WAIT) for ``expected``."""
    buffers: dict[socket.socket, bytes] = {}
    refused = 0
    with selectors.DefaultSelector() as sel:
        for sock in flood:
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + WAIT
        while refused < expected and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sock = _socket_of(key.fileobj)
                if piece := sock.recv(4096):
                    buffers[sock] = buffers.get(sock, b"") + piece
                    continue
                sel.unregister(sock)
                refused += buffers.get(sock, b"").startswith(b"HTTP/1.1 503 ")
    return refused


def _socket_of(obj: Any) -> socket.socket:
    assert isinstance(obj, socket.socket)
    return obj


def test_a_flood_past_the_open_file_limit_is_refused_quietly_and_served_after(tmp_path: Path) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < FLOOD + 2 * CAP + 100:
        pytest.skip(f"this process may open {soft} files; the flood needs {FLOOD + 2 * CAP + 100}")
    port_file, stderr_path = tmp_path / "port", tmp_path / "stderr"
    sockets: list[socket.socket] = []
    with stderr_path.open("wb") as stderr:
        # stderr to a file, not a pipe: a server logging a traceback per accept must not block on it
        args = ["--dir", str(tmp_path / "blocks"), "--port", "0", "--port-file", str(port_file), "--keepalive-timeout", str(LONG)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "servers.blockstore", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=_low_nofile,  # the test process's own limit is left alone
        )
    try:
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert proc.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, "the block server did not start within 15 s"
            time.sleep(0.02)
        port = int(port_file.read_text())
        before = _connect(port)
        sockets.append(before)
        assert _healthz(before) == 200  # admitted before the flood

        flood = [_connect(port) for _ in range(FLOOD)]
        sockets += flood
        assert _refused(flood, FLOOD - (CAP - 1)) == FLOOD - (CAP - 1)  # all but the cap's worth: 503
        assert _healthz(before) == 200  # the open connection is still served, mid-flood

        for sock in flood:
            sock.close()
        for _ in range(50):  # once the server has seen the closes, the whole cap is usable again
            fresh = [_connect(port) for _ in range(CAP - 1)]
            sockets += fresh
            statuses = [_healthz(sock) for sock in fresh]
            for sock in fresh:
                sock.close()
            if statuses == [200] * (CAP - 1):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"after the flood closed, {statuses.count(200)} of {CAP - 1} new connections served")
        assert _healthz(before) == 200
    finally:
        for sock in sockets:
            sock.close()
        stop_process(proc)
    log = stderr_path.read_bytes()
    assert len(log) < 20_000 and log.count(b"Traceback") == 0, log[:2000]
    assert f"at the cap of {CAP} connections".encode() in log
