"""Fuzz tests of the three servers (issue 9): hypothesis-built requests over every route
(and unknown ones), every method, hostile path segments, query strings, headers, bodies
(wire structs with hypothesis-built fields, other msgpack and JSON, random bytes) and, in
a second test per server, malformed HTTP framing.

Each server runs once for the module, in a loop the module owns (an ``asyncio.Runner``: the
hypothesis tests are plain sync tests that drive it), through the same ``listening()`` as in
production, with short body and header timeouts so that a body which never comes is
answered (408) within half a second.  Every request goes over a raw socket with
``Connection: close``, so target, headers and framing are exactly what the strategy built.

After every request:

- its status is < 500, except where a server legitimately says so: the flash node's 502
  ``corrupt_data`` (the L4 bytes a ref names do not verify: the node cannot tell a bogus ref
  from a bad copy), 503 ``unavailable`` and 507 ``insufficient_storage``.  The metadata API
  and the block server answer no 5xx at all;
- an error reply carries an ErrorBody (msgpack, or JSON when asked), except the body-less
  reply to a HEAD and aiohttp's own plain-text refusals before any middleware runs: 400 from
  its HTTP parser (a malformed request line or header) and 417 for an unknown ``Expect``;
- the server still answers /healthz;
- a request that was not answered 2xx (or not answered at all) left the stored state as it
  was: the API's plans, every file beside and under the block server's root, the flash
  node's cache (entries, bytes, usage per tenant, which chunks it holds) and its hydrate jobs;
- nothing was logged at ERROR (a handler's traceback, an exception no task retrieved).

Runs are derandomized (the same examples every run) and bounded: 30 requests per route
(150-210 per server) and 40 malformed ones per server, about 6 s for the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import msgspec
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blobsdk.metadata import SqliteMetadataStore
from blobsdk.net.serving import ServerLimits
from blobsdk.sources import LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.testing.plans import make_plan
from blobsdk.wire import JSON, MSGPACK, ChunkRef, CommitOp, CommitRequest, ErrorBody, chunk_query, encode
from blobsdk.write.writer import encode_chunk
from servers import api as api_server
from servers import blockstore as block_server
from servers import flash as flash_server
from servers._common.auth import ServerAuth
from servers._common.metrics import by_label
from tests.helpers import Tenancy, running_app

LIMITS = ServerLimits(body_timeout=0.5, header_timeout=2.0)  # a body that never comes costs 0.5 s
REPLY_TIMEOUT_S = 10.0
MAX_BLOCK = 64 << 10
API_TOKEN, BLOCK_TOKEN, ADMIN_TOKEN = "api-token", "block-token", "admin-token"
TENANCY = Tenancy()  # the API and the flash node also take signed tenant tokens
TENANT_TOKEN = TENANCY.token("t1", "b", ttl=1e6)
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
MALFORMED = settings(FUZZ, max_examples=40)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n"
# Plain-text refusals of aiohttp's own, before the app's middlewares run: 400 from its HTTP
# parser (a malformed request line or header), 417 for an unknown Expect.
AIOHTTP_REFUSALS = (400, 417)
METHODS = ("GET", "PUT", "POST", "DELETE", "HEAD", "PATCH")


# --- the raw client -----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One well-framed request: the client adds Host, Connection: close and Content-Length."""

    method: str
    target: str  # path and query, as sent
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    def wire(self, job: str) -> bytes:
        head = [f"{self.method} {self.target.replace('{job}', job)} HTTP/1.1", "Host: fuzz", "Connection: close"]
        head += [f"{name}: {value}" for name, value in self.headers]
        head.append(f"Content-Length: {len(self.body)}")
        return "\r\n".join(head).encode() + b"\r\n\r\n" + self.body


@dataclass(frozen=True)
class Malformed:
    """Bytes that are not a well-framed request; ``half_close`` ends them with a FIN."""

    data: bytes
    half_close: bool = False


@dataclass(frozen=True)
class Reply:
    status: int | None  # None: the connection closed without a reply
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = True  # the whole body arrived


