"""The baseline server: ``python -m benchmarks._trivial_server SIZE PORT_FILE`` serves SIZE
random bytes at GET /blob from memory, as plainly as aiohttp can."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from aiohttp import web

from servers._common.http import serve

PIECE = 1 << 20


def main() -> None:
    size, port_file = int(sys.argv[1]), Path(sys.argv[2])
    body = os.urandom(size)

    view = memoryview(body)

    async def blob(request: web.Request) -> web.StreamResponse:
        # Streamed in 1 MiB writes: one huge write() is slow on Python 3.11's selector
        # transport (it memmoves its whole send buffer after every send), which would make
        # the baseline look worse than aiohttp can do.
        response = web.StreamResponse()
        response.content_length = size
        await response.prepare(request)
        for i in range(0, size, PIECE):
            await response.write(view[i : i + PIECE])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/blob", blob)
    serve(app, "127.0.0.1", 0, port_file)


if __name__ == "__main__":
    main()
