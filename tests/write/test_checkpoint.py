"""blobsdk/write/checkpoint.py: delta checkpoints, embedded (SQLite + local blocks) and on a real
cluster, with a real process SIGKILLed mid-save."""

from __future__ import annotations

import asyncio
import math
import random
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
import pytest
import torch

import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.sources import LocalBlockStore
from blobsdk.wire import MAX_CHUNK_BYTES
from servers.cluster import start_cluster
from tests.cli.test_cli import error_line, ok, run
from tests.helpers import ROOT, gc_ahead
from tests.write.test_dedup import assert_index_sound_after_gc

CHUNK = 64 << 10
ADMIN = "admin-token-for-faults"
WRITE = WriteConfig(chunk_size=CHUNK, block_size=1 << 20)
QUICK_GC = WriteConfig(chunk_size=CHUNK, block_size=1 << 20, max_write_seconds=0.2)  # a write slower than 0.2 s is refused


def model(seed: int = 0, chunks: int = 8) -> dict[str, Any]:
    """A small nested state: float32 weights of ``chunks`` chunks, and the rest of the kinds."""
    rng = np.random.default_rng(seed)
    return {
        "model": {
            "w": rng.standard_normal(chunks * CHUNK // 4, dtype=np.float32).reshape(-1, 256),
            "b": np.arange(10, dtype=np.int8),
            "mask": np.array([True, False, True]),
            "scalar": np.float64(2.5),
            "empty": np.zeros((0, 3), dtype=np.float16),
        },
        "optim": {"t": torch.arange(12, dtype=torch.float32).reshape(3, 4), "bf": torch.ones(5, dtype=torch.bfloat16)},
        "blob": b"\x00\x01opaque",
        "step": 7,
        "lr": 0.001,
        "name": "run-1",
        "flags": [True, None, 3],
    }


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, np.ndarray | np.generic):
        assert isinstance(b, np.ndarray) and b.dtype == a.dtype and b.shape == np.shape(a)
        assert np.array_equal(b, a)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and b.dtype == a.dtype and b.shape == a.shape
        assert torch.equal(b, a)
    else:
        assert type(b) is type(a) and b == a


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    async with blobsdk.Client.local(tmp_path / "store", write=WRITE) as c:
        yield c


async def test_a_state_round_trips_exactly(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/run")
    state = model()
    pending = await ck.save(1, state)
    manifest = await pending.wait()
    assert pending.done and pending.error is None and manifest.step == 1
    assert await ck.list() == [1]
    assert_same(state, await ck.load())
    assert_same(state, await ck.load(1))
    assert client.stats()["l1"]["cache_bytes"] < CHUNK  # a restore leaves L1 to the working set


async def test_a_second_save_writes_only_the_changed_chunks(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/delta")
    state = model()
    first = await (await ck.save(1, state)).wait()
    assert first.reused_bytes == 0
    before = state["model"]["w"].copy()
    state["model"]["w"][0, 0] += 1.0  # one chunk of the 8 changes
    second = await (await ck.save(2, state)).wait()
    assert second.new_bytes == CHUNK  # the one changed chunk; the small leaves are unchanged too
    assert second.reused_bytes == first.new_bytes - CHUNK
    assert_same(state, await ck.load(2))
    assert np.array_equal((await ck.load(1))["model"]["w"], before)  # the previous one is intact


async def test_retention_keeps_the_last_k_and_gc_collects_only_what_nobody_needs(tmp_path: Path) -> None:
    async with blobsdk.Client.local(tmp_path / "store", write=WRITE) as client:
        await _retention(client)


async def _retention(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/keep", keep=2)
    state = model(chunks=4)
    states = []
    for step in range(1, 5):
        state["model"]["w"][step] += 1.0  # one more chunk changes each step
        states.append({"w": state["model"]["w"].copy()})
        await (await ck.save(step, state)).wait()
    assert await ck.list() == [3, 4]
    report = await gc_ahead(client)
    assert report.blocks_deleted >= 1  # what only steps 1 and 2 named
    for step, saved in zip((3, 4), states[2:], strict=True):
        assert np.array_equal((await ck.load(step))["model"]["w"], saved["w"])  # their reused chunks survived gc
    with pytest.raises(blobsdk.BlobNotFound, match="no checkpoint 1 under /ck/keep"):
        await ck.load(1)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"x": {1, 2}}, "state 'x': cannot checkpoint a set"),
        ({"a": {"b": np.array([object()])}}, "state 'a/b': cannot checkpoint a numpy array of dtype object"),
        ({1: 2}, "state key 1 at the root: keys must be str"),
        ({"f": float("nan")}, "state 'f': cannot checkpoint nan, a float that is not finite (JSON has no nan or inf)"),
        ({"f": float("-inf")}, "state 'f': cannot checkpoint -inf, a float that is not finite (JSON has no nan or inf)"),
        ({"t": (1, 2)}, "state 't': cannot checkpoint a tuple"),
        (
            {"l": [1, 2, object()]},
            "state 'l': cannot checkpoint the list: its item [2] is an object"
            " (a list holds JSON scalars (finite floats) or lists of them)",
        ),
        (
            {"l": [[0.5], [1.0, float("inf")]]},
            "state 'l': cannot checkpoint the list: its item [1][1] is inf, a float that is not finite (JSON has no nan or inf)",
        ),
    ],
)
async def test_an_unsupported_state_is_a_type_error_before_anything_is_staged(
    client: blobsdk.Client, state: Any, message: str
) -> None:
    ck = client.checkpoints("/ck/bad")
    with pytest.raises(TypeError) as caught:
        await ck.save(1, state)
    assert str(caught.value).startswith(message)
    assert await ck.list() == [] and [i async for i in client.list("/ck/")] == []