async def exchange(port: int, data: bytes, *, half_close: bool = False, head: bool = False) -> Reply:
    """Send ``data`` on a new connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()
    try:
        with contextlib.suppress(ConnectionError):  # the server may answer and close early
            writer.write(data)
            if half_close:
                writer.write_eof()
            await writer.drain()
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            with contextlib.suppress(ConnectionError):
                while piece := await reader.read(1 << 16):
                    received += piece
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return parse_reply(bytes(received), head=head)


def parse_reply(data: bytes, *, head: bool) -> Reply:
    """The first final (non-1xx) reply in ``data``."""
    while data:
        raw_head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"a reply head that never ends: {data[:200]!r}"
        status_line, *lines = raw_head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        if status >= 200:
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
            return _with_body(status, headers, b"" if head else rest)
        data = rest
    return Reply(None)


def _with_body(status: int, headers: dict[str, str], rest: bytes) -> Reply:
    if "chunked" in headers.get("transfer-encoding", ""):
        return Reply(status, headers, rest, complete=rest.endswith(b"0\r\n\r\n"))  # 2xx only: not decoded
    length = int(headers.get("content-length", len(rest)))
    return Reply(status, headers, rest[:length], complete=len(rest) >= length)


# --- servers under test -------------------------------------------------------------------


class ErrorLog(logging.Handler):
    """Every record at ERROR or above, from any logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Loop:
    runner: asyncio.Runner
    stack: AsyncExitStack
    errors: ErrorLog

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.runner.run(coro)  # type: ignore[arg-type]


@dataclass
class Server:
    """One server under test, how to read its stored state, and what 5xx it may answer."""

    loop: Loop
    port: int
    state: Callable[[], Awaitable[object]]
    allowed_5xx: dict[int, str] = field(default_factory=dict)  # status -> ErrorBody code
    settle: Callable[[], Awaitable[None]] | None = None  # wait for background work a 2xx started
    job: str = "0" * 16  # the last hydrate job id answered (flash), for targets naming {job}

    def check(self, request: Request) -> None:
        self._check(request.wire(self.job), half_close=False, head=request.method == "HEAD")

    def check_malformed(self, request: Malformed) -> None:
        self._check(request.data, half_close=request.half_close, head=False)

    def _check(self, data: bytes, *, half_close: bool, head: bool) -> None:
        self.loop.errors.records.clear()
        before = self.loop.run(self.state())
        reply = self.loop.run(exchange(self.port, data, half_close=half_close, head=head))
        if reply.status is not None and 200 <= reply.status < 300:
            self._remember_job(reply)
            if self.settle is not None:
                self.loop.run(self.settle())
        self._check_status(reply, head=head)
        assert self.loop.run(exchange(self.port, HEALTHZ)).status == 200
        if reply.status is None or not 200 <= reply.status < 300:
            assert self.loop.run(self.state()) == before, f"a request answered {reply.status} changed the stored state"
        assert not self.loop.errors.records, [r.getMessage() for r in self.loop.errors.records]

    def _check_status(self, reply: Reply, *, head: bool) -> None:
        if reply.status is None or reply.status < 400:
            return
        assert reply.status < 500 or reply.status in self.allowed_5xx, f"{reply.status}: {reply.body[:300]!r}"
        if head or not reply.complete:
            return  # no body, or one cut short by a reset: only the status is known
        ctype = reply.headers.get("content-type", "")
        if reply.status in AIOHTTP_REFUSALS and ctype.startswith("text/plain"):
            return
        assert ctype in (MSGPACK, JSON), f"{reply.status} with Content-Type {ctype!r}: {reply.body[:300]!r}"
        error = (msgspec.json.decode if ctype == JSON else msgspec.msgpack.decode)(reply.body, type=ErrorBody)
        assert reply.status < 500 or error.code == self.allowed_5xx[reply.status], error

    def _remember_job(self, reply: Reply) -> None:
        if reply.status == 202 and reply.headers.get("content-type") in (MSGPACK, JSON):
            decode = msgspec.json.decode if reply.headers["content-type"] == JSON else msgspec.msgpack.decode
            self.job = decode(reply.body)["job_id"]


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    stack = AsyncExitStack()
    try:
        with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
            yield Loop(runner, stack, errors)
            runner.run(stack.aclose())
    finally:
        logging.getLogger().removeHandler(errors)


async def serve(loop: Loop, app: Any) -> int:
    url: str = await loop.stack.enter_async_context(running_app(app, LIMITS))
    return int(url.rsplit(":", 1)[1])


