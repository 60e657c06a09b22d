import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pytest

import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.errors import BadRequest, BlockCollected, Unavailable
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.ops import collect_garbage
from blobsdk.sources import LocalBlockStore
from blobsdk.wire import ReadPlan, etag_of
from blobsdk.write.writer import Writer
from tests.helpers import ROOT, gc_ahead, stored_files

FAST = WriteConfig(chunk_size=64 << 10, block_size=256 << 10, max_write_seconds=0.2)
ROOMY = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)  # a slow put on a busy machine is not refused


def block_files(root):
    return stored_files(root / "blocks")


async def test_gc_collects_only_unreferenced_old_blocks(tmp_path):
    async with blobsdk.Client.local(tmp_path, write=ROOMY) as c:
        await c.put("/b/keep", b"k" * 300_000)
        await c.put("/b/gone", b"g" * 300_000)
        await c.put("/b/over", b"1" * 300_000)
        await c.put("/b/over", b"2" * 300_000)
        await c.delete("/b/gone")
        before = len(block_files(tmp_path))
        young = await c.gc(grace=3600)
        assert young.blocks_deleted == 0  # everything is younger than the grace period
        dry = await gc_ahead(c, dry_run=True)
        assert dry.blocks_deleted > 0 and len(block_files(tmp_path)) == before
        report = await gc_ahead(c)
        assert report.blocks_deleted == dry.blocks_deleted and report.bytes_freed > 0
        assert report.blocks_scanned == before
        assert await c.get("/b/keep") == b"k" * 300_000
        assert await c.get("/b/over") == b"2" * 300_000
        assert (await gc_ahead(c)).blocks_deleted == 0


async def test_gc_refuses_grace_within_write_window(tmp_path):
    async with blobsdk.Client.local(tmp_path) as c:
        with pytest.raises(ValueError, match=r"grace \(60s\) must exceed max_write_seconds \(600.0s\)"):
            await c.gc(grace=60)
        with pytest.raises(BadRequest, match=r"^gc: grace must be a number > 0 \(seconds\), got nan$"):
            await c.gc(grace=float("nan"))  # nan compares false both ways: it once did nothing


class SlowBlocks(LocalBlockStore):
    """A local store whose writes take longer than the writer's max_write_seconds."""

    async def write_block(self, block_id, parts):
        await asyncio.sleep(0.3)
        await super().write_block(block_id, parts)


async def test_slow_write_is_not_committed(tmp_path):
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        SlowBlocks(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=FAST) as c,
    ):
        with pytest.raises(
            Unavailable, match=r"^write took [\d.]+s, over max_write_seconds=0\.2; not committed \(its blocks are left for gc\)$"
        ):
            await c.put("/b/slow", b"x" * 1000)
        with pytest.raises(blobsdk.BlobNotFound):
            await c.stat("/b/slow")


# --- gc against clock skew and races: the fence (blobsdk/ops/gc.py) ----------------------------

FAKETIME = shutil.which("faketime")
CKPT = WriteConfig(chunk_size=64 << 10, block_size=1 << 20)
COLLECTED = r"^commit of '/b/ck/0*2/data' refused: block [0-9a-f]{32} it names was collected by gc"


