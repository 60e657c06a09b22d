"""An HDD-throttling reverse proxy: puts the block servers' HDD model in front of any HTTP
origin (an S3 gateway: SeaweedFS in the ingest benchmark), so loaders that speak S3 meet the
same disks blobsdk's block servers emulate.

    python -m servers.hddproxy --upstream http://127.0.0.1:PORT [--disks 3] [--spindles 2]
                               [--latency-ms 5] [--bandwidth-mbps 60] [--stripe-mb 4]
                               [--host H] [--port P] [--port-file F] [--log FILE]

Every request (any method) is forwarded as it came (method, raw path and query, headers
including ``Host``, so a SigV4 signature made for the proxy's address still verifies
upstream; the body read whole first), and the answer streamed back as it comes, bodies and
``Content-Encoding`` untouched.  Behind it is a striped store (servers/_common/hdd.py
:class:`StripedDisks`): ``disks`` emulated disks with the block server's model, an
object's bytes cut into ``stripe_bytes`` stripes laid over them in turn from a disk a hash
of the path picks.  A request's bytes (the body it sends, then the answer's, from
its ``Range`` start, else 0) are served stripe by stripe, each stripe by its own disk at
once: a spindle of that disk (FIFO), ``latency_ms`` for its seek, then its bytes through
the disk's ``bandwidth_mbps``; a byte of the answer is sent once its disk has moved it.
So the store's aggregate bandwidth is ``disks x bandwidth_mbps``, which one large request
reaches as well as many small ones, and a request pays a seek per stripe it touches (a
request with no bytes, one).

``GET /-/stats`` (no bucket name starts with ``-``) answers what its disks served so far,
``{"requests": N, "stripes": N, "bytes": N, "repeats": N}`` (stripe transfers the disks
served; bytes either way; repeats: requests for a
method, path and ``Range`` asked before), which the benchmark reads around a row.
``GET /-/timeline?since=T`` answers ``[[begun, ended, bytes], ...]`` for each request begun
at ``T`` or later (monotonic seconds, this host's clock; bytes relayed back): when a loader's
reads reached the disks and when the last of them ended, against its job's own times.
``--log FILE`` appends a JSON line per request, naming the process that sent it (debugging).
It answers ``GET /`` as its upstream does (the S3 bucket listing), which is how
:class:`HddProxy` (a :class:`~servers._common.lifeline.LocalService`: free loopback port,
dies with its starter) sees it is up.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import aiohttp
from aiohttp import web
from yarl import URL

from blobsdk.cli import ArgumentParser

from ._common import prog
from ._common.hdd import Disk, StripedDisks, Transfer
from ._common.http import serve
from ._common.lifeline import LocalService

MiB = 1 << 20
PIECE = 1 << 20  # bytes paced and sent per step of an answer
# Hop-by-hop headers, and those aiohttp sets itself from the body it sends.
_NOT_FORWARDED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length", "proxy-connection"}
)
_RANGE_START = re.compile(r"bytes=(\d+)-")


@dataclass(frozen=True)
class HddModel:
    """The disks behind the proxy: ``disks`` of ``spindles`` each, ``latency_ms`` a seek (one
    per stripe a request touches), ``bandwidth_mbps`` (1e6 B/s) each, objects striped over
    them every ``stripe_bytes``."""

    disks: int = 3
    spindles: int = 2
    latency_ms: float = 5.0
    bandwidth_mbps: float = 60.0
    stripe_bytes: int = 4 * MiB

    def __post_init__(self) -> None:
        if self.disks < 1 or self.spindles < 0 or self.latency_ms < 0 or self.bandwidth_mbps < 0 or self.stripe_bytes < 1:
            raise ValueError("need disks >= 1, spindles, latency_ms and bandwidth_mbps >= 0, stripe_bytes >= 1")

    @property
    def aggregate_Bps(self) -> float:
        """The store's bandwidth, bytes per second: every disk's (0: unlimited)."""
        return self.disks * self.bandwidth_mbps * 1e6

    def describe(self) -> str:
        return (
            f"{self.disks} disks x {self.bandwidth_mbps:g} MB/s = {self.aggregate_Bps / 1e6:g} MB/s, striped every "
            f"{self.stripe_bytes / MiB:g} MiB, {self.spindles} spindles a disk, {self.latency_ms:g} ms a seek (one per "
            "stripe a request touches)"
        )

    def make_disks(self) -> StripedDisks:
        disks = [Disk(self.spindles, self.latency_ms / 1000.0, self.bandwidth_mbps * 1e6) for _ in range(self.disks)]
        return StripedDisks(disks, self.stripe_bytes, PIECE)

    def args(self) -> list[str]:
        return [
            f"--disks={self.disks}",
            f"--spindles={self.spindles}",
            f"--latency-ms={self.latency_ms}",
            f"--bandwidth-mbps={self.bandwidth_mbps}",
            f"--stripe-bytes={self.stripe_bytes}",
        ]


class RequestLog:
    """One JSON line per request served (``--log``, for debugging who reads what): its
    method, path, ``Range``, status, start and end (monotonic s), bytes relayed back, and the
    client: its address and, found through /proc (Linux, same user), the process that owns
    that socket (pid, parent pid, command line), looked up once per connection."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self._owners: dict[str, dict[str, object]] = {}

    def write(self, request: web.Request, status: int, begun: float, sent: int) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if peer else "?"
        owner = self._owners.get(client)
        if owner is None:
            owner = self._owners[client] = _socket_owner(peer[1]) if peer else {}
        entry = {
            "method": request.method,
            "path": request.path,
            "range": request.headers.get("Range"),
            "status": status,
            "begun": begun,
            "ended": time.monotonic(),
            "bytes": sent,
            "client": client,
            **owner,
        }
        self._file.write(json.dumps(entry) + "\n")

    def close(self) -> None:
        self._file.close()


