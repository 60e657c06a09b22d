"""The L3 node's zero-copy hits: a verified cache file sent with ``sendfile``.

A hit whose cache file was verified by an earlier read (blobsdk/cache/_payloadfile.py) is
sent from the page cache to the socket by ``loop.sendfile`` (``os.sendfile``): no read into
user memory, no hash, no disk thread for the payload.  The first read of a file since it was
filled or the node started goes through ``DiskCache.get`` as before (read, xxh3-64, sent from
memory), and is what lets later hits trust it.

Why: py-spy of a node serving hits put 39% of its CPU in the ``preadv`` into a fresh buffer,
7% in the hash, 14% in executor hops; its CPU per GB was 3.0x a trivial HTTP server's
(``l3_server_cpu_vs_http_server`` in ``python -m benchmarks tiers``, docs/benchmarks.md).

A file that rots after its verification is the client's to catch: it verifies every chunk,
reads the chunk elsewhere, and reports the copy (``POST /v1/chunks/{key}/bad?<ChunkRef>``,
the same grant as a GET).  :func:`recheck` then verifies the node's file again by a full
read, which deletes it if it is damaged (counted in the cache's ``corrupt``); a good file
is kept (the damage was on the way), so a report can cost a node one read, never an entry.

The answer is the one a read into memory gets: 200, ``Content-Type:
application/octet-stream``, ``X-Blobsdk-Cache: hit``, the Content-Length.  A response whose
writes the fault injector damages (servers/_common/faults.py) is written through them instead.
A client that hangs up during the send ends it quietly, as it ends a write from memory.  A
file that sends short (shrunk under the send, or a read error mid-way) ends the connection
at once (blobsdk/net/serving.py), so the client fails the read over instead of waiting for
bytes that will not come; the node logs it and verifies the file again at its next read.
``os.sendfile`` runs on the event loop (as in aiohttp's FileResponse): a payload that is not
in the page cache is read from the device inside it, so a node on a slow device stalls its
loop for that read, where a read into memory waited on a disk thread.  Only the open and the
header's check still go to the cache's disk threads.
"""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from blobsdk.cache import DiskCache, PayloadFile
from blobsdk.net import end_connection, sent_past_writer
from blobsdk.wire import CACHE_HEADER, ChunkRef

from ._common.faults import writes_wrapped
from ._common.http import SEND_PIECE

OCTETS = "application/octet-stream"
log = logging.getLogger(__name__)


async def send_verified(cache: DiskCache, request: web.Request, ref: ChunkRef) -> web.StreamResponse | None:
    """The answer to a GET of ``ref`` sent from a verified cache file; None if there is none
    (absent, never verified, replaced, another length): the caller reads it into memory."""
    payload = await cache.open_verified(ref.key)
    if payload is None:
        return None
    with payload:
        if payload.length != ref.length:
            return None
        response, failed = await _answer(request, payload)
    if failed is not None:  # its connection is ended: the client fails this read over at once
        cache.forget_verified(ref.key)
        log.warning("chunk %s: %s; closed the connection", ref.key, failed)
    return response


async def _answer(request: web.Request, payload: PayloadFile) -> tuple[web.StreamResponse, str | None]:
    """The hit's response, sent; and, if its body came out short, why (its connection is
    then ended)."""
    response = web.StreamResponse(headers={CACHE_HEADER: "hit"})
    response.content_type = OCTETS
    response.content_length = payload.length
    await response.prepare(request)
    try:
        sent = await _send(request, response, payload)
    except ConnectionError:  # the client hung up (e.g. a hedge it no longer needs): not an error
        end_connection(request)
        return response, None
    except OSError as exc:
        failed = f"the send failed: {type(exc).__name__}: {exc}"
    else:
        if sent == payload.length:
            await response.write_eof()
            return response, None
        failed = f"sent {sent} of its {payload.length} bytes: the file shrank under the send"
    end_connection(request)
    return response, failed


async def _send(request: web.Request, response: web.StreamResponse, payload: PayloadFile) -> int:
    """Send the payload after ``response``'s head; the number of its bytes sent (fewer if
    the file ends first)."""
    if writes_wrapped(response):
        return await _write_pieces(response, payload)
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client hung up")
    sent = await asyncio.get_running_loop().sendfile(transport, payload.file, payload.offset, payload.length)
    sent_past_writer(request, sent)
    return sent


async def _write_pieces(response: web.StreamResponse, payload: PayloadFile) -> int:
    """Read and write the payload in pieces, through ``response.write`` (fault injection);
    the number of bytes written (fewer if the file ends first)."""
    fd = payload.file.fileno()
    sent = 0
    while sent < payload.length:
        piece = await asyncio.to_thread(os.pread, fd, min(SEND_PIECE, payload.length - sent), payload.offset + sent)
        if not piece:
            break
        await response.write(piece)
        sent += len(piece)
    return sent


async def recheck(cache: DiskCache, key: str) -> bool:
    """Verify ``key``'s file again by a full read (a damaged one is deleted); True if the
    node held it and no longer does."""
    if not cache.contains(key):
        return False
    cache.forget_verified(key)
    await cache.get(key)
    return not cache.contains(key)
