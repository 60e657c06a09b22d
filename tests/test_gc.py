import asyncio

import pytest

import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.errors import BadRequest, Unavailable
from blobsdk.metadata.sqlite import SqliteMetadataStore
from blobsdk.sources.local import LocalBlockStore
from tests.helpers import stored_files

FAST = WriteConfig(chunk_size=64 << 10, block_size=256 << 10, max_write_seconds=0.2)


def block_files(root):
    return stored_files(root / "blocks")


async def test_gc_collects_only_unreferenced_old_blocks(tmp_path):
    async with blobsdk.Client.local(tmp_path, write=FAST) as c:
        await c.put("/b/keep", b"k" * 300_000)
        await c.put("/b/gone", b"g" * 300_000)
        await c.put("/b/over", b"1" * 300_000)
        await c.put("/b/over", b"2" * 300_000)
        await c.delete("/b/gone")
        before = len(block_files(tmp_path))
        young = await c.gc(grace=60)
        assert young.blocks_deleted == 0  # everything is younger than the grace period
        await asyncio.sleep(0.35)
        dry = await c.gc(grace=0.3, dry_run=True)
        assert dry.blocks_deleted > 0 and len(block_files(tmp_path)) == before
        report = await c.gc(grace=0.3)
        assert report.blocks_deleted == dry.blocks_deleted and report.bytes_freed > 0
        assert report.blocks_scanned == before
        assert await c.get("/b/keep") == b"k" * 300_000
        assert await c.get("/b/over") == b"2" * 300_000
        assert (await c.gc(grace=0.3)).blocks_deleted == 0


async def test_gc_refuses_grace_within_write_window(tmp_path):
    async with blobsdk.Client.local(tmp_path) as c:
        with pytest.raises(ValueError, match=r"grace \(60s\) must exceed max_write_seconds \(600.0s\)"):
            await c.gc(grace=60)
        with pytest.raises(BadRequest, match=r"^grace \(nans\) must exceed max_write_seconds \(600.0s\)"):
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
