"""servers/flashsend.py: zero-copy hits of verified cache files, and a bad copy reported."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import msgspec
import pytest

from blobsdk.cache import PayloadFile
from blobsdk.chunks import rank
from blobsdk.config import HedgeConfig, L3Config
from blobsdk.tail.health import Reason
from blobsdk.tiers import L3Tier
from blobsdk.wire import CACHE_HEADER, ChunkRef, chunk_query
from servers._common.faults import FaultConfig, FaultRule
from servers.flash import FLASH_NODE, FlashConfig, FlashNode, make_app
from tests.helpers import auth_headers, running_app
from tests.servers.test_flash import ADMIN, TOK_A, Env, chunks, code_of, for_a, for_b, tenant_node
from tests.servers.test_short_bodies import GUARD, LONG, PATIENT, answer, asking, head_of, until_closed
from tests.tiers.test_l3 import flash_nodes
from tests.tiers.test_l4 import decode


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        yield Env(tmp_path, session, stack)


def entry_file(node: FlashNode, ref: ChunkRef) -> Path:
    return node.cache.root / ref.key[:2] / ref.key


def rot(path: Path, *, keep_mtime: bool) -> None:
    """Flip the file's last byte (its payload's) in place; with ``keep_mtime`` the file looks
    untouched (same inode, size and mtime): bit rot of the medium."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


async def report(env: Env, url: str, ref: ChunkRef, token: str | None = None) -> tuple[int, bytes]:
    route = f"{url}/v1/chunks/{ref.key}/bad?{chunk_query(ref)}"
    async with env.session.post(route, headers=auth_headers(token, ref)) as resp:
        return resp.status, await resp.read()


