"""The metadata API server as a real subprocess: bad input, auth, limits, crash durability."""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from blobsdk.errors import InvalidPath, Unauthorized
from blobsdk.metadata import HttpMetadataStore
from blobsdk.testing.plans import BAD_PLANS, bad_plan, make_plan, put
from blobsdk.wire import (
    JSON,
    MSGPACK,
    BlobInfo,
    ChunkRef,
    CommitOp,
    CommitRequest,
    ErrorBody,
    GetPlansRequest,
    ReadPlan,
    encode,
)
from tests.helpers import ROOT, server_process

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def api_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    with server_process("servers.api", "--db", str(tmp / "meta.sqlite"), tmp=tmp) as (url, _proc):
        yield url


@pytest.fixture(scope="module")
def secured_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api_token")
    with server_process("servers.api", "--db", str(tmp / "meta.sqlite"), "--token", TOKEN, tmp=tmp) as (url, _proc):
        yield url


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as session:
        yield session


async def post(session, url: str, body: object, content_type: str = MSGPACK) -> tuple[int, ErrorBody | bytes]:
    async with session.post(url, data=body, headers={"Content-Type": content_type}) as resp:
        payload = await resp.read()
    if resp.status < 400:
        return resp.status, payload
    decode = msgspec.json.decode if resp.content_type == JSON else msgspec.msgpack.decode
    return resp.status, decode(payload, type=ErrorBody)


async def assert_healthy(session, url: str) -> None:
    async with session.get(f"{url}/healthz") as resp:
        assert resp.status == 200


async def test_malformed_msgpack_is_bad_request(session, api_url):
    status, err = await post(session, f"{api_url}/v1/plans", b"\xc1\xff\x00garbage")
    assert (status, err.code) == (400, "bad_request")


async def test_wrong_shaped_json_is_bad_request(session, api_url):
    for body in (b'{"paths": "/b/x"}', b'{"pathz": []}', b"[1, 2]", b"{not json"):
        status, err = await post(session, f"{api_url}/v1/plans", body, JSON)
        assert (status, err.code) == (400, "bad_request"), body


async def test_json_requests_get_json_answers(session, api_url):
    status, body = await post(session, f"{api_url}/v1/plans", b'{"paths": ["/b/none"]}', JSON)
    assert status == 200 and msgspec.json.decode(body) == {"plans": [None]}


