"""The baseline server: ``python -m benchmarks._trivial_server SIZE PORT_FILE`` serves SIZE
random bytes at GET /blob from memory, as plainly as aiohttp can."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from aiohttp import web

from servers._common.http import send_bytes, serve


def main() -> None:
    size, port_file = int(sys.argv[1]), Path(sys.argv[2])
    body = os.urandom(size)

    async def blob(request: web.Request) -> web.StreamResponse:
        # Streamed in pieces as our servers do: one huge write() is slow on Python 3.11,
        # which would make the baseline look worse than aiohttp can do.
        return await send_bytes(request, body, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/blob", blob)
    serve(app, "127.0.0.1", 0, port_file)


if __name__ == "__main__":
    main()