@pytest.mark.parametrize(
    ("keep", "error", "shown"),
    [
        (0, ValueError, "got 0"),
        (-1, ValueError, "got -1"),
        (math.nan, ValueError, "got nan"),
        (1.5, ValueError, "got 1.5"),
        (math.inf, ValueError, "got inf"),
        (True, ValueError, "got True"),
        ("3", TypeError, "not str"),
    ],
)
async def test_a_bad_keep_is_refused_before_anything_is_written(
    client: blobsdk.Client, keep: Any, error: type, shown: str
) -> None:
    """issue 20 item 7: keep=nan or 1.5 used to pass the check, commit, then raise TypeError."""
    with pytest.raises(error) as exc:
        client.checkpoints("/ck/x", keep=keep)
    assert type(exc.value) is error and str(exc.value) == f"keep must be an int >= 1, {shown}"
    assert [i async for i in client.list("/ck/")] == []


@pytest.mark.parametrize("chunk_size", [0, 1.5, math.nan, True, (64 << 20) + 1])
async def test_a_bad_chunk_size_is_refused(client: blobsdk.Client, chunk_size: Any) -> None:
    with pytest.raises(ValueError) as exc:
        client.checkpoints("/ck/x", chunk_size=chunk_size)
    assert str(exc.value) == f"chunk_size must be an int from 1 to {MAX_CHUNK_BYTES}, got {chunk_size!r}"


async def test_a_manifest_that_does_not_decode_is_corrupt_data(client: blobsdk.Client) -> None:
    """issue 20 item 7: msgspec's DecodeError (a ValueError, the CLI's usage code) never escapes."""
    ck = client.checkpoints("/ck/m")
    await (await ck.save(1, {"a": 1})).wait()
    await client.put("/ck/m/000000000001/manifest", b"\xc1")
    with pytest.raises(blobsdk.CorruptData) as exc:
        await ck.load(1)
    assert str(exc.value) == (
        "checkpoint 1 under /ck/m: its manifest does not decode: MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)"
    )