async def test_hits_after_the_first_send_the_verified_file_unread(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, node = await env.node()
    status, _, good = await env.get(url, ref)  # the fill
    assert (await env.get(url, ref))[:3] == (200, "hit", good)  # read and verified
    rot(entry_file(node, ref), keep_mtime=True)
    status, source, body = await env.get(url, ref)  # sent as verified: the rot goes out
    assert (status, source, len(body)) == (200, "hit", len(good)) and body != good
    assert body[:-1] == good[:-1] and body[-1] == good[-1] ^ 0xFF
    assert (await report(env, url, ref)) == (200, b'{"dropped": true}')
    assert not node.cache.contains(ref.key) and not entry_file(node, ref).exists()
    assert node.cache.stats()["corrupt"] == 1
    assert (await env.get(url, ref))[:3] == (200, "miss", good)  # read through again
    assert (await env.get(url, ref))[:3] == (200, "hit", good)


async def test_a_file_changed_since_its_verification_is_verified_again(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, node = await env.node()
    _, _, good = await env.get(url, ref)
    assert (await env.get(url, ref))[:3] == (200, "hit", good)
    rot(entry_file(node, ref), keep_mtime=False)  # a new mtime: not the file verified
    assert (await env.get(url, ref))[:3] == (200, "miss", good)  # caught, deleted, read through
    assert node.cache.stats()["corrupt"] == 1
    assert (await env.get(url, ref))[:3] == (200, "hit", good)


async def test_a_node_verifies_its_files_again_after_a_restart(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    stack = AsyncExitStack()
    url, node = await env.node(stack=stack)
    _, _, good = await env.get(url, ref)
    assert (await env.get(url, ref))[:3] == (200, "hit", good)
    rot(entry_file(node, ref), keep_mtime=True)
    await stack.aclose()
    url, node = await env.node()  # the same directory: the rotted file is indexed by its header
    assert node.cache.contains(ref.key)
    assert (await env.get(url, ref))[:3] == (200, "miss", good)
    assert node.cache.stats()["corrupt"] == 1


async def test_a_report_of_a_good_copy_keeps_it(env: Env) -> None:
    (ref, absent) = await chunks(env, 2)
    url, node = await env.node()
    _, _, good = await env.get(url, ref)
    assert (await report(env, url, ref)) == (200, b'{"dropped": false}')
    assert (await report(env, url, absent)) == (200, b'{"dropped": false}')
    assert node.cache.contains(ref.key) and node.cache.stats()["corrupt"] == 0
    assert (await env.get(url, ref))[:3] == (200, "hit", good)


async def test_a_report_needs_the_grant_a_get_needs(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    url, _ = await tenant_node(env)
    assert (await env.get(url, for_a(ref), TOK_A))[:2] == (200, "miss")
    status, body = await report(env, url, for_b(ref), TOK_A)
    assert (status, code_of(body)) == (403, "forbidden")
    assert (await report(env, url, for_a(ref), TOK_A)) == (200, b'{"dropped": false}')
    status, body = await report(env, url, ref, None)
    assert (status, code_of(body)) == (401, "unauthorized")
    assert (await report(env, url, ref, ADMIN)) == (200, b'{"dropped": false}')


async def test_injected_corruption_still_damages_a_zero_copy_hit(env: Env) -> None:
    (ref,) = await chunks(env, 1)
    rule = FaultRule(route="/v1/chunks", methods=("GET",), corrupt_rate=1.0)
    cfg = FlashConfig(dir=str(env.tmp / "faulty"), block_urls=tuple(env.urls), capacity_bytes=1 << 20)
    app = make_app(cfg, faults=FaultConfig(rules=(rule,), seed=1), admin_token="adm")
    url = await env.stack.enter_async_context(running_app(app))
    node = app[FLASH_NODE]
    bodies = [(await env.get(url, ref))[1:] for _ in range(3)]  # the fill, the verifying read, a sendfile
    assert [source for source, _ in bodies] == ["miss", "hit", "hit"]
    good = await node.cache.get(ref.key)
    assert good is not None
    for _, body in bodies:
        assert len(body) == len(good) and sum(a != b for a, b in zip(body, good, strict=True)) == 1


async def test_the_client_gets_good_bytes_and_the_rotted_copy_is_dropped(env: Env) -> None:
    await env.start(2)
    (ref,) = await chunks(env, 1)
    nodes = await flash_nodes(env, 2)
    tier = L3Tier(env.session, list(nodes), L3Config(replicas=2), hedge=HedgeConfig(enabled=False))
    first_url = rank(ref.key, list(nodes))[0]
    first, _ = nodes[first_url]
    good = bytes(await tier.fetch(ref, decode) or b"")  # the first node fills
    assert bytes(await tier.fetch(ref, decode) or b"") == good  # and verifies its file
    rot(entry_file(first, ref), keep_mtime=True)
    assert bytes(await tier.fetch(ref, decode) or b"") == good  # from the second node
    assert (tier.stats.corrupt, tier.bad_copies_reported) == (1, 1)
    assert not first.cache.contains(ref.key) and first.cache.stats()["corrupt"] == 1
    assert bytes(await tier.fetch(ref, decode) or b"") == good  # the first node reads it through again
    assert first.cache.contains(ref.key) and tier.extra_stats()["node_fills"] == 3
    assert msgspec.json.decode((await report(env, first_url, ref))[1]) == {"dropped": False}


async def test_a_client_that_hangs_up_mid_send_is_no_error(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    (ref,) = await chunks(env, 1, size=32 << 20)  # more than the sockets' buffers hold
    url, node = await env.node()
    _, _, good = await env.get(url, ref)
    assert (await env.get(url, ref))[:2] == (200, "hit")
    host, port = url.removeprefix("http://").split(":")
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /v1/chunks/{ref.key}?{chunk_query(ref)} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
        assert (await reader.readexactly(9)) == b"HTTP/1.1 "
        await reader.readexactly(1 << 20)  # in the middle of the body
        writer.transport.abort()
    for _ in range(500):  # the node notices when its next send fails
        if node.counters.hits == 3:
            break
        await asyncio.sleep(0.01)
    assert node.counters.hits == 3 and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (await env.get(url, ref))[:3] == (200, "hit", good)


# --- a file that shrinks under the send -------------------------------------------------------
# The nodes below never close an idle connection on their own (PATIENT), and the client's read
# timeout and hang deadline are far beyond GUARD: on code that leaves a short hit's connection
# open, the reads below wait past GUARD and the test fails.

EIGHT_MIB, KEPT = 8 << 20, 4_833_241  # what a node sent of a declared 8,388,608 bytes, then kept the connection open
CORRUPTING = FaultConfig(rules=(FaultRule(route="/v1/chunks", methods=("GET",), corrupt_rate=1.0),), seed=1)


async def patient_node(env: Env, name: str = "flash", faults: FaultConfig | None = None) -> tuple[str, FlashNode]:
    cfg = FlashConfig(dir=str(env.tmp / name), block_urls=tuple(env.urls), capacity_bytes=64 << 20)
    app = make_app(cfg, faults=faults, admin_token=None if faults is None else "adm")
    url = await env.stack.enter_async_context(running_app(app, PATIENT))
    return url, app[FLASH_NODE]


def shrink_under_the_send(monkeypatch: pytest.MonkeyPatch, node: FlashNode, ref: ChunkRef, keep: int) -> None:
    """From now on, the node's verified file of ``ref`` is cut to ``keep`` payload bytes as
    soon as the node has opened it to send it."""
    opened = node.cache.open_verified

    async def open_then_shrink(key: str) -> PayloadFile | None:
        payload = await opened(key)
        if payload is not None and key == ref.key:
            os.truncate(entry_file(node, ref), payload.offset + keep)
        return payload

    monkeypatch.setattr(node.cache, "open_verified", open_then_shrink)


@pytest.mark.parametrize("faults", [None, CORRUPTING], ids=["sendfile", "written-through-faults"])
async def test_a_hit_whose_file_shrinks_mid_send_ends_its_connection(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, faults: FaultConfig | None
) -> None:
    (ref,) = await chunks(env, 1, size=EIGHT_MIB)
    url, node = await patient_node(env, faults=faults)
    assert (await env.get(url, ref))[:2] == (200, "miss")  # the fill
    good = await node.cache.get(ref.key)  # read and verified: the next hit is sent zero-copy
    assert good is not None
    shrink_under_the_send(monkeypatch, node, ref, KEPT)
    caplog.set_level(logging.WARNING, logger="servers.flashsend")
    async with asking(int(url.rsplit(":", 1)[1]), f"/v1/chunks/{ref.key}?{chunk_query(ref)}") as reader:
        status, headers = await head_of(reader)
        assert (status, headers["content-length"], headers[CACHE_HEADER.lower()]) == (200, str(EIGHT_MIB), "hit")
        body = await until_closed(reader)
    if faults is None:  # sendfile: every byte sent is in the socket by the time the connection is ended
        assert body == bytes(good[:KEPT])
    else:  # written in pieces: what the transport still held is dropped with the connection
        assert len(body) <= KEPT and sum(a != b for a, b in zip(body, bytes(good[: len(body)]), strict=True)) <= 1
    assert [r.getMessage() for r in caplog.records] == [
        f"chunk {ref.key}: sent {KEPT} of its {EIGHT_MIB} bytes: the file shrank under the send; closed the connection"
    ]
    status, source, _ = await env.get(url, ref)  # the short file is verified again, dropped, read through
    assert (status, source) == (200, "miss") and node.cache.stats()["corrupt"] == 1


async def test_zero_copy_hits_keep_their_connection(env: Env) -> None:
    (ref,) = await chunks(env, 1, size=EIGHT_MIB)
    url, node = await patient_node(env)
    _, _, good = await env.get(url, ref)
    assert (await env.get(url, ref))[:3] == (200, "hit", good)  # verified: the hits below are sent with sendfile
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    for _ in range(3):
        writer.write(f"GET /v1/chunks/{ref.key}?{chunk_query(ref)} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
        assert await answer(reader) == (200, good)
    writer.close()
    await writer.wait_closed()
    assert node.counters.hits == 4


async def test_the_client_fails_a_short_hit_over_at_once(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    await env.start(2)
    (ref,) = await chunks(env, 1, size=EIGHT_MIB)
    nodes = dict([await patient_node(env, f"flash{i}") for i in range(2)])
    hedge = HedgeConfig(enabled=False, hang_min_ms=100_000, hang_max_ms=100_000)
    timeout = aiohttp.ClientTimeout(total=LONG, sock_read=LONG)
    tier = L3Tier(env.session, list(nodes), L3Config(replicas=2), hedge=hedge, timeout=timeout)
    env.stack.push_async_callback(tier.aclose)
    first_url = rank(ref.key, list(nodes))[0]
    good = bytes(await tier.fetch(ref, decode) or b"")  # the first node fills
    assert bytes(await tier.fetch(ref, decode) or b"") == good  # and verifies its file
    shrink_under_the_send(monkeypatch, nodes[first_url], ref, KEPT)
    assert bytes(await asyncio.wait_for(tier.fetch(ref, decode), GUARD) or b"") == good  # from the second node
    assert tier.stats.errors == 1 and tier.health.has(first_url, Reason.DOWN)
    assert tier.extra_stats()["node_fills"] == 2