def faketime(offset: str, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``argv`` run under libfaketime with its clock moved by ``offset`` (e.g. "+1h")."""
    assert FAKETIME, "faketime is missing: `make services` installs it (apt-get install faketime)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([FAKETIME, "-f", offset, *argv], cwd=ROOT, env=env, input=stdin, capture_output=True, timeout=120)


async def test_gc_with_its_clock_an_hour_ahead_never_loses_an_acked_checkpoint(tmp_path):
    """The issue's case: the collector's clock 1 h ahead took a checkpoint part's block
    before its commit, the commit was acked and load failed.  Now the commit is refused."""
    async with blobsdk.Client.local(tmp_path, write=CKPT) as c:
        ck = c.checkpoints("/b/ck")
        await (await ck.save(1, {"w": b"a" * 100_000})).wait()
        part = await ck.write_part({"w": b"b" * 100_000})  # durable, not committed
        gc = faketime("+1h", sys.executable, "-m", "blobsdk", "--local", str(tmp_path), "gc", "--grace", "3000")
        assert gc.returncode == 0, gc.stderr.decode()
        assert json.loads(gc.stdout)["blocks_deleted"] == 1  # the part's block looked an hour old
        with pytest.raises(BlockCollected, match=COLLECTED):
            await ck.commit(2, [part])
        assert await ck.list() == [1]
        assert (await ck.load())["w"] == b"a" * 100_000
    async with blobsdk.Client.local(tmp_path, write=CKPT) as fresh:
        assert (await fresh.checkpoints("/b/ck").load())["w"] == b"a" * 100_000


WRITER = """
import asyncio, sys, blobsdk
from blobsdk.config import WriteConfig

async def main():
    async with blobsdk.Client.local(sys.argv[1], write=WriteConfig(chunk_size=64 << 10, block_size=1 << 20)) as c:
        ck = c.checkpoints("/b/ck")
        part = await ck.write_part({"w": b"b" * 100_000})
        print("written", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        try:
            await ck.commit(2, [part])
        except blobsdk.BlobError as exc:
            print(type(exc).__name__, exc, flush=True)
        else:
            print("committed", flush=True)

asyncio.run(main())
"""


async def test_a_writer_an_hour_behind_is_refused_not_lost(tmp_path):
    """The writer's clock 1 h behind mints block ids that look an hour old to gc."""
    async with blobsdk.Client.local(tmp_path, write=CKPT) as c:
        await (await c.checkpoints("/b/ck").save(1, {"w": b"a" * 100_000})).wait()
    assert FAKETIME, "faketime is missing: `make services` installs it (apt-get install faketime)"
    writer = await asyncio.create_subprocess_exec(
        FAKETIME, "-f", "-1h", sys.executable, "-c", WRITER, str(tmp_path),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert writer.stdin and writer.stdout
    assert await writer.stdout.readline() == b"written\n"
    async with blobsdk.Client.local(tmp_path, write=CKPT) as c:
        assert (await c.gc(grace=3000)).blocks_deleted == 1
        writer.stdin.write(b"go\n")
        await writer.stdin.drain()
        answer = (await writer.stdout.readline()).decode()
        assert await writer.wait() == 0
        assert re.match(r"^BlockCollected commit of '/b/ck/0*2/data' refused: block [0-9a-f]{32}", answer), answer
        assert (await c.checkpoints("/b/ck").load())["w"] == b"a" * 100_000


class RacingStore(SqliteMetadataStore):
    """Runs ``before_fence`` once, just before gc's fence: a commit landing between gc's
    first scan and its fence."""

    before_fence: Any = None

    async def fence_blocks(self, block_ids):
        hook, self.before_fence = self.before_fence, None
        if hook is not None:
            await hook(list(block_ids))
        await super().fence_blocks(block_ids)


async def test_a_block_committed_between_the_scan_and_the_fence_is_spared(tmp_path):
    async with (
        RacingStore(tmp_path / "meta.sqlite") as meta,
        LocalBlockStore(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=FAST) as c,
    ):
        with ThreadPoolExecutor(1) as pool:
            writer = Writer(meta, blocks, FAST, pool)
            (ref,) = await writer.write_chunks([memoryview(b"late" * 1000)])  # an orphan to the first scan

        async def commit_it(doomed):
            assert doomed == [ref.block_id]
            plan = ReadPlan(
                path="/b/late", version=0, etag=etag_of((ref,), 4000), size=4000, chunk_size=FAST.chunk_size, chunks=(ref,)
            )
            await meta.commit("/b/late", plan)

        meta.before_fence = commit_it
        report = await collect_garbage(meta, blocks, grace=0.3, max_write_seconds=0.2, clock=lambda: time.time() + 3600)
        assert (report.blocks_spared, report.blocks_deleted) == (1, 0)
        assert await c.get("/b/late") == b"late" * 1000
        await c.put("/b/again", b"x")  # its fence was lifted too: a commit naming it is fine
        plan = await meta.get_plan("/b/late")
        await meta.commit("/b/late2", msgspec.structs.replace(plan, path="/b/late2"))


class FencingOnce(SqliteMetadataStore):
    """Fences the blocks of the first commit it sees, as gc would behind a skewed clock."""

    fenced: list[str] | None = None

    async def commit_many(self, ops):
        if self.fenced is None:
            self.fenced = sorted({b for op in ops for b in op.plan.block_ids()})
            await self.fence_blocks(self.fenced)
        return await super().commit_many(ops)


async def test_put_writes_its_blocks_anew_once_when_gc_took_them(tmp_path):
    async with (
        FencingOnce(tmp_path / "meta.sqlite") as meta,
        LocalBlockStore(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=FAST) as c,
    ):
        info = await c.put("/b/x", b"y" * 300_000)
        assert info.version == 1 and await c.get("/b/x") == b"y" * 300_000
        assert meta.fenced and not set(meta.fenced) & (await meta.get_plan("/b/x")).block_ids()


class HangingDeletes(LocalBlockStore):
    """A block store whose deletes never answer (a SIGSTOPped block server)."""

    async def delete_block(self, block_id):
        await asyncio.Event().wait()


async def test_a_hanging_delete_costs_gc_one_step_and_the_block_stays_fenced(tmp_path):
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        HangingDeletes(tmp_path / "blocks") as blocks,
    ):
        with ThreadPoolExecutor(1) as pool:
            (ref,) = await Writer(meta, blocks, FAST, pool).write_chunks([memoryview(b"z" * 100)])
        report = await collect_garbage(
            meta, blocks, grace=0.3, max_write_seconds=0.2, step_timeout=0.2, clock=lambda: time.time() + 3600
        )
        assert (report.blocks_deleted, report.blocks_failed, report.bytes_freed) == (0, 1, 0)
        assert report.longest_pause_s >= 0.2 and report.seconds >= report.longest_pause_s
        plan = ReadPlan(path="/b/z", version=0, etag=etag_of((ref,), 100), size=100, chunk_size=FAST.chunk_size, chunks=(ref,))
        with pytest.raises(BlockCollected):
            await meta.commit("/b/z", plan)