# --- strategies shared by the servers -------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)  # encodable as UTF-8
HEX32 = st.text("0123456789abcdef", min_size=32, max_size=32)
HOSTILE_SEGMENTS = (
    *("..", ".", "%2e%2e", "..%2F..%2Fetc%2Fpasswd", "%2F", "%00", "%ff%fe", "%", "%zz", "%20", "~", "%E2%82%AC"),
    *("A" * 32, "g" * 32, "0" * 31, "0" * 33, "x" * 4000, "x" * 9000),  # 9000: longer than aiohttp's request line
)
SEGMENTS = st.one_of(HEX32, st.sampled_from(HOSTILE_SEGMENTS), TEXT.map(lambda s: quote(s, safe="")))
INTS = st.one_of(st.integers(-3, 40), st.sampled_from([-(2**63), 2**31, 2**63 - 1, 2**63, 2**64 - 1]))
FLOATS = st.one_of(st.floats(), st.sampled_from([0.0, 5.0, -1.0]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT, st.binary(max_size=20))
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)
QUERIES = st.one_of(
    st.just(""),
    st.dictionaries(TEXT, st.one_of(TEXT, INTS.map(str), HEX32), max_size=4).map(urlencode),
    st.sampled_from(["a=%zz&&=&b", "=", "&&&", "path", "limit=1&limit=2", "x=" + "y" * 3000]),
)
CONTENT_TYPES = (
    MSGPACK,
    JSON,
    "application/json; charset=utf-8",
    "text/plain",
    "multipart/form-data; boundary=zz",
    "garbage",
    "",
)
TOKEN_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~"
FRAMING = {"host", "connection", "content-length", "transfer-encoding"}  # the client's own
RANDOM_HEADERS = st.tuples(
    st.text(TOKEN_CHARS, min_size=1, max_size=20).filter(lambda name: name.lower() not in FRAMING),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(str.strip),
)
EXTRA_HEADERS = st.one_of(
    st.sampled_from(
        [
            ("Accept", JSON),
            ("Accept", "*/*"),
            ("Content-Encoding", "gzip"),
            ("Content-Encoding", "identity"),
            ("Content-Encoding", "br, gzip"),
            ("Expect", "100-continue"),
            ("Expect", "garbage"),
            ("Range", "bytes=0-0"),
        ]
    ),
    RANDOM_HEADERS,
)


