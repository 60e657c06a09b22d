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
A client that hangs up during the send ends it quietly, as it ends a write from memory.
``os.sendfile`` runs on the event loop (as in aiohttp's FileResponse): a payload that is not
in the page cache is read from the device inside it, so a node on a slow device stalls its
loop for that read, where a read into memory waited on a disk thread.  Only the open and the
header's check still go to the cache's disk threads.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from blobsdk.cache.disk import DiskCache, PayloadFile
from blobsdk.wire import CACHE_HEADER, ChunkRef

from ._common.faults import writes_wrapped
from ._common.http import SEND_PIECE

OCTETS = "application/octet-stream"


async def send_verified(cache: DiskCache, request: web.Request, ref: ChunkRef) -> web.StreamResponse | None:
    """The answer to a GET of ``ref`` sent from a verified cache file; None if there is none
    (absent, never verified, replaced, another length): the caller reads it into memory."""
    payload = await cache.open_verified(ref.key)
    if payload is None:
        return None
    with payload:
        if payload.length != ref.length:
            return None
        return await _send(request, payload)


async def _send(request: web.Request, payload: PayloadFile) -> web.StreamResponse:
    response = web.StreamResponse(headers={CACHE_HEADER: "hit"})
    response.content_type = OCTETS
    response.content_length = payload.length
    await response.prepare(request)
    if writes_wrapped(response):
        await _write_pieces(response, payload)
    else:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client hung up")
        try:
            await asyncio.get_running_loop().sendfile(transport, payload.file, payload.offset, payload.length)
        except ConnectionError:  # the client hung up (e.g. a hedge it no longer needs): not an error
            response.force_close()
            transport.abort()
            return response
    await response.write_eof()
    return response


async def _write_pieces(response: web.StreamResponse, payload: PayloadFile) -> None:
    """Read and write the payload in pieces, through ``response.write`` (fault injection)."""
    fd = payload.file.fileno()
    end = payload.offset + payload.length
    for at in range(payload.offset, end, SEND_PIECE):
        await response.write(await asyncio.to_thread(os.pread, fd, min(SEND_PIECE, end - at), at))


async def recheck(cache: DiskCache, key: str) -> bool:
    """Verify ``key``'s file again by a full read (a damaged one is deleted); True if the
    node held it and no longer does."""
    if not cache.contains(key):
        return False
    cache.forget_verified(key)
    await cache.get(key)
    return not cache.contains(key)
