"""Tenants end to end (issue 9, finding 3): a metadata API, two block servers and an L3
node sharing one keyring, in this loop, used through the real client with signed tokens."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import numpy as np
import pytest
import xxhash

import blobsdk
from blobsdk.auth import GRANT_TTL_S
from blobsdk.chunks import INDEX_DIR
from blobsdk.chunks.call import Call
from blobsdk.config import ClientConfig, ReadConfig, WriteConfig
from blobsdk.errors import Forbidden, InvalidPath, Unauthorized
from blobsdk.metadata import HttpMetadataStore, SqliteMetadataStore
from blobsdk.sources import HttpBlockStore
from blobsdk.testing.reserved import reserved
from blobsdk.wire import MSGPACK, ChunkRef, CommitOp, CommitRequest, DeleteRequest, ErrorBody, ReadPlan, encode
from blobsdk.write.writer import plan_of
from servers import api, blockstore, flash
from tests.helpers import Tenancy, running_app

SERVICE = "service-secret"  # the static admin token the servers use among themselves
SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)


class Clock:
    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew


@dataclass
class Deployment:
    tenancy: Tenancy
    api_url: str
    block_urls: list[str]
    l3_url: str
    data_clock: Clock  # the block servers' and the node's clock
    api_clock: Clock  # the metadata API's (its tokens' and grants' time)

    def config(self, token: str | None, **kw: object) -> ClientConfig:
        return ClientConfig(
            api_url=self.api_url,
            block_urls=tuple(self.block_urls),
            l3_urls=(self.l3_url,),
            token=token,
            write=SMALL,
            **kw,  # type: ignore[arg-type]
        )

    def client(self, token: str | None, **kw: object) -> blobsdk.Client:
        return blobsdk.Client(self.config(token, **kw))


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[Deployment]:
    tenancy, clock, api_clock = Tenancy(), Clock(), Clock()
    async with AsyncExitStack() as stack:
        serve = stack.enter_async_context
        meta = api.make_app(SqliteMetadataStore(tmp_path / "meta.sqlite"), tenancy.auth(clock=api_clock))
        api_url = await serve(running_app(meta))
        blocks = [
            await serve(running_app(blockstore.make_app(tmp_path / f"b{i}", auth=tenancy.auth(SERVICE, clock=clock))))
            for i in range(2)
        ]
        node = flash.FlashConfig(dir=str(tmp_path / "l3"), block_urls=tuple(blocks), capacity_bytes=64 << 20, block_token=SERVICE)
        l3_url = await serve(running_app(flash.make_app(node, auth=tenancy.auth(clock=clock))))
        yield Deployment(tenancy, api_url, blocks, l3_url, clock, api_clock)


async def test_a_tenant_reads_and_writes_its_buckets_through_every_tier(deployment: Deployment) -> None:
    d = deployment
    data = os.urandom(300_000)
    async with d.client(d.tenancy.token("acme", "train")) as c:
        await c.put("/train/a.bin", data)
        assert await c.get("/train/a.bin") == data
    async with d.client(d.tenancy.token("acme", "train"), read=ReadConfig(plan_cache_ttl_seconds=0)) as c:
        assert await c.get("/train/a.bin") == data  # a cold client: served by L3 under grants
        stats = c.stats()
        assert stats["l3"]["hits"] == 5 and stats["l4"]["hits"] == 0
        assert [i.path async for i in c.list("/train/")] == ["/train/a.bin"]
        assert (await c.stat("/train/a.bin")).size == len(data)
        await c.delete("/train/a.bin")


async def test_a_tenant_cannot_touch_another_bucket(deployment: Deployment) -> None:
    d = deployment
    async with d.client(d.tenancy.token("ops", admin=True)) as admin:
        await admin.put("/eval/secret.bin", b"s" * 1000)
        await admin.put("/trainer/x.bin", b"t" * 10)  # "/train" is a string prefix of it
    async with d.client(d.tenancy.token("acme", "train")) as c:
        await c.put("/train/ok.bin", b"ok")
        message = "tenant 'acme' may not use bucket 'eval'"
        for call in (
            c.get("/eval/secret.bin"),
            c.stat("/eval/secret.bin"),
            c.put("/eval/new.bin", b"x"),
            c.delete("/eval/secret.bin"),
        ):
            with pytest.raises(Forbidden, match=message):
                await call
        with pytest.raises(Forbidden, match="may list only inside its buckets, not '/'"):
            [i async for i in c.list("/")]
        assert [i.path async for i in c.list("/train")] == ["/train/ok.bin"]  # not /trainer/x.bin
        with pytest.raises(Forbidden, match="needs an admin token"):
            await c.gc()
    async with d.client(d.tenancy.token("ops", admin=True)) as admin:
        assert await admin.get("/eval/secret.bin") == b"s" * 1000  # untouched


async def test_plans_carry_grants_for_their_tenant_and_the_store_keeps_none(deployment: Deployment) -> None:
    d = deployment
    token = d.tenancy.token("acme", "train", ttl=600)
    async with aiohttp.ClientSession() as session:
        async with d.client(token) as c:
            await c.put("/train/a.bin", os.urandom(100_000))
        store = HttpMetadataStore(session, d.api_url, token)
        plan = await store.get_plan("/train/a.bin")
        assert plan.grants_expire and all(ch.grant for ch in plan.chunks)
        assert plan.grants_expire <= d.tenancy.keyring.verify_token(token, time.time()).expires
        admin = HttpMetadataStore(session, d.api_url, d.tenancy.token("ops", admin=True))
        (stored,) = [p async for p in admin.iter_plans()]
        assert stored == plan.unsigned() and not any(ch.grant for ch in stored.chunks)
        blocks = sorted(plan.block_ids())
        assert [p async for p in admin.iter_naming(blocks)] == [stored]  # repair's reverse index: every tenant's plans
        with pytest.raises(Forbidden, match="needs an admin token"):
            await store.naming_page(blocks)


async def test_a_grant_replayed_by_another_tenant_or_for_other_bytes_is_forbidden(deployment: Deployment) -> None:
    d = deployment
    a, b = d.tenancy.token("acme", "*"), d.tenancy.token("beta", "*")
    async with d.client(a) as c:
        await c.put("/train/a.bin", os.urandom(5000))
    async with aiohttp.ClientSession() as session:
        (ref,) = (await HttpMetadataStore(session, d.api_url, a).get_plan("/train/a.bin")).chunks
        async with HttpBlockStore(session, d.block_urls[0], a) as as_a, HttpBlockStore(session, d.block_urls[0], b) as as_b:
            out = memoryview(bytearray(ref.length))
            await as_a.read_into(ref.block_id, ref.offset, out, call=Call(grant=ref.grant))
            with pytest.raises(Forbidden, match="not for tenant 'beta'"):
                await as_b.read_into(ref.block_id, ref.offset, out, call=Call(grant=ref.grant))
            with pytest.raises(Forbidden, match="not for tenant 'acme' and bytes 1\\+"):
                await as_a.read_into(ref.block_id, ref.offset + 1, out[:-1], call=Call(grant=ref.grant))
            with pytest.raises(Forbidden, match="a chunk grant"):
                await as_a.read_into(ref.block_id, ref.offset, out)
            with pytest.raises(Forbidden, match="needs an admin token"):
                [info async for info in as_a.list_blocks()]
            with pytest.raises(Forbidden, match="needs an admin token"):
                await as_a.delete_block(ref.block_id)


async def test_expired_and_not_yet_valid_tokens_are_401(deployment: Deployment) -> None:
    d = deployment
    expired = d.tenancy.token("acme", "train", ttl=60, now=time.time() - 3600)
    early = d.tenancy.token("acme", "train", ttl=600, now=time.time() + 3600)
    forged = d.tenancy.token("acme", "train")[:-4] + "AAAA"
    other_ring = Tenancy().token("acme", "train")
    for token, message in (
        (expired, "bearer token expired at"),
        (early, "bearer token is not valid before"),
        (forged, "signature does not verify"),
        (other_ring, "signature does not verify"),
        (None, "missing bearer token"),
    ):
        async with d.client(token) as c:
            with pytest.raises(Unauthorized, match=message) as caught:
                await c.get("/train/a.bin")
            assert not isinstance(caught.value, Forbidden)


async def test_expired_grants_are_refused_and_the_client_asks_for_fresh_ones(deployment: Deployment) -> None:
    d = deployment
    data = os.urandom(200_000)
    token = d.tenancy.token("acme", "train", ttl=7 * 86400)
    async with d.client(token, l1=blobsdk.L1Config(capacity_bytes=0)) as c:
        await c.put("/train/a.bin", data)
        cache = c._open.plans
        plan = await cache.get_plan("/train/a.bin")
        # A cached plan whose grants expired (a long pause, a client clock far behind): the
        # data servers refuse them, and the client fetches the plan again, once.
        stale = int(time.time()) - 100
        chunks = [d.tenancy.granted(ch, "acme", ttl=0, now=stale) for ch in plan.chunks]
        cache._plans.set("/train/a.bin", msgspec.structs.replace(plan, chunks=tuple(chunks), grants_expire=stale), float("inf"))
        assert await c.get("/train/a.bin") == data
        assert cache.peek("/train/a.bin").grants_expire > time.time()  # type: ignore[union-attr]
        # Data servers whose clock is past the expiry (plus the skew) of fresh grants too.
        d.data_clock.skew = 900 + 31
        with pytest.raises(Forbidden, match=r"chunk grant expired at .*clock skew allowed 30 s"):
            await c.get("/train/a.bin")
        d.data_clock.skew = 0
        # The plan cache drops a plan GRANT_MARGIN_S before its grants expire.
        cache._remember(msgspec.structs.replace(plan, grants_expire=int(time.time()) + 59), "/train/a.bin")
        assert cache.peek("/train/a.bin") is None
        cache._remember(msgspec.structs.replace(plan, grants_expire=int(time.time()) + 70), "/train/a.bin")
        assert cache.peek("/train/a.bin") is not None


async def test_a_selective_checkpoint_load_gets_fresh_grants_for_only_its_chunks(deployment: Deployment) -> None:
    """``load(select=...)`` reads some of the data blob's chunks; when their grants have
    expired, the retry takes fresh grants for the same chunks (before: the whole blob's plan,
    refused as "a buffer of N bytes for a blob of M")."""
    d = deployment
    token = d.tenancy.token("acme", "train", ttl=7 * 86400)
    state = {"a": np.arange(50_000, dtype=np.int64), "b": np.arange(70_000, dtype=np.float32)}
    async with d.client(token, l1=blobsdk.L1Config(capacity_bytes=0)) as c:
        await (await c.checkpoints("/train/ck").save(1, state)).wait()
        cache = c._open.plans
        path = "/train/ck/000000000001/data"
        plan = await cache.get_plan(path)
        stale = int(time.time()) - 100
        chunks = [d.tenancy.granted(ch, "acme", ttl=0, now=stale) for ch in plan.chunks]
        # Grants the data servers refuse, in a plan the cache still serves (the client thinks
        # they are good for an hour: a long pause, a clock far behind).
        expires = int(time.time()) + 3600
        cache._plans.set(path, msgspec.structs.replace(plan, chunks=tuple(chunks), grants_expire=expires), float("inf"))
        loaded = await c.checkpoints("/train/ck").load(1, select=lambda name: name == ("b",))
        assert list(loaded) == ["b"] and np.array_equal(loaded["b"], state["b"])
        assert cache.peek(path).grants_expire not in (0, expires)  # type: ignore[union-attr]  # fetched again


async def test_get_into_and_get_many_into_ask_for_fresh_grants_once(deployment: Deployment) -> None:
    """A cached plan whose grants the data servers refuse (the client thinks them good for an
    hour): get_into and get_many_into fetch the plans again, once, and read."""
    d = deployment
    token = d.tenancy.token("acme", "train", ttl=7 * 86400)
    data = {"/train/i0": os.urandom(150_000), "/train/i1": os.urandom(3000)}
    async with d.client(token, l1=blobsdk.L1Config(capacity_bytes=0)) as c:
        for path, blob in data.items():
            await c.put(path, blob)
        cache = c._open.plans

        async def spoil() -> None:
            stale, expires = int(time.time()) - 100, int(time.time()) + 3600
            for path in data:
                plan = await cache.get_plan(path)
                chunks = [d.tenancy.granted(ch, "acme", ttl=0, now=stale) for ch in plan.chunks]
                cache._plans.set(path, msgspec.structs.replace(plan, chunks=tuple(chunks), grants_expire=expires), float("inf"))

        await spoil()
        out = bytearray(150_000)
        assert await c.get_into("/train/i0", out) == 150_000 and out == data["/train/i0"]
        await spoil()
        made: list[bytearray] = []
        sizes = await c.get_many_into(list(data), lambda total: made.append(bytearray(total)) or made[-1])
        assert sizes == [150_000, 3000] and len(made) == 2  # allocated again for the second read
        assert made[-1] == data["/train/i0"] + data["/train/i1"]


async def test_a_static_service_token_is_an_admin_only_where_it_is_configured(deployment: Deployment) -> None:
    d = deployment
    async with aiohttp.ClientSession() as session:
        async with HttpBlockStore(session, d.block_urls[0], SERVICE) as svc:
            assert [i async for i in svc.list_blocks()] == []
        with pytest.raises(Unauthorized, match=r"^malformed bearer token"):
            await HttpMetadataStore(session, d.api_url, SERVICE).get_plans(["/train/a"])  # the API takes no static token here


def test_a_server_checks_the_validity_of_a_token_it_verified_before_on_every_request() -> None:
    tenancy, now = Tenancy(), [time.time()]
    auth = tenancy.auth(clock=lambda: now[0])
    token = tenancy.token("acme", "train", ttl=60, now=now[0])
    assert auth.claims_of_header(f"Bearer {token}").tenant == "acme"
    assert auth.claims_of_header(f"Bearer {token}").tenant == "acme"  # remembered
    now[0] += 60 + 30
    with pytest.raises(Unauthorized, match=r"^bearer token expired at"):
        auth.claims_of_header(f"Bearer {token}")
    with pytest.raises(Unauthorized, match=r"^bearer token signature does not verify"):
        auth.claims_of_header(f"Bearer {token[:-3]}AAA")  # a neighbour of a remembered token


async def test_a_tenant_prefetches_its_own_buckets_into_l3_under_its_grants(deployment: Deployment) -> None:
    d = deployment
    async with d.client(d.tenancy.token("ops", admin=True)) as admin:
        await admin.put("/eval/x", b"e" * 1000)
    token = d.tenancy.token("acme", "train")
    async with d.client(token) as c:
        await c.put("/train/a", os.urandom(150_000))
        handle = c.prefetch(["/train/", "/eval/x", "/eval/"], tier="l3")
        progress = await handle
        assert set(handle.failed) == {"/eval/x", "/eval/"}
        assert all(isinstance(e, Forbidden) for e in handle.failed.values())
        assert progress.chunks_done == progress.chunks_total == 3  # one node, three chunks
    async with d.client(token, l1=blobsdk.L1Config(capacity_bytes=0)) as cold:
        await cold.get("/train/a")
        assert cold.stats()["l3"]["hits"] == 3 and cold.stats()["l3"]["node_fills"] == 0


# --- the checkpoints' chunk index (blobsdk/write/dedup.py) is a bucket's, so a tenant's -----------

CHUNK = SMALL.chunk_size


def weights(seed: int, chunks: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(chunks * CHUNK // 4, dtype=np.float32)


async def index_of(client: blobsdk.Client, bucket: str) -> list[str]:
    return [info.path async for info in client.list(f"/{bucket}/{INDEX_DIR}/")]


async def test_a_tenant_neither_dedups_against_nor_reaches_another_tenants_chunk_index(deployment: Deployment) -> None:
    d = deployment
    state = {"w": weights(0)}
    acme, beta = d.tenancy.token("acme", "train"), d.tenancy.token("beta", "eval")
    async with d.client(acme) as a:
        first = await (await a.checkpoints("/train/ck").save(1, state)).wait()
        entries = await index_of(a, "train")
    assert (first.new_bytes, len(entries)) == (4 * CHUNK, 4)
    message = "tenant 'beta' may not use bucket 'train'"
    async with d.client(beta) as b:
        theirs = await (await b.checkpoints("/eval/ck").save(1, state)).wait()
        assert (theirs.new_bytes, theirs.reused_bytes) == (4 * CHUNK, 0)  # the same bytes, written again
        assert [p.removeprefix("/eval/") for p in await index_of(b, "eval")] == [p.removeprefix("/train/") for p in entries]
        for call in (b.get(entries[0]), b.stat(entries[0])):
            with pytest.raises(Forbidden, match=message):
                await call
        with pytest.raises(Forbidden, match=message):
            await index_of(b, "train")
        forged = msgspec.structs.replace(await b.plan("/eval/ck/latest"), path=entries[0])
    async with aiohttp.ClientSession() as session:
        theirs_store = HttpMetadataStore(session, d.api_url, beta)
        for call in (
            theirs_store.get_plans(entries),  # a save's lookup, for acme's digests
            theirs_store.commit_many([CommitOp(path=entries[0], plan=forged, kind="index")]),  # blobsdk's own record
            theirs_store.delete(entries[0], kind="index"),
        ):
            with pytest.raises(Forbidden, match=message):
                await call
        admin = HttpMetadataStore(session, d.api_url, d.tenancy.token("ops", admin=True))
        plans = [p async for p in admin.iter_plans()]
    named = {
        bucket: {b for p in plans if p.path.startswith(f"/{bucket}/") for b in p.block_ids()} for bucket in ("train", "eval")
    }
    assert named["train"] and named["eval"] and named["train"].isdisjoint(named["eval"])


async def test_a_second_prefix_dedups_through_the_api_and_loads_once_the_grants_it_named_expired(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks a save takes from the index come with acme's grants; none is sent back in a
    commit, none is stored, and both checkpoints load with fresh ones after they expired."""
    d = deployment
    sent: list[CommitOp] = []
    commit_many = HttpMetadataStore.commit_many

    async def spy(self: HttpMetadataStore, ops: list[CommitOp]) -> list[ReadPlan]:
        sent.extend(ops)
        return await commit_many(self, ops)

    monkeypatch.setattr(HttpMetadataStore, "commit_many", spy)
    base = {"frozen": weights(0), "head": weights(1, chunks=1)}
    tuned = {"frozen": base["frozen"], "head": weights(2, chunks=1)}  # a fine-tuning job: only its head differs
    async with d.client(d.tenancy.token("acme", "train", ttl=7 * 86400), l1=blobsdk.L1Config(capacity_bytes=0)) as c:
        await (await c.checkpoints("/train/base").save(1, base)).wait()
        manifest = await (await c.checkpoints("/train/tuned").save(1, tuned)).wait()
        assert (manifest.new_bytes, manifest.reused_bytes) == (CHUNK, 4 * CHUNK)
        assert len(await index_of(c, "train")) == 6
        assert sent and not [ref for op in sent for ref in op.plan.chunks if ref.grant]
        path = "/train/tuned/000000000001/data"
        cached = c._open.plans.peek(path) or await c._open.plans.get_plan(path)
        assert cached.grants_expire and all(ref.grant for ref in cached.chunks)
        d.data_clock.skew = 2 * GRANT_TTL_S  # every grant handed out so far has expired
        with pytest.raises(Forbidden, match=r"chunk grant expired at"):
            await c.checkpoints("/train/tuned").load()  # and so have those the API signs by its own clock
        d.api_clock.skew = d.data_clock.skew  # its clock too: fresh grants are good
        for prefix, state in (("/train/tuned", tuned), ("/train/base", base)):
            loaded = await c.checkpoints(prefix).load()
            assert loaded.keys() == state.keys() and all(np.array_equal(loaded[k], v) for k, v in state.items())
        assert c._open.plans.peek(path).grants_expire > cached.grants_expire + GRANT_TTL_S  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as session:
        admin = HttpMetadataStore(session, d.api_url, d.tenancy.token("ops", admin=True))
        stored = [p async for p in admin.iter_plans()]
    assert len(stored) == 6 + 2 * 3 and not [ref for p in stored for ref in p.chunks if ref.grant]


