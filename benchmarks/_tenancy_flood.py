"""The flooding tenant of ``python -m benchmarks tenancy``: a process of its own (its CPU is
not the measuring process's), sending the requests of a spec file as fast as a server answers.

``python -m benchmarks._tenancy_flood SPEC``: SPEC is a msgpack :class:`Flood`.  It opens
``connections`` connections, each sending the spec's requests in turn (starting at its own
place in the list), prints ``flooding`` once every connection has had an answer, and runs
until SIGTERM; then it prints the JSON ``{"requests": N, "seconds": S, "statuses": {...}}``
of the time since ``flooding``.  A body is read and dropped as it arrives.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import msgspec


class FloodRequest(msgspec.Struct, frozen=True):
    method: str
    route: str  # appended to the flood's url
    headers: dict[str, str] = {}
    body: bytes = b""


class Flood(msgspec.Struct, frozen=True):
    url: str
    requests: list[FloodRequest]
    connections: int


class _Tally:
    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.started: float | None = None


async def _send(session: aiohttp.ClientSession, url: str, request: FloodRequest, tally: _Tally) -> None:
    data = request.body or None
    async with session.request(request.method, url + request.route, headers=request.headers, data=data) as resp:
        while await resp.content.readany():
            pass
        tally.statuses[resp.status] += 1


async def _connection(session: aiohttp.ClientSession, flood: Flood, first: int, tally: _Tally, ready: asyncio.Event) -> None:
    i = first
    while True:
        request = flood.requests[i % len(flood.requests)]
        try:
            await _send(session, flood.url, request, tally)
        except aiohttp.ClientError:
            tally.statuses[0] += 1
        ready.set()
        i += 1


async def flood(spec: Flood) -> None:
    tally, stop = _Tally(), asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    connector = aiohttp.TCPConnector(limit=spec.connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        readies = [asyncio.Event() for _ in range(spec.connections)]
        tasks = [
            asyncio.create_task(_connection(session, spec, i * len(spec.requests) // spec.connections, tally, readies[i]))
            for i in range(spec.connections)
        ]
        await asyncio.gather(*(r.wait() for r in readies))
        tally.statuses.clear()
        tally.started = time.perf_counter()
        print("flooding", flush=True)
        await stop.wait()
        seconds = time.perf_counter() - tally.started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    done = {"requests": sum(tally.statuses.values()), "seconds": seconds, "statuses": dict(tally.statuses)}
    print(msgspec.json.encode(done).decode(), flush=True)


def main() -> None:
    spec = msgspec.msgpack.decode(Path(sys.argv[1]).read_bytes(), type=Flood)
    asyncio.run(flood(spec))


if __name__ == "__main__":
    main()