@pytest.mark.parametrize(
    ("leaf", "dtype", "shape", "message"),
    [
        ("t", "load", None, "checkpoint leaf 't': 'load' is not a torch dtype"),
        ("t", "__class__", None, "checkpoint leaf 't': '__class__' is not a torch dtype"),
        ("t", "float32.__class__", None, "checkpoint leaf 't': 'float32.__class__' is not a torch dtype"),
        ("t", None, (3, 3), "checkpoint leaf 't': shape [3, 3] does not hold its 32 bytes"),
        ("a", "|O", None, "checkpoint leaf 'a': '|O' is not a plain numpy dtype"),
        ("a", "no-such-dtype", None, "checkpoint leaf 'a': 'no-such-dtype' is not a plain numpy dtype"),
        ("a", None, (-1,), "checkpoint leaf 'a': shape [-1] does not hold its 24 bytes"),
    ],
)
async def test_a_stored_dtype_or_shape_is_checked_before_use(
    client: blobsdk.Client, leaf: str, dtype: str | None, shape: tuple[int, ...] | None, message: str
) -> None:
    """The dtype name and shape come from stored data: only a dtype is ever looked up by that
    name, and a shape must hold exactly the leaf's bytes."""
    from blobsdk.write.manifest import Manifest

    ck = client.checkpoints("/ck/d")
    await (await ck.save(1, {"t": torch.arange(8, dtype=torch.float32), "a": np.arange(3, dtype=np.int64)})).wait()
    path = "/ck/d/000000000001/manifest"
    manifest = msgspec.msgpack.decode(await client.get(path), type=Manifest)
    entries = tuple(
        msgspec.structs.replace(e, dtype=dtype or e.dtype, shape=shape or e.shape) if e.name == (leaf,) else e
        for e in manifest.entries
    )
    await client.put(path, msgspec.msgpack.encode(msgspec.structs.replace(manifest, entries=entries)))
    with pytest.raises(blobsdk.CorruptData) as exc:
        await ck.load(1)
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"step": 7}, "checkpoint 1 under /ck/e: its manifest is of step 7"),
        ({"name": ()}, "checkpoint 1 under /ck/e: its manifest has a leaf with no name"),
        ({"name": ("j", "x")}, "checkpoint 1 under /ck/e: its manifest names leaf 'j/x' twice"),
        ({"name": ("j",)}, "checkpoint 1 under /ck/e: its manifest names leaf 'j' and a leaf inside it, 'j/x'"),
        ({"nbytes": 10**15}, "checkpoint 1 under /ck/e leaf 'a': its manifest lists 1 digests for 15258789063 chunks"),
        ({"nbytes": -1}, "checkpoint 1 under /ck/e leaf 'a': its manifest says nbytes -1, first 0"),
        ({"first": -1}, "checkpoint 1 under /ck/e leaf 'a': its manifest says nbytes 24, first -1"),
        (
            {"extents": (-1, 2)},
            "checkpoint 1 under /ck/e leaf 'a': its manifest's extents (-1, 2) or patches () are not one count per chunk",
        ),
        (
            {"patches": (-1,)},
            "checkpoint 1 under /ck/e leaf 'a': its manifest's extents () or patches (-1,) are not one count per chunk",
        ),
        ({"kind": "json"}, "checkpoint 1 under /ck/e leaf 'a': its JSON value does not decode: Input data was truncated"),
    ],
)
async def test_a_manifest_another_writer_edited_is_corrupt_data_before_anything_is_allocated(
    client: blobsdk.Client, edit: dict[str, Any], message: str
) -> None:
    """A manifest that decodes is still another writer's data: whatever its fields say, a load
    is CorruptData naming what is wrong (it was an IndexError, a ValueError, msgspec's
    DecodeError, or an allocation of a petabyte), and the step is the one asked for."""
    from blobsdk.write.manifest import Manifest

    ck = client.checkpoints("/ck/e")
    await (await ck.save(1, {"a": np.arange(3, dtype=np.int64), "j": {"x": 1}})).wait()
    path = "/ck/e/000000000001/manifest"
    manifest = msgspec.msgpack.decode(await client.get(path), type=Manifest)
    if "step" in edit:
        manifest = msgspec.structs.replace(manifest, **edit)
    else:
        entries = tuple(msgspec.structs.replace(e, **edit) if e.name == ("a",) else e for e in manifest.entries)
        manifest = msgspec.structs.replace(manifest, entries=entries)
    await client.put(path, msgspec.msgpack.encode(manifest))
    with pytest.raises(blobsdk.CorruptData) as exc:
        await ck.load(1)
    assert str(exc.value) == message


