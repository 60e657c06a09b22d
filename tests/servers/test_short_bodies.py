"""A response that does not send the body it declared ends its connection at once
(blobsdk/net/serving.py), on every server: a plain HTTP reader (curl, a TLS proxy) sees the
connection close instead of waiting for bytes that will never come.  The L3 node's own case
(a cache file that shrinks under a zero-copy send) is in tests/servers/test_flashsend.py.

Every time bound of the servers here (keep-alive, header, body) is LONG, far beyond GUARD, so
that on code that leaves such a connection open a read to EOF fails the test (after GUARD)
instead of passing when a keep-alive timer closes the connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from blobsdk.auth import TICKET_HEADER, ServeKey
from blobsdk.config import PeerConfig
from blobsdk.errors import CorruptData
from blobsdk.net.serving import ServerLimits, sent_past_writer
from blobsdk.peer.server import PeerServer
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.wire import ChunkRef, chunk_query
from servers import blockstore
from servers._common.http import base_app
from tests.helpers import running_app

LONG = 3600.0  # the servers' own time bounds: never reached by a test
GUARD = 60.0  # a read to EOF that takes longer fails the test (a failure guard, not a wait)
PATIENT = ServerLimits(header_timeout=LONG, body_timeout=LONG, keepalive_timeout=LONG)
MiB = 1 << 20


@contextlib.asynccontextmanager
async def asking(port: int, target: str, headers: str = "", rcvbuf: int | None = None) -> AsyncIterator[asyncio.StreamReader]:
    """A raw HTTP/1.1 keep-alive GET of ``target`` (``rcvbuf``: a small receive buffer, for
    a reader that stops reading); its reader, until the connection is closed on the way out."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\n{headers}\r\n".encode())
        yield reader
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def head_of(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
    status_line, *lines = head.decode().split("\r\n")[:-2]
    return int(status_line.split()[1]), {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Every byte that arrives until the server closes the connection (EOF or reset)."""
    got = bytearray()

    async def drain() -> None:
        with contextlib.suppress(ConnectionResetError):
            while piece := await reader.read(1 << 16):
                got.extend(piece)

    await asyncio.wait_for(drain(), GUARD)
    return bytes(got)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One whole response with a Content-Length: its status and body."""
    status, headers = await head_of(reader)
    return status, await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), GUARD)


# --- the rule, on a bare app ------------------------------------------------------------------


def bodies_app(tmp: Path) -> web.Application:
    """Routes that declare 100 bytes: /short sends 10 and returns, /error sends 10 and raises
    (the error middleware answers it), /whole and /sendfile send all 100 (the latter around
    aiohttp's writer); /plain is an ordinary Response."""
    app = base_app("bodies_test")
    payload = tmp / "payload"
    payload.write_bytes(b"f" * 100)

    async def started(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 100
        await response.prepare(request)
        return response

    async def short(request: web.Request) -> web.StreamResponse:
        response = await started(request)
        await response.write(b"x" * 10)
        if request.match_info["how"] == "error":
            raise CorruptData("the rest of the body is damaged")
        await response.write_eof()
        return response

    async def whole(request: web.Request) -> web.StreamResponse:
        response = await started(request)
        await response.write(b"w" * 100)
        await response.write_eof()
        return response

    async def sendfile(request: web.Request) -> web.StreamResponse:
        response = await started(request)
        assert request.transport is not None
        with payload.open("rb") as file:
            sent_past_writer(request, await asyncio.get_running_loop().sendfile(request.transport, file, 0, 100))
        await response.write_eof()
        return response

    async def plain(request: web.Request) -> web.Response:
        return web.Response(body=b"p" * 100)

    app.router.add_get("/cut/{how}", short)
    app.router.add_get("/whole", whole)
    app.router.add_get("/sendfile", sendfile)
    app.router.add_get("/plain", plain)
    return app


@pytest.fixture
async def bodies(tmp_path: Path) -> AsyncIterator[int]:
    async with running_app(bodies_app(tmp_path), PATIENT) as url:
        yield int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("how", ["short", "error"])
async def test_a_body_that_stops_short_ends_its_connection(bodies: int, how: str) -> None:
    async with asking(bodies, f"/cut/{how}") as reader:
        status, headers = await head_of(reader)
        assert (status, headers["content-length"]) == (200, "100")
        assert await until_closed(reader) == b"x" * 10  # and nothing after: no error reply inside the body


async def test_whole_bodies_keep_their_connection(bodies: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", bodies)
    for target, body in [("/whole", b"w"), ("/sendfile", b"f"), ("/plain", b"p"), ("/whole", b"w")]:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        assert await answer(reader) == (200, body * 100)
    writer.close()
    await writer.wait_closed()


# --- the block server -----------------------------------------------------------------------


async def test_a_block_deleted_mid_get_ends_the_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc (or an admin's DELETE) removes a block while a GET streams it: the server cannot
    send the rest, and must not write its 404 into the body."""
    store = LocalBlockStore(tmp_path / "blocks")
    block_id, data = new_block_id(), os.urandom(3 * MiB)
    await store.write_block(block_id, [data])
    await store.aclose()
    read_range = LocalBlockStore.read_range

    async def deleted_first(self: LocalBlockStore, block_id: str, offset: int, length: int) -> bytes:
        await self.delete_block(block_id)
        return await read_range(self, block_id, offset, length)

    monkeypatch.setattr(LocalBlockStore, "read_range", deleted_first)
    async with (
        running_app(blockstore.make_app(tmp_path / "blocks"), PATIENT) as url,
        asking(int(url.rsplit(":", 1)[1]), f"/v1/blocks/{block_id}") as reader,
    ):
        status, headers = await head_of(reader)
        assert (status, headers["content-length"]) == (200, str(3 * MiB))
        body = await until_closed(reader)  # of the piece read before the head: what left before the close
    assert len(body) <= blockstore.PIECE and body == data[: len(body)]  # no 404 reply inside the body


# --- the peer server ------------------------------------------------------------------------


async def gave_up(server: PeerServer) -> None:
    while not server.counts["aborted"]:
        await asyncio.sleep(0.01)


async def test_a_peer_closes_the_connection_of_a_child_that_stopped_reading() -> None:
    """The child loses its upload after timeout_s: the bytes still queued for it are dropped
    with its connection, not sent on later over a connection left open."""
    ref = ChunkRef(block_id=new_block_id(), offset=0, length=32 * MiB, raw_length=32 * MiB, checksum=0)
    chunk = memoryview(bytes(ref.length))
    serve_key = ServeKey.generate()

    async def lookup(asked: ChunkRef) -> memoryview | None:
        return chunk if asked.key == ref.key else None

    server = PeerServer(PeerConfig(timeout_s=0.2), serve_key, lookup, lambda: "default")
    await server.start()
    try:
        ticket = serve_key.ticket("default", ref.key, int(time.time()) + 600)
        port = int(server.address.rsplit(":", 1)[1])
        target, ticket_header = f"/v1/chunks/{ref.key}?{chunk_query(ref)}", f"{TICKET_HEADER}: {ticket}\r\n"
        async with asking(port, target, ticket_header, rcvbuf=4096) as reader:
            status, headers = await head_of(reader)
            assert (status, headers["content-length"]) == (200, str(ref.length))
            await asyncio.wait_for(gave_up(server), GUARD)  # the child reads nothing until then
            assert len(await until_closed(reader)) < ref.length
        assert server.counts["aborted"] == 1 and server.counts["uploads"] == 0
    finally:
        await server.aclose()
