"""servers/_common/faults.py: every fault kind as a plain HTTP client sees it, on real servers
(in-loop, and as processes started with --fault flags)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import subprocess
import sys
import time
from argparse import Namespace
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from blobsdk.errors import Unavailable
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.sources import HttpBlockStore, LocalBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.wire import JSON, ErrorBody, GetPlansRequest, encode
from servers import api, blockstore, flash
from servers._common.auth import ServerAuth
from servers._common.faults import (
    FAULTS_KEY,
    FaultConfig,
    FaultInjector,
    FaultRule,
    FaultStatus,
    Lognormal,
    config_of_args,
    parse_env,
    parse_rule,
)
from servers._common.http import METRICS_KEY
from servers._common.metrics import sample_sum
from servers.cluster import KINDS, parse_args, start_cluster
from servers.clusterplan import common_args
from tests.helpers import ROOT, Tenancy, running_app, server_process

ADMIN = "admin-s3cret"
BLOCK = bytes(range(256)) * 40  # 10,240 bytes
BIG = bytes(range(251)) * 10_000  # 2.4 MiB: the block server streams it in three writes (BLOCK: one reply)
BLOCK_ROUTE = "/v1/blocks/{block_id}"


@dataclass
class Blocks:
    """An in-loop block server holding one block, its fault injector and a client session."""

    app: web.Application
    url: str
    block_id: str
    session: aiohttp.ClientSession

    @property
    def block_url(self) -> str:
        return f"{self.url}/v1/blocks/{self.block_id}"

    @property
    def faults(self) -> FaultInjector:
        return self.app[FAULTS_KEY]

    def use(self, *rules: FaultRule, seed: int | None = None) -> None:
        self.faults.configure(FaultConfig(rules=rules, seed=seed))


@asynccontextmanager
async def block_server(tmp: Path, data: bytes = BLOCK, **options: Any) -> AsyncIterator[Blocks]:
    """A block server (``options`` go to its make_app; admin token ADMIN) storing ``data``."""
    app = blockstore.make_app(tmp / "blocks", admin_token=ADMIN, **options)
    async with aiohttp.ClientSession() as session, running_app(app) as url:
        block_id = new_block_id()
        await HttpBlockStore(session, url).write_block(block_id, [data])
        yield Blocks(app, url, block_id, session)


@pytest.fixture
async def blocks(tmp_path: Path) -> AsyncIterator[Blocks]:
    async with block_server(tmp_path) as b:
        yield b


async def get(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, bytes]:
    async with session.get(url, **kwargs) as resp:
        return resp.status, await resp.read()


async def timed_get(session: aiohttp.ClientSession, url: str) -> float:
    start = time.perf_counter()
    status, _ = await get(session, url)
    assert status == 200
    return time.perf_counter() - start


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def error_code(body: bytes) -> str:
    return msgspec.msgpack.decode(body, type=ErrorBody).code


def differing_bytes(a: bytes, b: bytes) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


# --- spec syntax --------------------------------------------------------------------------


def test_a_spec_names_rule_fields() -> None:
    spec = (
        "route=/v1/blocks; methods=get,put ;error_rate=10%;latency_ms=5;latency_lognormal=20,0.5;"
        "slow_fraction=0.01;slow_ms=200;max_in_service=4;queue_limit=2;overload=slow"
    )
    assert parse_rule(spec) == FaultRule(
        route="/v1/blocks",
        methods=("GET", "PUT"),
        error_rate=0.1,
        latency_ms=5.0,
        latency_lognormal=Lognormal(median_ms=20.0, sigma=0.5),
        slow_fraction=0.01,
        slow_ms=200.0,
        max_in_service=4,
        queue_limit=2,
        overload="slow",
    )
    assert parse_rule("") == FaultRule()


@pytest.mark.parametrize(
    "spec",
    [
        "error_rate",
        "bogus=1",
        "error_rate=2",
        "error_rate=x%",
        "latency_ms=-1",
        "route=v1/blocks",
        "queue_limit=3",
        "overload=maybe",
        "max_in_service=0",
        "latency_lognormal=0,1",
        "stall_rate=nan",
    ],
)
def test_a_bad_spec_is_a_value_error(spec: str) -> None:
    with pytest.raises(ValueError, match="fault"):
        parse_rule(spec)


def test_env_value_is_json_or_specs_and_flags_come_after_it() -> None:
    assert parse_env("route=/a;error_rate=1 | route=/b;stall_rate=50%") == FaultConfig(
        rules=(FaultRule(route="/a", error_rate=1.0), FaultRule(route="/b", stall_rate=0.5))
    )
    from_json = FaultConfig(rules=(FaultRule(latency_ms=3.0),), seed=9)
    env = msgspec.json.encode(from_json).decode()
    assert parse_env(env) == from_json
    args = Namespace(fault=["route=/c;error_rate=1"], fault_seed=None)
    flag_rule = FaultRule(route="/c", error_rate=1.0)
    assert config_of_args(args, env) == FaultConfig(rules=(*from_json.rules, flag_rule), seed=9)
    assert config_of_args(Namespace(fault=[], fault_seed=4), env).seed == 4
    assert config_of_args(Namespace(fault=[], fault_seed=None), None) is None
    with pytest.raises(ValueError, match="BLOBSDK_FAULTS"):
        parse_env('{"rules": [{"error_rate": 2}]}')


# --- each kind of fault -------------------------------------------------------------------


async def test_no_rules_no_faults(blocks: Blocks) -> None:
    assert await get(blocks.session, blocks.block_url) == (200, BLOCK)
    assert set(blocks.faults.injected.values()) == {0}


async def test_fixed_latency_delays_data_routes_only(blocks: Blocks) -> None:
    blocks.use(FaultRule(latency_ms=200))
    assert await timed_get(blocks.session, blocks.block_url) >= 0.2
    for route in ("/healthz", "/metrics"):
        assert (await get(blocks.session, blocks.url + route))[0] == 200
    assert blocks.faults.injected["latency"] == 1


async def test_lognormal_and_slow_fraction_latency(blocks: Blocks) -> None:
    blocks.use(FaultRule(latency_lognormal=Lognormal(median_ms=150, sigma=0)))  # sigma 0: always the median
    assert await timed_get(blocks.session, blocks.block_url) >= 0.15
    blocks.use(FaultRule(slow_fraction=1.0, slow_ms=150))
    assert await timed_get(blocks.session, blocks.block_url) >= 0.15
    blocks.use(FaultRule(slow_fraction=0.3, slow_ms=1), seed=11)
    for _ in range(50):
        await get(blocks.session, blocks.block_url)
    replay = random.Random(11)
    assert blocks.faults.injected["latency"] == 2 + sum(replay.random() < 0.3 for _ in range(50))


async def test_error_rate_gives_the_seeds_exact_count(blocks: Blocks) -> None:
    blocks.use(FaultRule(route=BLOCK_ROUTE, error_rate=0.1), seed=1234)
    statuses: Counter[int] = Counter()
    for _ in range(200):
        status, body = await get(blocks.session, blocks.block_url)
        statuses[status] += 1
        assert body == BLOCK if status == 200 else error_code(body) == "unavailable"
    replay = random.Random(1234)  # a rule with only error_rate draws once per request
    expected = sum(replay.random() < 0.1 for _ in range(200))
    assert expected == 23
    assert statuses == {503: expected, 200: 200 - expected}
    assert blocks.faults.injected["error"] == expected


async def test_error_is_unavailable_for_the_blobsdk_client(blocks: Blocks) -> None:
    blocks.use(FaultRule(route=BLOCK_ROUTE, error_rate=1.0))
    async with HttpBlockStore(blocks.session, blocks.url) as store:
        with pytest.raises(Unavailable, match="injected fault"):
            await store.read_range(blocks.block_id, 0, 10)


async def test_stall_times_out_the_client_and_the_server_still_answers(blocks: Blocks) -> None:
    blocks.use(FaultRule(route="/v1", stall_rate=1.0))
    with pytest.raises(asyncio.TimeoutError):
        await get(blocks.session, blocks.block_url, timeout=aiohttp.ClientTimeout(sock_read=0.3))
    assert (await get(blocks.session, f"{blocks.url}/healthz"))[0] == 200
    await until(lambda: blocks.faults.stalled == 0)  # the client hung up: the request is let go
    assert blocks.faults.injected["stall"] == 1


async def test_cleanup_with_stalled_requests_leaves_no_pending_tasks(tmp_path: Path) -> None:
    app = blockstore.make_app(tmp_path / "blocks", faults=FaultConfig(rules=(FaultRule(stall_rate=1.0),)))
    async with aiohttp.ClientSession() as session:
        async with running_app(app) as url:
            requests = [asyncio.create_task(get(session, f"{url}/v1/blocks")) for _ in range(3)]
            await until(lambda: app[FAULTS_KEY].stalled == 3)
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 5  # released at shutdown, not after aiohttp's 60 s
        results = await asyncio.gather(*requests, return_exceptions=True)
        assert all(isinstance(r, aiohttp.ClientConnectionError) for r in results), results  # hung up, not answered
    assert app[FAULTS_KEY].stalled == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_corrupt_flips_one_byte_of_a_streamed_body(tmp_path: Path) -> None:
    async with block_server(tmp_path, BIG) as b:
        for seed in range(4):  # flips land in different 1 MiB writes
            b.use(FaultRule(route=BLOCK_ROUTE, corrupt_rate=1.0), seed=seed)
            async with b.session.get(b.block_url) as resp:
                body = await resp.read()
                assert resp.content_length == len(BIG)
            assert differing_bytes(body, BIG) == 1
        b.use()
        assert await get(b.session, b.block_url) == (200, BIG)  # the stored block is intact
        assert b.faults.injected["corrupt"] == 4


async def test_corrupt_flips_one_byte_of_a_response_body(blocks: Blocks) -> None:
    status, clean = await get(blocks.session, f"{blocks.url}/v1/blocks")  # a msgpack web.Response
    assert status == 200
    blocks.use(FaultRule(route="/v1/blocks", corrupt_rate=1.0), seed=1)
    status, body = await get(blocks.session, f"{blocks.url}/v1/blocks")
    assert status == 200
    assert differing_bytes(body, clean) == 1


async def test_truncate_cuts_a_streamed_body(tmp_path: Path) -> None:
    async with block_server(tmp_path, BIG) as b:
        b.use(FaultRule(route=BLOCK_ROUTE, truncate_rate=1.0), seed=3)
        with pytest.raises(aiohttp.ClientPayloadError):  # noqa: PT012 - the read fails, after the headers are checked
            async with b.session.get(b.block_url) as resp:
                assert resp.content_length == len(BIG)
                await resp.read()
        out = memoryview(bytearray(len(BIG)))
        async with HttpBlockStore(b.session, b.url) as store:
            with pytest.raises(Unavailable):
                await store.read_into(b.block_id, 0, out)
        assert b.faults.injected["truncate"] == 2


async def test_corrupt_and_truncate_reach_a_block_answered_in_one_piece(blocks: Blocks) -> None:
    blocks.use(FaultRule(route=BLOCK_ROUTE, corrupt_rate=1.0), seed=1)
    async with blocks.session.get(blocks.block_url, headers={"Range": "bytes=10-9999"}) as resp:
        assert (resp.status, resp.content_length) == (206, 9990)
        assert differing_bytes(await resp.read(), BLOCK[10:10_000]) == 1
    blocks.use(FaultRule(route=BLOCK_ROUTE, truncate_rate=1.0), seed=3)
    with pytest.raises(aiohttp.ClientPayloadError):
        await get(blocks.session, blocks.block_url)
    out = memoryview(bytearray(len(BLOCK)))
    async with HttpBlockStore(blocks.session, blocks.url) as store:
        with pytest.raises(Unavailable):
            await store.read_into(blocks.block_id, 0, out)
    assert blocks.faults.injected["corrupt"] == 1 and blocks.faults.injected["truncate"] == 2


async def test_truncate_cuts_a_response_body(blocks: Blocks) -> None:
    blocks.use(FaultRule(route="/v1/blocks", methods=("GET",), truncate_rate=1.0))
    with pytest.raises(aiohttp.ClientPayloadError):
        await get(blocks.session, f"{blocks.url}/v1/blocks")
    assert blocks.faults.injected["truncate"] == 1


async def test_overload_rejects_beyond_the_queue(tmp_path: Path) -> None:
    async with block_server(tmp_path, latency_ms=300) as b:  # a slow handler: 300 ms a request
        b.use(FaultRule(route=BLOCK_ROUTE, max_in_service=1, queue_limit=0))
        first = asyncio.create_task(get(b.session, b.block_url))
        await until(lambda: sample_sum(b.app[METRICS_KEY].render().decode(), "blobsdk_blockstore_in_service_requests") == 1)
        status, body = await get(b.session, b.block_url)
        assert (status, error_code(body)) == (429, "unavailable")
        async with HttpBlockStore(b.session, b.url) as store:
            with pytest.raises(Unavailable):
                await store.read_range(b.block_id, 0, 10)
        assert await first == (200, BLOCK)
        assert b.faults.injected["overload_reject"] == 2
        assert await get(b.session, b.block_url) == (200, BLOCK)  # a free slot again


async def test_overload_slow_delays_grow_with_the_queue(tmp_path: Path) -> None:
    async with block_server(tmp_path, latency_ms=50) as b:
        b.use(FaultRule(route=BLOCK_ROUTE, max_in_service=1, overload="slow", overload_delay_ms=100))
        latencies = sorted(await asyncio.gather(*(timed_get(b.session, b.block_url) for _ in range(4))))
        # one in service, the rest wait 100 ms per place in the queue, then 50 ms each in turn
        assert all(t >= bound for t, bound in zip(latencies, (0.05, 0.15, 0.25, 0.35), strict=True)), latencies
        assert b.faults.injected["overload_slow"] == 3


# --- selection, admin, wiring -------------------------------------------------------------


async def test_rules_select_by_route_and_method(tmp_path: Path) -> None:
    config = FaultConfig(rules=(FaultRule(route="/v1/blocks", methods=("GET",), error_rate=1.0),))
    api_app = api.make_app(SqliteMetadataStore(str(tmp_path / "meta.sqlite")), faults=config)
    plans = encode(GetPlansRequest(paths=["/a/b"]))
    async with (
        aiohttp.ClientSession() as session,
        running_app(api_app) as api_url,
        session.post(f"{api_url}/v1/plans", data=plans) as resp,
    ):
        assert resp.status == 200  # not a /v1/blocks route
    async with block_server(tmp_path, faults=config) as b:  # the PUT of its block was not faulted
        assert (await get(b.session, b.block_url))[0] == 503
        assert (await get(b.session, f"{b.url}/v1/blocks"))[0] == 503
        b.use(FaultRule(route=BLOCK_ROUTE, error_rate=1.0))  # a canonical route: that route only
        assert (await get(b.session, b.block_url))[0] == 503
        assert (await get(b.session, f"{b.url}/v1/blocks"))[0] == 200


async def test_admin_endpoint_changes_faults_at_runtime(blocks: Blocks) -> None:
    admin, auth = f"{blocks.url}/admin/faults", {"Authorization": f"Bearer {ADMIN}", "Accept": JSON}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, body = await get(blocks.session, admin, headers=headers)
        assert (status, error_code(body)) == (401, "unauthorized")
    config = FaultConfig(rules=(FaultRule(route=BLOCK_ROUTE, error_rate=1.0),))
    put_json = {**auth, "Content-Type": JSON}
    async with blocks.session.put(admin, data=msgspec.json.encode(config), headers=put_json) as resp:
        assert resp.status == 200
    assert (await get(blocks.session, blocks.block_url))[0] == 503
    status, body = await get(blocks.session, admin, headers=auth)
    current = msgspec.json.decode(body, type=FaultStatus)
    assert (current.config, current.injected["error"], current.stalled) == (config, 1, 0)
    text = (await get(blocks.session, f"{blocks.url}/metrics"))[1].decode()
    assert sample_sum(text, "blobsdk_blockstore_faults_injected_total", kind="error") == 1
    async with blocks.session.put(admin, data=b'{"rules": [{"error_rate": 2}]}', headers=put_json) as resp:
        assert resp.status == 400
    async with blocks.session.delete(admin, headers=auth) as resp:
        assert msgspec.json.decode(await resp.read(), type=FaultStatus).config == FaultConfig()
    assert await get(blocks.session, blocks.block_url) == (200, BLOCK)


async def test_admin_endpoint_is_not_mounted_without_its_token(tmp_path: Path) -> None:
    app = blockstore.make_app(tmp_path / "blocks", faults=FaultConfig(rules=(FaultRule(latency_ms=1),)))
    async with aiohttp.ClientSession() as session, running_app(app) as url:
        assert (await get(session, f"{url}/admin/faults", headers={"Authorization": f"Bearer {ADMIN}"}))[0] == 404
    assert FAULTS_KEY not in blockstore.make_app(tmp_path / "blocks")  # nothing asked: no middleware


async def test_admin_token_and_data_token_are_separate(tmp_path: Path) -> None:
    app = blockstore.make_app(tmp_path / "blocks", auth=ServerAuth("data-token"), admin_token=ADMIN)
    async with aiohttp.ClientSession() as session, running_app(app) as url:
        assert (await get(session, f"{url}/admin/faults", headers={"Authorization": f"Bearer {ADMIN}"}))[0] == 200
        assert (await get(session, f"{url}/admin/faults", headers={"Authorization": "Bearer data-token"}))[0] == 401
        assert (await get(session, f"{url}/v1/blocks", headers={"Authorization": f"Bearer {ADMIN}"}))[0] == 401


async def test_flash_node_takes_faults_and_its_tenants_do_not_guard_admin(tmp_path: Path) -> None:
    config = flash.FlashConfig(
        dir=str(tmp_path / "l3"),
        block_urls=("http://127.0.0.1:9",),
        capacity_bytes=1 << 20,
    )
    faults = FaultConfig(rules=(FaultRule(route="/v1/hydrate", error_rate=1.0),))
    tenancy = Tenancy()
    tenant = {"Authorization": f"Bearer {tenancy.token('t')}"}
    async with LocalBlockStore(tmp_path / "l4") as l4, aiohttp.ClientSession() as session:
        app = flash.make_app(config, auth=tenancy.auth(), blocks=l4, faults=faults, admin_token=ADMIN)
        async with running_app(app) as url:
            async with session.post(f"{url}/v1/hydrate", json={"refs": []}, headers=tenant) as resp:
                assert resp.status == 503
            assert (await get(session, f"{url}/stats", headers=tenant))[0] == 200
            assert (await get(session, f"{url}/admin/faults", headers={"Authorization": f"Bearer {ADMIN}"}))[0] == 200


async def test_blockstore_process_takes_fault_flags_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOBSDK_FAULTS", "route=/v1/blocks;methods=DELETE;error_rate=1")
    flags = ("--fault", f"route={BLOCK_ROUTE};methods=GET;error_rate=100%", "--fault-seed", "7", "--admin-token", ADMIN)
    with server_process("servers.blockstore", "--dir", str(tmp_path / "blocks"), *flags, tmp=tmp_path) as (url, _):
        async with aiohttp.ClientSession() as session, HttpBlockStore(session, url) as store:
            block_id, auth = new_block_id(), {"Authorization": f"Bearer {ADMIN}"}
            await store.write_block(block_id, [BLOCK])
            with pytest.raises(Unavailable):
                await store.read_range(block_id, 0, len(BLOCK))
            with pytest.raises(Unavailable):
                await store.delete_block(block_id)
            status, body = await get(session, f"{url}/admin/faults", headers=auth)
            assert status == 200
            current = msgspec.msgpack.decode(body, type=FaultStatus)
            assert [r.methods for r in current.config.rules] == [("DELETE",), ("GET",)]  # env first
            assert (current.config.seed, current.injected["error"]) == (7, 2)
            async with session.delete(f"{url}/admin/faults", headers=auth) as resp:
                assert resp.status == 200
            assert await store.read_range(block_id, 0, len(BLOCK)) == BLOCK


@pytest.mark.parametrize("module", ["servers.api", "servers.blockstore"])
def test_a_bad_fault_flag_is_a_usage_error(module: str, tmp_path: Path) -> None:
    data = ["--db", str(tmp_path / "m.sqlite")] if module == "servers.api" else ["--dir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", module, *data, "--fault", "error_rate=2"], cwd=ROOT, capture_output=True, timeout=30, check=False
    )
    assert proc.returncode == 2
    assert b"fault spec" in proc.stderr


def test_cluster_passes_fault_flags_per_kind(tmp_path: Path) -> None:
    _, options = parse_args(
        [
            "--dir",
            str(tmp_path),
            "--block-faults",
            "error_rate=0.1",
            "--block-faults",
            "latency_ms=5",
            "--l3-faults",
            "stall_rate=1",
            "--admin-token",
            "A",
        ]
    )
    assert options.faults == {"block": ("error_rate=0.1", "latency_ms=5"), "l3": ("stall_rate=1",)}  # only kinds given some
    by_name = {kind.name: kind for kind in KINDS}
    assert common_args(options, by_name["block"]) == ["--admin-token=A", "--fault=error_rate=0.1", "--fault=latency_ms=5"]
    assert common_args(options, by_name["api"]) == ["--admin-token=A"]
    dashed = dataclasses.replace(options, token="-starts-with-a-dash")  # a random token can
    assert common_args(dashed, by_name["api"])[0] == "--token=-starts-with-a-dash"


async def test_cluster_block_servers_run_with_their_faults(tmp_path: Path) -> None:
    spec = f"route={BLOCK_ROUTE};methods=GET;error_rate=0.5"
    cluster = start_cluster(tmp_path, block_servers=1, l3_nodes=0, faults={"block": (spec,)}, admin_token=ADMIN, trackers=0)
    async with cluster:
        block, api_server = (next(p for p in cluster.processes if p.kind == kind) for kind in ("block", "api"))
        auth = {"Authorization": f"Bearer {ADMIN}"}
        async with aiohttp.ClientSession() as session:
            for server, rules in ((block, (parse_rule(spec),)), (api_server, ())):
                status, body = await get(session, f"{server.url}/admin/faults", headers=auth)
                assert status == 200
                assert msgspec.msgpack.decode(body, type=FaultStatus).config.rules == rules