@pytest.mark.parametrize("latest", [b"abc", b"\xff", b"", b"-5", b"1_0"])
async def test_a_latest_pointer_another_writer_edited_is_corrupt_data_at_load_and_save(
    client: blobsdk.Client, latest: bytes
) -> None:
    """``latest`` is a blob of the prefix: what is not a step's digits is CorruptData naming it
    (it was int()'s ValueError, the CLI's usage code, at every load and every save after)."""
    ck = client.checkpoints("/ck/l")
    await (await ck.save(1, {"a": 1})).wait()
    await client.put("/ck/l/latest", latest)
    message = f"checkpoint pointer /ck/l/latest holds {latest!r}, not a step"
    for attempt in (ck.load, lambda: ck.save(2, {"a": 2})):
        with pytest.raises(blobsdk.CorruptData) as exc:
            await attempt()
        assert str(exc.value) == message


async def test_bad_arguments_are_refused(client: blobsdk.Client) -> None:
    with pytest.raises(blobsdk.InvalidPath):
        client.checkpoints("no-slash")
    ck = client.checkpoints("/ck/x")
    for step in (-1, 1.5, True):
        with pytest.raises(ValueError, match="step must be an int from 0 to 999999999999"):
            await ck.save(step, {})  # type: ignore[arg-type]
    await (await ck.save(1, {"a": 1})).wait()
    with pytest.raises(blobsdk.PreconditionFailed, match="checkpoint 1 under /ck/x: the step exists"):
        await (await ck.save(1, {"a": 2})).wait()
    assert (await ck.load())["a"] == 1
    with pytest.raises(blobsdk.BlobNotFound, match="no checkpoint under /ck/none"):
        await client.checkpoints("/ck/none").load()


async def test_saves_run_one_at_a_time_and_the_client_waits_for_the_last(tmp_path: Path) -> None:
    async with blobsdk.Client.local(tmp_path / "s", write=WRITE) as c:
        ck = c.checkpoints("/ck/seq", keep=5)
        first = await ck.save(1, model(1))
        second = await ck.save(2, model(2))  # waits for the first to end before it stages
        assert first.done
        third = await ck.save(3, model(3))
        assert second.done and not third.done  # still uploading when the client closes
    async with blobsdk.Client.local(tmp_path / "s", write=WRITE) as c:
        ck = c.checkpoints("/ck/seq", keep=5)
        assert await ck.list() == [1, 2, 3]
        assert_same(model(3), await ck.load())


async def test_with_l4_down_the_save_fails_visibly_and_the_last_checkpoint_stays(tmp_path: Path) -> None:
    async with start_cluster(tmp_path / "c", block_servers=1, l3_nodes=0, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=WRITE)
        async with blobsdk.Client(config) as c:
            ck = c.checkpoints("/ck/down")
            state = model()
            await (await ck.save(1, state)).wait()
            (block,) = (p for p in cluster.processes if p.kind == "block")
            block.popen.kill()
            block.popen.wait()
            state["model"]["w"][0, 0] += 1.0
            pending = await ck.save(2, state)  # staging needs no server: training goes on
            with pytest.raises(blobsdk.Unavailable):
                await pending.wait()
            assert isinstance(pending.error, blobsdk.Unavailable)
            assert await ck.list() == [1] and (await ck.manifest()).step == 1


async def test_while_l4_refuses_writes_saves_fail_and_the_next_one_after_it_recovers_succeeds(tmp_path: Path) -> None:
    async with start_cluster(tmp_path / "c", block_servers=1, l3_nodes=0, admin_token=ADMIN, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=WRITE)
        (block,) = (p.url for p in cluster.processes if p.kind == "block")
        async with blobsdk.Client(config) as c, aiohttp.ClientSession() as admin:
            ck = c.checkpoints("/ck/flaky")
            state = model()
            await (await ck.save(1, state)).wait()
            await set_faults(admin, block, [{"route": "/v1/blocks", "methods": ["PUT"], "error_rate": 1.0}])
            state["model"]["w"][0, 0] += 1.0
            failed = await ck.save(2, state)
            with pytest.raises(blobsdk.Unavailable):
                await failed.wait()
            assert await ck.list() == [1]
            await set_faults(admin, block, [])  # L4 is back
            again = await (await ck.save(2, state)).wait()  # the same step: nothing of the failed one was committed
            assert again.new_bytes == CHUNK and await ck.list() == [1, 2]
            assert_same(state, await ck.load())