async def chunked(total: int, step: int = 1 << 20) -> AsyncIterator[bytes]:
    for _ in range(total // step):
        yield b"\x00" * step


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_huge_body_is_rejected_and_server_survives(session, api_url, framing):
    size = 20 << 20
    body = io.BytesIO(b"\x00" * size) if framing == "content-length" else chunked(size)
    try:
        status, err = await post(session, f"{api_url}/v1/commit", body)
        assert status == 413 and err.code == "payload_too_large"
    except aiohttp.ClientOSError:
        pass  # the server may also close the connection while we still send: not a crash
    await assert_healthy(session, api_url)


async def test_large_valid_commit_is_accepted(session, api_url):
    chunks = tuple(
        ChunkRef(block_id="b" * 32, offset=i << 22, length=1 << 22, raw_length=1 << 22, checksum=i) for i in range(100)
    )
    plans = [
        ReadPlan(path=f"/big/k{i}", version=0, etag="e", size=100 << 22, chunk_size=1 << 22, chunks=chunks) for i in range(1000)
    ]
    ops = [CommitOp(path=plan.path, plan=plan) for plan in plans]
    assert len(encode(CommitRequest(ops=ops))) > 8 << 20
    committed = await HttpMetadataStore(session, api_url).commit_many(ops)
    assert [p.version for p in committed] == [1] * 1000


async def test_too_many_paths_is_bad_request(session, api_url):
    body = encode(GetPlansRequest(paths=[f"/b/k{i}" for i in range(1001)]))
    status, err = await post(session, f"{api_url}/v1/plans", body)
    assert (status, err.code) == (400, "bad_request") and "1001" in err.message


async def test_bad_arguments_are_400_not_500(session, api_url):
    cases = [
        ("/v1/plans", b'{"paths": ["relative"]}', "invalid_path"),
        ("/v1/list", b'{"prefix": "/b/", "limit": 0}', "bad_request"),
        ("/v1/scan", b'{"limit": 100000}', "bad_request"),
        ("/v1/delete", b'{"path": "/b/x", "if_version": -3}', "bad_request"),
    ]
    for route, body, code in cases:
        status, err = await post(session, f"{api_url}{route}", body, JSON)
        assert (status, err.code) == (400, code), route


def issue_commit(path: str, size: int, chunks: list[dict[str, object]]) -> bytes:
    """A commit as curl would send it: JSON, straight to the server."""
    plan = {"path": path, "version": 0, "etag": "e", "size": size, "chunk_size": 8, "chunks": chunks}
    return msgspec.json.encode({"ops": [{"path": path, "plan": plan}]})


def chunk(**fields: object) -> dict[str, object]:
    return {"block_id": "0" * 32, "offset": 0, "length": 8, "raw_length": 8, "checksum": 1, **fields}


@pytest.mark.parametrize(
    ("size", "chunks", "message"),
    [
        (10, [], "chunks cover 0 bytes, size is 10"),
        (2**50, [chunk()], "chunks cover 8 bytes, size is 1125899906842624"),
        (8, [chunk(block_id="../../etc/passwd")], "chunk 0: invalid block id '../../etc/passwd': want 32 lowercase hex digits"),
        (8, [chunk(length=-8)], "chunk 0: uncompressed chunk with length -8 != raw_length 8"),
        (-8, [chunk(length=-8, raw_length=-8)], "negative size -8"),
    ],
)
async def test_commit_of_an_invalid_plan_is_bad_request_and_stores_nothing(session, api_url, size, chunks, message):
    path = f"/bad/k{abs(size)}-{len(str(chunks))}"
    status, err = await post(session, f"{api_url}/v1/commit", issue_commit(path, size, chunks), JSON)
    assert (status, err.code, err.message) == (400, "bad_request", f"plan for {path!r}: {message}")
    async with session.get(f"{api_url}/v1/stat", params={"path": path}) as resp:
        assert resp.status == 404


@pytest.mark.parametrize(("plan", "chunk_fields", "message"), BAD_PLANS)
async def test_server_checks_every_plan_rule_itself(session, api_url, plan, chunk_fields, message):
    bad = bad_plan("/b/rules", plan, chunk_fields)
    status, err = await post(session, f"{api_url}/v1/commit", encode(CommitRequest(ops=[CommitOp(path="/b/rules", plan=bad)])))
    assert (status, err.code, err.message) == (400, "bad_request", f"plan for '/b/rules': {message}")


async def test_invalid_path_maps_back_to_invalid_path(session, api_url):
    # Bypass the client-side check to see the server's answer come back as the same class.
    store = HttpMetadataStore(session, api_url)
    with pytest.raises(InvalidPath):
        await store._get_plans(["/b/../x"])


async def test_stat(session, api_url):
    store = HttpMetadataStore(session, api_url)
    committed = await put(store, "/b/stat%_x")
    async with session.get(f"{api_url}/v1/stat", params={"path": "/b/stat%_x"}) as resp:
        assert resp.status == 200
        assert msgspec.msgpack.decode(await resp.read(), type=BlobInfo) == committed.info()
    async with session.get(f"{api_url}/v1/stat", params={"path": "/b/none"}) as resp:
        assert resp.status == 404
    async with session.get(f"{api_url}/v1/stat") as resp:
        assert resp.status == 400


async def test_healthz_and_metrics(session, api_url):
    await assert_healthy(session, api_url)
    async with session.get(f"{api_url}/metrics") as resp:
        assert resp.status == 200
        assert "blobsdk_api_requests_total" in await resp.text()


async def test_token_required(session, secured_url):
    status, err = await post(session, f"{secured_url}/v1/plans", encode(GetPlansRequest(paths=["/b/x"])))
    assert (status, err.code) == (401, "unauthorized")
    for token in (None, "wrong"):
        with pytest.raises(Unauthorized):
            await HttpMetadataStore(session, secured_url, token).get_plans(["/b/x"])
    assert await HttpMetadataStore(session, secured_url, TOKEN).get_plans(["/b/x"]) == [None]
    await assert_healthy(session, secured_url)


async def test_many_concurrent_clients(session, api_url):
    store = HttpMetadataStore(session, api_url)
    ops = [put(store, f"/conc/k{i:03d}") for i in range(200)]
    plans = await asyncio.gather(*ops)
    assert {p.version for p in plans} == {1}
    assert len([i async for i in store.list("/conc/", limit=50)]) == 200


async def test_acknowledged_commits_survive_a_crash(session, tmp_path):
    db = str(tmp_path / "meta.sqlite")
    with server_process("servers.api", "--db", db, tmp=tmp_path) as (url, proc):
        store = HttpMetadataStore(session, url)
        await store.commit_many([CommitOp(path=f"/b/k{i}", plan=make_plan(f"/b/k{i}")) for i in range(100)])
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with server_process("servers.api", "--db", db, tmp=tmp_path) as (url, _proc):
        store = HttpMetadataStore(session, url)
        assert all(plan is not None for plan in await store.get_plans([f"/b/k{i}" for i in range(100)]))


def test_help_exits_zero():
    done = subprocess.run([sys.executable, "-m", "servers.api", "--help"], cwd=ROOT, capture_output=True, timeout=30)
    assert done.returncode == 0 and b"--db" in done.stdout


def test_db_is_required():
    done = subprocess.run([sys.executable, "-m", "servers.api"], cwd=ROOT, capture_output=True, timeout=30)
    assert done.returncode == 2 and b"--db" in done.stderr


def test_tenant_slots_must_be_a_positive_count(tmp_path, capsys):
    from servers import api

    with pytest.raises(SystemExit) as exit:
        api.main(["--db", str(tmp_path / "meta.sqlite"), "--tenant-slots", "0"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("argument --tenant-slots: invalid positive int value: '0'")