def mostly(likely: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``likely`` about four times in five, else ``other``."""
    return st.sampled_from([True, True, True, True, False]).flatmap(lambda yes: likely if yes else other)


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


NO_BODY, NO_HEADERS = st.none(), st.just(())


@dataclass(frozen=True)
class Route:
    """How to build requests for one route: its method, targets, bodies (objects to encode
    as msgpack or JSON, or bytes sent as they are) and headers of its own."""

    name: str  # the test id
    method: str
    targets: st.SearchStrategy[str]
    bodies: st.SearchStrategy[Any] = NO_BODY
    headers: st.SearchStrategy[tuple[tuple[str, str], ...]] = NO_HEADERS


@st.composite
def requests(draw: st.DrawFn, route: Route, tokens: Sequence[str]) -> Request:
    """A request to ``route``, or, one time in five each, with another method or to a path
    of hostile segments; any headers and body shape."""
    method = draw(mostly(st.just(route.method), st.sampled_from(METHODS)))
    target = draw(route.targets)
    match draw(mostly(st.just("as is"), st.sampled_from(["hostile", "longer"]))):
        case "hostile":
            target = f"/v1/{draw(SEGMENTS)}"
        case "longer":
            target = f"{target.partition('?')[0]}/{draw(SEGMENTS)}"
    as_json = draw(st.booleans())
    body = draw(mostly(route.bodies, st.one_of(ANY, st.binary(max_size=300))))
    body = body if isinstance(body, bytes) else msgspec.json.encode(body) if as_json else msgspec.msgpack.encode(body)
    ctype = draw(mostly(st.just(JSON if as_json else MSGPACK), st.sampled_from(CONTENT_TYPES)))
    token = draw(st.sampled_from(tokens))
    auth = draw(mostly(st.just(f"Bearer {token}"), st.sampled_from(["", "Bearer wrong", "Basic eA==", f"bearer {token}"])))
    extra = draw(mostly(st.just([]), st.lists(EXTRA_HEADERS, min_size=1, max_size=3)))
    return Request(method, target, (("Content-Type", ctype), ("Authorization", auth), *draw(route.headers), *extra), body)


@st.composite
def malformed(draw: st.DrawFn, requests: st.SearchStrategy[Request]) -> Malformed:
    """A valid request framed badly: a body shorter or longer than declared, bad
    Content-Length or Transfer-Encoding, a bad request line or header, bare LF, a head cut off."""
    request = draw(requests)
    head = [
        f"{request.method} {request.target} HTTP/1.1",
        "Host: fuzz",
        "Connection: close",
        *(f"{k}: {v}" for k, v in request.headers),
    ]
    body = request.body

    def framed(*extra: str, data: bytes = body, lines: Sequence[str] = head, sep: str = "\r\n") -> bytes:
        return sep.join([*lines, *extra]).encode("latin-1") + (sep * 2).encode() + data

    length = f"Content-Length: {len(body)}"
    kinds: dict[str, Callable[[], Malformed]] = {
        "short": lambda: Malformed(framed(f"Content-Length: {len(body) + draw(st.integers(1, 100))}")),
        "short_eof": lambda: Malformed(framed(f"Content-Length: {len(body) + draw(st.integers(1, 100))}"), half_close=True),
        "long": lambda: Malformed(
            framed(f"Content-Length: {draw(st.integers(0, len(body)))}", data=body + b"GARBAGE / HTTP/1.1\r\n\r\n")
        ),
        "bad_length": lambda: Malformed(framed(f"Content-Length: {draw(st.sampled_from(BAD_LENGTHS))}")),
        "two_lengths": lambda: Malformed(framed(length, f"Content-Length: {len(body) + 1}")),
        "chunked": lambda: Malformed(
            framed("Transfer-Encoding: chunked", data=_chunked(body, draw(st.sampled_from(CHUNK_ENDINGS))))
        ),
        "chunked_eof": lambda: Malformed(
            framed("Transfer-Encoding: chunked", data=_chunked(body, "")[: draw(st.integers(0, len(body)))]), half_close=True
        ),
        "chunked_and_length": lambda: Malformed(framed("Transfer-Encoding: chunked", length, data=_chunked(body, "0\r\n\r\n"))),
        "other_encoding": lambda: Malformed(
            framed(f"Transfer-Encoding: {draw(st.sampled_from(['gzip', 'gzip, chunked', 'x']))}")
        ),
        "bad_line": lambda: Malformed(framed(lines=[draw(st.sampled_from(BAD_LINES)), *head[1:]])),
        "bad_header": lambda: Malformed(framed(length, draw(st.sampled_from(BAD_HEADERS)))),
        "bare_lf": lambda: Malformed(framed(length, sep="\n")),
        "cut_head": lambda: Malformed(framed()[: draw(st.integers(1, len(head[0])))], half_close=True),
    }
    return kinds[draw(st.sampled_from(sorted(kinds)))]()


BAD_LENGTHS = ("-1", "abc", "1, 2", "+5", "0x10", "9" * 25, "")
CHUNK_ENDINGS = ("0\r\n\r\n", "zz\r\n\r\n", "0\r\n", "", "1;ext=1\r\nx\r\n0\r\n\r\n", "ffffffffffffffffff\r\n", "-1\r\n\r\n")
BAD_LINES = (
    *("GET /healthz", "GET /healthz HTTP/9.9", "get /healthz HTTP/1.1", "GE T / HTTP/1.1", "GET /\x00 HTTP/1.1"),
    *("\xff\xfe / HTTP/1.1", "GET " + "/x" * 5000 + " HTTP/1.1", " / HTTP/1.1"),
)
BAD_HEADERS = (
    "NoColon",
    "Bad Name: x",
    " folded: continuation",
    "X-Nul: a\x00b",
    "X-Long: " + "v" * 9000,
    "X-Latin: \xe9\xff",
    ": empty",
)


def _chunked(body: bytes, ending: str) -> bytes:
    return (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + ending.encode()


def by_route(routes: Sequence[Route]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("route", routes, ids=[r.name for r in routes])


# --- the metadata API ---------------------------------------------------------------------

API_SEEDED = ("/b/k0", "/b/k1", "/b/k2", "/c/deep/k")
API_PATHS = st.one_of(
    st.sampled_from(
        [*API_SEEDED, "/b/new", "/b/", "/", "/b", "//b/x", "/b/./x", "/b/../x", "/b/x\x00", "b/x", "/b/" + "k" * 1100]
    ),
    TEXT,
)
PLAN_FIELDS = ("path", "version", "etag", "size", "chunk_size", "chunks", "created")
CHUNK_FIELDS = ("block_id", "offset", "length", "raw_length", "checksum", "codec")
CURSORS = st.one_of(st.none(), API_PATHS)
IF_VERSIONS = st.one_of(st.none(), INTS)


@st.composite
def plans(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A valid plan for ``path`` as a dict, maybe with some of its fields (or of its first
    chunk's) replaced by anything."""
    plan: dict[str, Any] = msgspec.to_builtins(make_plan(path, size=draw(st.integers(0, 40)), seed=draw(st.integers(0, 3))))
    plan.update(draw(st.dictionaries(st.sampled_from(PLAN_FIELDS), ANY, max_size=2)))
    if isinstance(plan.get("chunks"), list) and plan["chunks"] and isinstance(plan["chunks"][0], dict):
        plan["chunks"][0].update(draw(st.dictionaries(st.sampled_from(CHUNK_FIELDS), st.one_of(INTS, TEXT), max_size=2)))
    return plan


@st.composite
def commit_ops(draw: st.DrawFn) -> dict[str, Any]:
    path = draw(API_PATHS)
    return {"path": path, "plan": draw(plans(draw(mostly(st.just(path), API_PATHS)))), **draw(optional(if_version=IF_VERSIONS))}


API_ROUTES = [
    Route(
        "plans",
        "POST",
        st.just("/v1/plans"),
        st.builds(lambda p: {"paths": p}, st.lists(API_PATHS, max_size=5) | st.just(["/b/k0"] * 1001)),
    ),
    Route("commit", "POST", st.just("/v1/commit"), st.builds(lambda ops: {"ops": ops}, st.lists(commit_ops(), max_size=3))),
    Route(
        "delete",
        "POST",
        st.just("/v1/delete"),
        st.builds(lambda p, o: {"path": p, **o}, API_PATHS, optional(if_version=IF_VERSIONS)),
    ),
    Route(
        "list",
        "POST",
        st.just("/v1/list"),
        st.builds(lambda p, o: {"prefix": p, **o}, API_PATHS, optional(start_after=CURSORS, limit=INTS)),
    ),
    Route("scan", "POST", st.just("/v1/scan"), optional(start_after=CURSORS, limit=INTS)),
    Route("stat", "GET", st.one_of(API_PATHS.map(lambda p: urlencode({"path": p})), QUERIES).map(lambda q: f"/v1/stat?{q}")),
    Route("other", "GET", st.sampled_from(["/healthz", "/metrics", "/", "/v1", "/v1/", "/v1/plans/x", "/admin/faults"])),
]
API_VALID = st.sampled_from(
    [
        Request("POST", "/v1/list", (("Authorization", f"Bearer {API_TOKEN}"),), msgspec.msgpack.encode({"prefix": "/b/"})),
        Request(
            "POST",
            "/v1/commit",
            (("Authorization", f"Bearer {API_TOKEN}"),),
            encode(CommitRequest(ops=[CommitOp(path="/d/x", plan=make_plan("/d/x"))])),
        ),
    ]
)


@pytest.fixture(scope="module")
def api(loop: Loop, tmp_path_factory: pytest.TempPathFactory) -> Server:
    store = SqliteMetadataStore(tmp_path_factory.mktemp("fuzz_api") / "meta.sqlite")
    for path in API_SEEDED:
        loop.run(store.commit(path, make_plan(path, size=20)))
    port = loop.run(serve(loop, api_server.make_app(store, TENANCY.auth(API_TOKEN))))

    async def plans_stored() -> list[object]:
        found, cursor = [], None
        while True:
            page, cursor = await store.scan_page(cursor, 1000)
            found += page
            if cursor is None:
                return found

    return Server(loop, port, plans_stored)


@FUZZ
@by_route(API_ROUTES)
@given(data=st.data())
def test_api_survives_any_request(api: Server, route: Route, data: st.DataObject) -> None:
    api.check(data.draw(requests(route, [API_TOKEN, TENANT_TOKEN])))


@MALFORMED
@given(request=malformed(API_VALID))
def test_api_survives_malformed_requests(api: Server, request: Malformed) -> None:
    api.check_malformed(request)


# --- the block server ---------------------------------------------------------------------

BLOCK_SEEDED = {f"{i:032x}": bytes([i]) * 1000 * i for i in range(1, 4)}
BLOCK_IDS = mostly(st.sampled_from(sorted(BLOCK_SEEDED)), st.one_of(HEX32, SEGMENTS))
BLOCK_TARGETS = BLOCK_IDS.map(lambda b: f"/v1/blocks/{b}")
BLOCK_BODIES = st.one_of(
    st.builds(
        lambda n, byte: bytes([byte]) * n, st.sampled_from([0, 1, 1000, 2000, 3000, MAX_BLOCK, MAX_BLOCK + 1]), st.integers(0, 3)
    ),
    st.binary(max_size=200),
)
RANGES = st.one_of(
    st.sampled_from(["bytes=0-0", "bytes=0-", "bytes=5-2", "bytes=-5", "bytes=0-1,2-3", "bytes=abc", "items=0-1", " bytes=0-1"]),
    st.builds(lambda a, b: f"bytes={a}-{b}", INTS, st.one_of(st.just(""), INTS.map(str))),
)
LIMIT_VALUES = st.sampled_from(["0", "-1", "1", "10000", "10001", "abc", "1e3", "", "9" * 25])
BLOCK_ROUTES = [
    Route("put", "PUT", BLOCK_TARGETS, BLOCK_BODIES),
    Route("get", "GET", BLOCK_TARGETS, headers=st.one_of(st.just(()), RANGES.map(lambda r: (("Range", r),)))),
    Route("delete", "DELETE", BLOCK_TARGETS),
    Route(
        "list",
        "GET",
        st.one_of(optional(start_after=BLOCK_IDS, limit=LIMIT_VALUES).map(urlencode), QUERIES).map(lambda q: f"/v1/blocks?{q}"),
    ),
    Route("other", "GET", st.sampled_from(["/healthz", "/metrics", "/", "/v1", "/v1/blocks/", "/admin/faults"])),
]
BLOCK_VALID = st.builds(
    lambda b: Request("PUT", f"/v1/blocks/{b}", (("Authorization", f"Bearer {BLOCK_TOKEN}"),), b"x" * 100), HEX32
)


def files_under(root: Path) -> list[tuple[str, int]]:
    """Every file under ``root`` but a write's temp file, with its size (a rejected PUT's
    temp file is removed in the background: the fixture checks none is left at the end)."""
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file() and p.suffix != ".tmp")