# --- the chunk index of a bucket two tenants share ------------------------------------------------

MiB = 1 << 20
ZERO_ENTRY = f"/ml/{INDEX_DIR}/{xxhash.xxh3_128_hexdigest(bytes(MiB))}"  # 1 MiB of zeros: a fresh optimizer moment


@pytest.mark.parametrize("forged", [False, True], ids=["its own checksum", "the zeros' checksum"])
async def test_a_tenant_cannot_poison_the_chunk_index_of_a_bucket_it_shares(deployment: Deployment, forged: bool) -> None:
    """The issue's attack across tenants: refused at put; planted through blobsdk's own kind
    of commit (the server cannot know the bytes an entry names), even with its ref's checksum
    forged to the zeros', it is not reused; an entry that is the chunk is (read with the
    victim's grants)."""
    d = deployment
    async with d.client(d.tenancy.token("mallory", "ml")) as m:
        with pytest.raises(InvalidPath) as exc:
            await m.put(ZERO_ENTRY, b"\x66" * MiB)
        assert str(exc.value) == reserved(ZERO_ENTRY, "ml")
        (poison,) = await m._open.writer.write_chunks([memoryview(b"\x66" * MiB)])
        if forged:
            poison = msgspec.structs.replace(poison, checksum=xxhash.xxh3_64_intdigest(bytes(MiB)))
        await m._open.metadata.commit_many([CommitOp(path=ZERO_ENTRY, plan=plan_of(ZERO_ENTRY, [poison]), kind="index")])
    state = {"w": weights(0), "opt": {"exp_avg": np.zeros(MiB // 4, np.float32)}}
    async with d.client(d.tenancy.token("victim", "ml")) as v:
        ck = v.checkpoints("/ml/victim", chunk_size=MiB)
        manifest = await (await ck.save(1, state)).wait()
        assert (ck.index_entries_refused, manifest.reused_bytes) == (1, 0)
        loaded = await ck.load()
        assert np.array_equal(loaded["w"], state["w"]) and loaded["opt"]["exp_avg"].tobytes() == bytes(MiB)
        into = {"opt": {"exp_avg": np.ones(MiB // 4, np.float32)}}
        assert (await ck.load(into=into))["opt"]["exp_avg"].tobytes() == bytes(MiB)
        again = v.checkpoints("/ml/victim2", chunk_size=MiB)
        manifest = await (await again.save(1, {"opt": {"exp_avg": np.zeros(MiB // 4, np.float32)}})).wait()
        assert (again.index_entries_refused, manifest.reused_bytes) == (0, MiB)  # recorded anew, checked, reused


@pytest.mark.parametrize("who", ["a bucket's tenant", "an every-bucket tenant", "an admin"])
async def test_the_api_server_refuses_every_tenants_writes_in_the_reserved_namespace(deployment: Deployment, who: str) -> None:
    """Raw requests, as a client of another build would send them: the server checks itself."""
    d = deployment
    token = {
        "a bucket's tenant": d.tenancy.token("mallory", "ml"),
        "an every-bucket tenant": d.tenancy.token("wide"),
        "an admin": d.tenancy.token("ops", admin=True),
    }[who]
    ref = ChunkRef(block_id="0" * 32, offset=0, length=MiB, raw_length=MiB, checksum=1)
    commit = CommitRequest(ops=[CommitOp(path=ZERO_ENTRY, plan=plan_of(ZERO_ENTRY, [ref]))])
    two = CommitRequest(ops=[CommitOp(path=ZERO_ENTRY, plan=plan_of(ZERO_ENTRY, [ref, ref]), kind="index")])
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}", "Content-Type": MSGPACK}) as session:
        for route, body, code, message in (
            ("/v1/commit", commit, "invalid_path", reserved(ZERO_ENTRY, "ml")),
            ("/v1/delete", DeleteRequest(path=ZERO_ENTRY), "invalid_path", reserved(ZERO_ENTRY, "ml")),
            ("/v1/commit", two, "bad_request", f"an index commit of {ZERO_ENTRY!r}: an entry's plan names one chunk, this one 2"),
        ):
            async with session.post(f"{d.api_url}{route}", data=encode(body)) as resp:
                error = msgspec.msgpack.decode(await resp.read(), type=ErrorBody)
            assert (resp.status, error.code, error.message) == (400, code, message), route