async def set_faults(session: aiohttp.ClientSession, server: str, rules: list[dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with session.put(f"{server}/admin/faults", json={"rules": rules, "seed": 1}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()


SAVER = """
import asyncio, sys
import numpy as np
import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.wire import MAX_CHUNK_BYTES

async def main():
    async with blobsdk.Client.local(sys.argv[1], write=WriteConfig(chunk_size=65536, block_size=1 << 20)) as c:
        ck = c.checkpoints("/ck/crash", keep=3)
        rng = np.random.default_rng(0)
        state = {"w": rng.standard_normal(1 << 20, dtype=np.float32)}
        await (await ck.save(1, state)).wait()
        print("saved", flush=True)
        for step in range(2, 1000):
            state["w"][::4096] += 1.0  # every chunk changes: each save writes 4 MiB
            await (await ck.save(step, state)).wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("seed", range(6))
async def test_a_process_killed_mid_save_leaves_the_last_checkpoint_whole(tmp_path: Path, seed: int) -> None:
    """Killed at a random moment of its saves (a 4 MiB save takes ~30-60 ms here: staging,
    upload and commit are each hit by some of the seeds)."""
    delay = random.Random(seed).uniform(0.0, 0.4)
    store = tmp_path / "store"
    saver = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SAVER, str(store), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert saver.stdout is not None
    assert await asyncio.wait_for(saver.stdout.readline(), 60) == b"saved\n"
    await asyncio.sleep(delay)
    saver.send_signal(signal.SIGKILL)
    await saver.wait()
    async with blobsdk.Client.local(store, write=WRITE) as c:
        ck = c.checkpoints("/ck/crash", keep=3)
        steps = await ck.list()
        assert steps and steps[0] >= 1
        latest = await ck.load()
        expected = np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32)
        for _ in range(steps[-1] - 1):
            expected[::4096] += 1.0  # the state of exactly that step, whole
        assert np.array_equal(latest["w"], expected)
        for step in steps:
            await ck.load(step)  # every kept one loads: none is partial
        await gc_ahead(c)  # the interrupted save's blocks are orphans now
        assert np.array_equal((await ck.load())["w"], expected)
        left = await gc_ahead(c, dry_run=True)
        assert left.blocks_scanned == left.blocks_referenced  # every orphan is gone
        # The chunk index: each entry sound and naming only blocks a checkpoint names (the
        # retired ones' were swept); every chunk of every kept checkpoint but the latest (whose
        # record the kill may have cut short) has its entry.
        entries = {path.rsplit("/", 1)[1] for path in await assert_index_sound_after_gc(c, "ck")}
        older = [await ck.manifest(step) for step in steps[:-1]]
        assert {d.hex() for m in older for e in m.entries for d in e.digests} <= entries


# --- remove, and the command line -----------------------------------------------------------------


async def test_removing_the_latest_moves_latest_back(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/rm", keep=5)
    for step in (1, 2, 3):
        await (await ck.save(step, {"v": step})).wait()
    await ck.remove(3)
    assert await ck.list() == [1, 2] and (await ck.load())["v"] == 2
    await ck.remove(1)
    assert await ck.list() == [2] and (await ck.load())["v"] == 2
    with pytest.raises(blobsdk.BlobNotFound, match="no checkpoint 1 under /ck/rm"):
        await ck.remove(1)
    await ck.remove(2)
    assert await ck.list() == []
    with pytest.raises(blobsdk.BlobNotFound, match="no checkpoint under /ck/rm"):
        await ck.load()
    await (await ck.save(4, {"v": 4})).wait()  # a fresh start
    assert (await ck.load())["v"] == 4


def test_the_cli_lists_shows_and_removes_checkpoints(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with blobsdk.SyncClient.local(store, write=WRITE) as c:
        ck = c.checkpoints("/ck/cli")
        state = model()
        ck.save(1, state).wait()
        state["model"]["w"][0, 0] += 1.0
        ck.save(2, state).wait()
        assert ck.list() == [1, 2]
    listing = ok("ckpt", "ls", "/ck/cli", store=store).decode().splitlines()
    assert [line.split()[0] for line in listing] == ["1", "2"]
    assert f"{CHUNK:>14} new" in listing[1]  # the one changed chunk
    shown = ok("ckpt", "show", "/ck/cli", "2", store=store).decode()
    assert f"model/w  ndarray <f4 [512, 256]  {8 * CHUNK} bytes, {CHUNK} new" in shown
    assert "optim/bf  tensor bfloat16 [5]  10 bytes, 0 new" in shown
    assert "flags  json  [true,null,3]" in shown
    ok("ckpt", "rm", "/ck/cli", "1", store=store)
    assert ok("ckpt", "ls", "/ck/cli", store=store).decode().split()[0] == "2"
    missing = run("ckpt", "show", "/ck/cli", "7", store=store)
    assert missing.returncode == 1 and error_line(missing) == "blobsdk: error: no checkpoint 7 under /ck/cli"
    bad = run("ckpt", "rm", "/ck/cli", "-3", store=store)
    assert bad.returncode == 2 and "must be >= 0, got -3" in bad.stderr.decode()


def flip_a_byte(blocks: Path, at: int) -> None:
    """Flip one byte of the biggest block file under ``blocks``."""
    (biggest,) = sorted((p for p in blocks.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)[-1:]
    data = bytearray(biggest.read_bytes())
    data[at] ^= 0xFF
    biggest.write_bytes(data)


async def test_a_corrupted_chunk_is_never_loaded_as_a_tensor(tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with blobsdk.Client.local(store, write=WriteConfig(chunk_size=CHUNK, compression="none")) as c:
        await (await c.checkpoints("/ck/rot").save(1, {"w": np.ones(4 * CHUNK // 4, dtype=np.float32)})).wait()
    flip_a_byte(store / "blocks", at=100)  # in the first chunk of the weights
    async with blobsdk.Client.local(store) as c:
        with pytest.raises(blobsdk.CorruptData, match="no replica returned bytes matching its checksum"):
            await c.checkpoints("/ck/rot").load()


async def test_with_l3_nodes_a_committed_checkpoint_is_warmed_into_flash(tmp_path: Path) -> None:
    async with start_cluster(tmp_path / "c", block_servers=1, l3_nodes=1, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=WRITE)
        state = model()
        async with blobsdk.Client(config) as c:
            manifest = await (await c.checkpoints("/ck/warm").save(1, state)).wait()
            for _ in range(100):  # the L3 prefetch runs in the background
                (node,) = (await c.node_stats())["l3"].values()
                if node["jobs"]["running"] == 0 and node["jobs"]["kept"] >= 1:  # type: ignore[index]
                    break
                await asyncio.sleep(0.05)
        async with blobsdk.Client(config) as fresh:  # L1 empty: a restore
            assert_same(state, await fresh.checkpoints("/ck/warm").load())
            stats = fresh.stats()
        chunks = sum(len(e.digests) for e in manifest.entries)
        assert stats["l3"]["node_hits"] >= chunks and stats["l4"]["hits"] == 0  # the data from flash


# --- parts: how the ranks of a distributed save write, and the coordinator commits ---------------


async def test_parts_written_apart_commit_as_one_checkpoint(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/parts")
    a, b = model(1), {"other": np.arange(CHUNK, dtype=np.uint8), "n": 5}
    parts = [await ck.write_part(a), await ck.write_part(b)]
    assert await ck.list() == []  # written, nothing committed
    manifest = await ck.commit(4, parts)
    assert manifest.step == 4 and await ck.list() == [4]
    assert_same({**a, **b}, await ck.load())
    again = await ck.commit(5, [await ck.write_part(a), await ck.write_part(b)])
    assert again.new_bytes == 0 and again.reused_bytes == manifest.new_bytes  # compared with checkpoint 4
    only = await ck.load(select=lambda name: name[0] == "other")
    assert list(only) == ["other"] and np.array_equal(only["other"], b["other"])


async def test_a_part_compared_with_an_older_latest_is_refused(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/stale")
    stale = await ck.write_part(model())
    await (await ck.save(1, model(2))).wait()  # latest moved since the part was written
    with pytest.raises(blobsdk.PreconditionFailed, match=r"^checkpoint 2 under /ck/stale: a part was compared with version"):
        await ck.commit(2, [stale])
    assert await ck.list() == [1]


async def test_parts_that_repeat_an_entry_are_refused(client: blobsdk.Client) -> None:
    ck = client.checkpoints("/ck/twice")
    parts = [await ck.write_part({"w": b"one"}), await ck.write_part({"w": b"two"})]
    with pytest.raises(ValueError, match=r"^checkpoint 1: entry 'w' is in more than one part$"):
        await ck.commit(1, parts)
    with pytest.raises(ValueError, match=r"^a part cut in 65536-byte chunks, this prefix's are 4096$"):
        await client.checkpoints("/ck/twice", chunk_size=4096).commit(1, parts[:1])
    assert await ck.list() == []


async def test_a_part_never_committed_leaves_only_orphans_for_gc(tmp_path: Path) -> None:
    async with blobsdk.Client.local(tmp_path / "store", write=WRITE) as c:
        ck = c.checkpoints("/ck/orphan")
        await (await ck.save(1, model())).wait()
        await ck.write_part(model(5))  # a rank that died before the coordinator committed
        report = await gc_ahead(c)
        assert report.blocks_deleted >= 1 and await ck.list() == [1]
        assert_same(model(), await ck.load())


class RaceBeforeCommit(SqliteMetadataStore):
    """Runs ``race`` once, just before the first commit that moves ``latest``: another
    writer saving between this save's read of ``latest`` and its commit."""

    race: Any = None

    async def commit_many(self, ops):
        if self.race is not None and any(op.path.endswith("/latest") for op in ops):
            race, self.race = self.race, None
            await race()
        return await super().commit_many(ops)


async def test_two_writers_racing_on_latest_one_is_refused(tmp_path):
    """The compare-and-swap on ``latest``: a save whose base moved under it is refused, so
    the other writer's checkpoint is never silently replaced as latest."""
    async with (
        RaceBeforeCommit(tmp_path / "meta.sqlite") as meta,
        LocalBlockStore(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=WRITE) as a,
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta_b,
        blobsdk.Client.from_stores(meta_b, blocks, write=WRITE) as b,
    ):
        mine = a.checkpoints("/b/ck")
        await (await mine.save(1, {"w": b"1" * 1000})).wait()
        theirs = b.checkpoints("/b/ck")

        async def other_writer_saves():
            await (await theirs.save(2, {"w": b"2" * 1000})).wait()

        meta.race = other_writer_saves
        with pytest.raises(
            blobsdk.PreconditionFailed, match="checkpoint 3 under /b/ck: the step exists, or another writer saved"
        ):
            await (await mine.save(3, {"w": b"3" * 1000})).wait()
        assert await theirs.list() == [1, 2]
        assert (await theirs.load())["w"] == b"2" * 1000


class SlowL4(LocalBlockStore):
    """Block writes that take longer than the writer's max_write_seconds."""

    async def write_block(self, block_id, parts):
        await asyncio.sleep(0.3)
        await super().write_block(block_id, parts)


async def test_a_save_slower_than_max_write_seconds_is_not_committed(tmp_path):
    """gc's safety rule on the checkpoint path: a commit naming blocks written longer than
    ``max_write_seconds`` ago is refused, so gc (grace > max_write_seconds) never races it."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        SlowL4(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=QUICK_GC) as c,
    ):
        ck = c.checkpoints("/b/ck")
        pending = await ck.save(1, {"w": b"1" * 100_000})
        with pytest.raises(blobsdk.Unavailable, match=r"^write took [\d.]+s, over max_write_seconds=0\.2; not committed"):
            await pending.wait()
        assert await ck.list() == []