def _socket_owner(port: int) -> dict[str, object]:
    """The process holding the loopback TCP socket whose local port is ``port``, if found."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                return {"pid": int(pid), "ppid": ppid, "cmdline": cmdline[:200]}
    return {}


class Proxy:
    """The forwarding handler over ``upstream`` (``http://host:port``) and the model's disks.
    ``repeats`` counts requests for bytes already asked for (the same method, path and
    ``Range``): a reader that reads each byte once makes none."""

    def __init__(self, upstream: str, model: HddModel, log: Path | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.model = model
        self.store = model.make_disks()
        self.disks = self.store.disks
        self.requests = 0
        self.repeats = 0
        self._seen: set[str] = set()
        self.timeline: list[tuple[float, float, int]] = []  # (begun, ended, bytes back) per request
        self._log = RequestLog(log) if log is not None else None
        self._session: aiohttp.ClientSession | None = None

    def start_of(self, range_header: str | None) -> int:
        """Where an answer's bytes start in its object: its ``Range`` start, else 0."""
        match = _RANGE_START.match(range_header.strip()) if range_header else None
        return int(match[1]) if match else 0

    async def stats(self, request: web.Request) -> web.Response:
        """What the disks served so far: requests, stripe transfers, and bytes either way."""
        return web.json_response(
            {
                "requests": self.requests,
                "stripes": sum(d.stripes for d in self.disks),
                "bytes": sum(d.bandwidth.moved for d in self.disks),
                "repeats": self.repeats,
            }
        )

    async def timeline_since(self, request: web.Request) -> web.Response:
        """``[[begun, ended, bytes], ...]`` of the requests begun at ``since`` or later."""
        try:
            since = float(request.query.get("since", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text=f"since must be a number, got {request.query['since']!r}") from None
        return web.json_response([entry for entry in self.timeline if entry[0] >= since])

    async def start(self, app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
        connector = aiohttp.TCPConnector(limit=0)  # the spindles limit what is in flight
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)

    async def stop(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
        if self._log is not None:
            self._log.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        self.requests += 1
        asked = f"{request.method} {request.path} {request.headers.get('Range')}"
        self.repeats += asked in self._seen
        self._seen.add(asked)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        if body:
            async with self.store.transfer(request.path, 0, len(body)) as written:
                await written.done()
        url = URL(self.upstream + request.raw_path, encoded=True)
        begun, sent, status = time.monotonic(), [0], 0
        try:
            async with self._session.request(
                request.method,
                url,
                headers=headers,
                data=body or None,
                allow_redirects=False,
                skip_auto_headers=("Content-Type",),
            ) as upstream:
                status = upstream.status
                return await self._relay(request, upstream, self.start_of(request.headers.get("Range")), sent)
        finally:
            self.timeline.append((begun, time.monotonic(), sent[0]))
            if self._log is not None:
                self._log.write(request, status, begun, sent[0])

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, start: int, sent: list[int]
    ) -> web.StreamResponse:
        """The answer, each piece sent once its stripe's disk has moved it (an answer of
        unknown length, a listing or an error, is read whole first)."""
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _NOT_FORWARDED:
                response.headers.add(key, value)
        bodiless = request.method == "HEAD" or upstream.status in (204, 304)
        whole = b"" if bodiless else await upstream.read() if upstream.content_length is None else None
        length = len(whole) if whole is not None else upstream.content_length or 0
        if upstream.content_length is not None or not bodiless:
            response.content_length = upstream.content_length if bodiless else length
        async with self.store.transfer(request.path, start, length) as answer:
            await _send(request, answer, response, upstream, whole, sent)
        await response.write_eof()
        return response


async def _send(
    request: web.Request,
    answer: Transfer,
    response: web.StreamResponse,
    upstream: aiohttp.ClientResponse,
    whole: bytes | None,
    sent: list[int],
) -> None:
    """Each piece once its disk has moved it; the headers go with the first (the store
    answers once its first stripe's seek is done)."""
    for piece in answer.pieces:
        if whole is not None:
            data = whole[piece.offset : piece.offset + piece.length]
        else:
            data = await upstream.content.readexactly(piece.length)
        await piece.done.wait()
        if not response.prepared:
            await response.prepare(request)
        await response.write(data)
        sent[0] += len(data)


PROXY_KEY = web.AppKey("proxy", Proxy)


def make_app(upstream: str, model: HddModel, log: Path | None = None) -> web.Application:
    proxy = Proxy(upstream, model, log)
    app = web.Application(client_max_size=1 << 40)  # bodies of any size pass through
    app[PROXY_KEY] = proxy
    app.router.add_get("/-/stats", proxy.stats)  # no S3 bucket name starts with "-"
    app.router.add_get("/-/timeline", proxy.timeline_since)
    app.router.add_route("*", "/{tail:.*}", proxy.forward)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    return app


@dataclass
class HddProxy(LocalService):
    """``python -m servers.hddproxy`` in front of ``upstream`` on a free loopback port
    (``endpoint``), under a lifeline (it dies with the process that started it)."""

    upstream: str = ""
    model: HddModel = HddModel()
    log: Path | None = None  # --log: one JSON line per request (RequestLog)

    name: ClassVar[str] = "HDD proxy"
    log_name: ClassVar[str] = "hddproxy.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        log = [f"--log={self.log}"] if self.log is not None else []
        base = [sys.executable, "-m", f"{__package__}.hddproxy", f"--upstream={self.upstream}", f"--port={port}"]
        return [*base, *self.model.args(), *log]

    def stats(self) -> dict[str, int]:
        """``GET /-/stats``: requests, stripe transfers and bytes its disks served so far, and repeats."""
        with urllib.request.urlopen(f"{self.endpoint}/-/stats", timeout=10) as response:
            return dict(json.load(response))

    def timeline(self, since: float) -> list[tuple[float, float, int]]:
        """``GET /-/timeline``: (begun, ended, bytes back) of each request begun at ``since``
        (``time.monotonic()``) or later."""
        with urllib.request.urlopen(f"{self.endpoint}/-/timeline?since={since!r}", timeout=10) as response:
            return [(float(b), float(e), int(n)) for b, e, n in json.load(response)]

    def answers(self, port: int) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/")
            connection.getresponse().read()
        finally:
            connection.close()
        return True  # any answer: the proxy and its upstream are up


@contextlib.contextmanager
def start_hddproxy(dir: Path, upstream: str, model: HddModel, log: Path | None = None) -> Iterator[HddProxy]:
    proxy = HddProxy(dir, upstream=upstream, model=model, log=log)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog=prog(f"{__package__}.hddproxy"), description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the origin, http://host:port")
    parser.add_argument("--disks", type=int, default=3)
    parser.add_argument("--spindles", type=int, default=2, help="requests each disk serves at once (0: unlimited)")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="per request")
    parser.add_argument("--bandwidth-mbps", type=float, default=60.0, help="each disk, MB/s (1e6 B/s); 0: unlimited")
    parser.add_argument("--stripe-bytes", type=int, default=4 * MiB)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--log", type=Path, help="append one JSON line per request (who read what)")
    args = parser.parse_args(argv)
    try:
        model = HddModel(args.disks, args.spindles, args.latency_ms, args.bandwidth_mbps, args.stripe_bytes)
    except ValueError as exc:
        parser.error(str(exc))
    serve(make_app(args.upstream, model, args.log), args.host, args.port, args.port_file)


if __name__ == "__main__":
    main()