@pytest.fixture(scope="module")
def blocks(loop: Loop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fuzz_blocks")
    (tmp / "outside").write_bytes(b"not a block")  # a path escaping the root would reach it
    loop.run(_write_blocks(tmp / "root", BLOCK_SEEDED))
    app = block_server.make_app(tmp / "root", auth=ServerAuth(BLOCK_TOKEN), max_block_bytes=MAX_BLOCK)

    async def files() -> list[tuple[str, int]]:
        return files_under(tmp)

    yield Server(loop, loop.run(serve(loop, app)), files)
    no_temp_files_soon(tmp)


async def _write_blocks(root: Path, contents: dict[str, bytes]) -> None:
    async with LocalBlockStore(root) as store:
        for block_id, data in contents.items():
            await store.write_block(block_id, [data])


def no_temp_files_soon(root: Path) -> None:
    """Wait for the store's threads to discard rejected writes' temp files; fail if any stays."""
    for _ in range(100):
        if not (left := list(root.rglob("*.tmp"))):
            return
        time.sleep(0.01)
    raise AssertionError(f"temp files left behind: {left}")


@FUZZ
@by_route(BLOCK_ROUTES)
@given(data=st.data())
def test_block_server_survives_any_request(blocks: Server, route: Route, data: st.DataObject) -> None:
    blocks.check(data.draw(requests(route, [BLOCK_TOKEN])))


@MALFORMED
@given(request=malformed(BLOCK_VALID))
def test_block_server_survives_malformed_requests(blocks: Server, request: Malformed) -> None:
    blocks.check_malformed(request)


# --- the flash node -------------------------------------------------------------------------

QUOTA = 32 << 10


def _seeded_chunks() -> list[tuple[ChunkRef, bytes]]:
    """Four chunks of one L4 block (one lz4), with their stored bytes."""
    block_id, offset, chunks = new_block_id(), 0, []
    raws = ((os.urandom(1000), "none"), (os.urandom(20_000), "none"), (b"squash " * 4000, "lz4"), (os.urandom(48 << 10), "none"))
    for raw, compression in raws:
        enc = encode_chunk(memoryview(raw), compression)  # type: ignore[arg-type]
        payload = bytes(enc.payload)
        ref = ChunkRef(
            block_id=block_id,
            offset=offset,
            length=len(payload),
            raw_length=enc.raw_length,
            checksum=enc.checksum,
            codec=enc.codec,
        )
        chunks.append((ref, payload))
        offset += len(payload)
    return chunks


SEEDED = _seeded_chunks()
REF_VALUES = st.one_of(INTS, TEXT, HEX32, st.sampled_from(["none", "lz4", "zstd"]))


@st.composite
def own_chunks(draw: st.DrawFn) -> tuple[ChunkRef, bytes]:
    """A chunk of the client's own (not in L4) and its bytes."""
    payload = draw(st.binary(min_size=1, max_size=2000))
    checksum = xxhash.xxh3_64_intdigest(payload)
    return ChunkRef(block_id=draw(HEX32), offset=0, length=len(payload), raw_length=len(payload), checksum=checksum), payload


@st.composite
def chunk_refs(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """A ChunkRef as a dict and the stored bytes it names: one in L4, one of the client's
    own, or one in L4 with a field or two replaced by anything."""
    ref, payload = draw(st.one_of(st.sampled_from(SEEDED), own_chunks()))
    fields: dict[str, Any] = msgspec.to_builtins(ref)
    if draw(st.integers(0, 3)) == 0:
        fields.update(draw(st.dictionaries(st.sampled_from(CHUNK_FIELDS), REF_VALUES, min_size=1, max_size=2)))
    return fields, payload


def key_of(fields: dict[str, Any]) -> str:
    try:
        return msgspec.convert(fields, ChunkRef).key
    except (msgspec.ValidationError, ValueError):
        return "0" * 32


@st.composite
def chunk_targets(draw: st.DrawFn, chunk: tuple[dict[str, Any], bytes]) -> str:
    fields, _ = chunk
    query = {k: str(v) for k, v in fields.items()} | draw(optional(pin_seconds=PIN_SECONDS))
    return f"/v1/chunks/{draw(mostly(st.just(key_of(fields)), SEGMENTS))}?{urlencode(query)}"


def bad_copy_targets(target: str) -> str:
    path, _, query = target.partition("?")
    return f"{path}/bad?{query}"


def put_bodies(chunk: tuple[dict[str, Any], bytes]) -> st.SearchStrategy[bytes]:
    _, payload = chunk
    return mostly(st.just(payload), st.sampled_from([payload[:-1], payload + b"x", bytes([payload[0] ^ 1]) + payload[1:], b""]))


PIN_SECONDS = st.sampled_from(["0", "5", "-1", "nan", "inf", "1e308", "abc", ""])
CHUNK = st.shared(chunk_refs(), key="chunk")  # one ref per request: its target and its PUT body
HYDRATES = st.builds(
    lambda refs, pin: {"refs": refs, **pin},
    st.lists(chunk_refs().map(lambda c: c[0]), max_size=4),
    optional(pin_seconds=st.one_of(st.none(), FLOATS, TEXT)),
)
JOBS = mostly(st.just("/v1/hydrate/{job}"), SEGMENTS.map(lambda s: f"/v1/hydrate/{s}"))
FLASH_ROUTES = [
    Route("get", "GET", CHUNK.flatmap(chunk_targets)),
    Route("put", "PUT", CHUNK.flatmap(chunk_targets), CHUNK.flatmap(put_bodies)),
    Route("bad", "POST", CHUNK.flatmap(chunk_targets).map(bad_copy_targets)),
    Route("hydrate", "POST", st.just("/v1/hydrate"), HYDRATES),
    Route("status", "GET", JOBS),
    Route("cancel", "DELETE", JOBS),
    Route("other", "GET", st.sampled_from(["/stats", "/healthz", "/metrics", "/", "/v1/chunks", "/v1/chunks/", "/admin/faults"])),
]
FLASH_VALID = st.builds(
    lambda chunk: Request(
        "PUT", f"/v1/chunks/{chunk[0].key}?{chunk_query(chunk[0])}", (("Authorization", f"Bearer {ADMIN_TOKEN}"),), chunk[1]
    ),
    own_chunks(),
)


@pytest.fixture(scope="module")
def flash(loop: Loop, tmp_path_factory: pytest.TempPathFactory) -> Server:
    tmp = tmp_path_factory.mktemp("fuzz_flash")
    loop.run(_write_blocks(tmp / "l4", {SEEDED[0][0].block_id: b"".join(payload for _, payload in SEEDED)}))
    l4_port = loop.run(serve(loop, block_server.make_app(tmp / "l4", auth=ServerAuth(BLOCK_TOKEN))))
    config = flash_server.FlashConfig(
        dir=str(tmp / "flash"),
        block_urls=(f"http://127.0.0.1:{l4_port}",),
        block_token=BLOCK_TOKEN,
        quotas={"t1": QUOTA},
        capacity_bytes=96 << 10,
        max_chunk_bytes=1 << 20,
        max_jobs=4,
    )
    app = flash_server.make_app(config, auth=TENANCY.auth(ADMIN_TOKEN))
    port = loop.run(serve(loop, app))
    node = app[flash_server.FLASH_NODE]

    async def cached() -> tuple[object, ...]:
        stats = node.cache.stats()
        held = [ref.key for ref, _ in SEEDED if node.cache.contains(ref.key)]
        return stats["entries"], stats["bytes"], node.cache.tenant_usage(), held, node.snapshot()["jobs"]

    async def jobs_done() -> None:
        for _ in range(500):
            if not node.running_jobs():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("hydrate jobs still running after 5 s")

    allowed = {502: "corrupt_data", 503: "unavailable", 507: "insufficient_storage"}
    return Server(loop, port, cached, allowed, settle=jobs_done)


@FUZZ
@by_route(FLASH_ROUTES)
@given(data=st.data())
def test_flash_node_survives_any_request(flash: Server, route: Route, data: st.DataObject) -> None:
    flash.check(data.draw(requests(route, [ADMIN_TOKEN, TENANT_TOKEN])))


@MALFORMED
@given(request=malformed(FLASH_VALID))
def test_flash_node_survives_malformed_requests(flash: Server, request: Malformed) -> None:
    flash.check_malformed(request)


# --- regressions the fuzzer found -----------------------------------------------------------


def requests_counted(server: Server, prefix: str, route: str) -> Counter[str]:
    """The server's /metrics request counts of ``route``, by status."""
    body = server.loop.run(exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n")).body
    counts = by_label(body.decode(), f"{prefix}_requests_total", "status", route=route)
    return Counter({status: int(n) for status, n in counts.items()})


HANG_UP_REF = ChunkRef(block_id="0" * 32, offset=0, length=1, raw_length=1, checksum=xxhash.xxh3_64_intdigest(b"x"))
HANG_UPS = [  # (server, its metrics prefix, route, a request whose body never ends: the client hangs up)
    (
        "api",
        "blobsdk_api",
        "/v1/list",
        f"POST /v1/list HTTP/1.1\r\nAuthorization: Bearer {API_TOKEN}\r\nContent-Length: 13\r\n\r\n\x81",
    ),
    (
        "flash",
        "blobsdk_flash",
        "/v1/chunks/{key}",
        f"PUT /v1/chunks/{HANG_UP_REF.key}?{chunk_query(HANG_UP_REF)} HTTP/1.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n",
    ),
]


@pytest.mark.parametrize(("server", "prefix", "route", "head"), HANG_UPS, ids=[h[0] for h in HANG_UPS])
def test_a_client_hanging_up_mid_body_is_a_bad_request(
    request: pytest.FixtureRequest, server: str, prefix: str, route: str, head: str
) -> None:
    """It was a ConnectionResetError out of the handler: a 500 and a logged traceback per
    hang-up (the block server already answered BadRequest).  Now the body read fails (400)
    or, when the connection is lost first, the handler is cancelled (499): either way no 500."""
    under_test: Server = request.getfixturevalue(server)
    before = requests_counted(under_test, prefix, route)
    data = head.replace("HTTP/1.1\r\n", "HTTP/1.1\r\nHost: fuzz\r\n", 1).encode("latin-1")
    under_test.check_malformed(Malformed(data, half_close=True))
    for _ in range(200):  # the handler ends after the connection: wait for it to be counted
        counted = requests_counted(under_test, prefix, route) - before
        if counted:
            break
        under_test.loop.run(asyncio.sleep(0.01))
    assert counted in (Counter({"400": 1}), Counter({"499": 1}))
    assert not under_test.loop.errors.records
