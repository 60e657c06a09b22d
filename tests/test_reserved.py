"""``/{bucket}/.blobsdk/`` is blobsdk's own (blobsdk/chunks/names.py): every way a user writes or
deletes refuses it before any I/O (the client, fsspec; the CLI in tests/cli/test_cli.py; every
store in blobsdk/testing/reserved.py; the API server per tenant in tests/test_tenancy.py), reads
and listings there still work, and gc sweeps only index entries there, keeping a stray an
older build let a user write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import blobsdk
from blobsdk.chunks import INDEX_DIR
from blobsdk.config import WriteConfig
from blobsdk.errors import InvalidPath
from blobsdk.testing.reserved import reserved
from tests.fsspec_fixtures import local_fs
from tests.helpers import gc_ahead
from tests.metadata.unchecked import move_plan

CHUNK = 64 << 10
WRITE = WriteConfig(chunk_size=CHUNK, block_size=1 << 20)


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    async with blobsdk.Client.local(tmp_path, write=WRITE) as c:
        yield c


async def an_entry(client: blobsdk.Client, bucket: str = "b") -> str:
    """A checkpoint's chunk index entry (the checkpoint kept)."""
    await (await client.checkpoints(f"/{bucket}/ck").save(1, {"w": np.ones(CHUNK, np.uint8)})).wait()
    (entry,) = [info.path async for info in client.list(f"/{bucket}/{INDEX_DIR}/")]
    return entry


async def blocks_of(client: blobsdk.Client) -> set[str]:
    return {info.block_id async for info in client._open.blocks.list_blocks()}


async def test_the_client_refuses_every_write_and_delete_there_before_any_io_and_reads_it(client: blobsdk.Client) -> None:
    entry = await an_entry(client)
    stored = await blocks_of(client)
    for path in ("/b/.blobsdk", "/b/.blobsdk/mine", entry):
        for call in (client.put, lambda p, data: client.put_many([(p, data)]), lambda p, _: client.delete(p)):
            with pytest.raises(InvalidPath) as exc:
                await call(path, b"x")
            assert str(exc.value) == reserved(path)
    with pytest.raises(InvalidPath) as exc:
        client.checkpoints("/b/.blobsdk/ck")
    assert str(exc.value) == reserved("/b/.blobsdk/ck/x")
    assert await blocks_of(client) == stored  # nothing written
    assert await client.get(entry) == np.ones(CHUNK, np.uint8).tobytes()  # read, stat and list as any blob
    assert (await client.stat(entry)).size == CHUNK
    assert [info.path async for info in client.list("/b/.blobsdk/")] == [entry]
    await client.put("/b/k/.blobsdk/x", b"x")  # only the bucket's own .blobsdk is reserved
    await client.put("/b/.blobsdkx", b"x")


def test_fsspec_refuses_writes_there_and_a_recursive_rm_above_skips_it(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path / "store", write=WRITE) as c:
        c.checkpoints("/b/ck").save(1, {"w": np.ones(CHUNK, np.uint8)}).wait()
        c.put("/b/other", b"o")
    with local_fs(tmp_path / "store") as fs:
        (entry,) = fs.ls(f"b/{INDEX_DIR}", detail=False)
        (tmp_path / "f").write_bytes(b"f")
        path = "/" + entry
        for blob, write in (
            (path, lambda: fs.pipe_file(entry, b"x")),
            (path, lambda: fs.open(entry, "wb")),  # at open, not at close
            (path, lambda: fs.put_file(str(tmp_path / "f"), entry)),
            (path, lambda: fs.cp_file("b/other", entry)),
            (path, lambda: fs.rm_file(entry)),
            (path, lambda: fs.rm(entry)),
            ("/b/.blobsdk", lambda: fs.rm("b/.blobsdk", recursive=True)),
        ):
            with pytest.raises(InvalidPath) as exc:
                write()
            assert str(exc.value) == reserved(blob)
        assert fs.cat_file(entry) == np.ones(CHUNK, np.uint8).tobytes()
        fs.cp_file(entry, "b/copy")  # reading it is fine
        fs.rm("b", recursive=True)
        assert fs.find("b") == [entry]  # the user's blobs went; blobsdk's records wait for gc


async def test_gc_sweeps_index_entries_and_keeps_a_stray_an_older_build_let_a_user_write(
    client: blobsdk.Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = await an_entry(client)
    for name, at in (("notes", "/b/.blobsdk/chunks/notes.txt"), ("mine", "/b/.blobsdk/mine")):
        await client.put(f"/b/{name}", name.encode() * 1000)
        move_plan(tmp_path / "meta.sqlite", f"/b/{name}", at)
    await client.checkpoints("/b/ck").remove(1)
    report = await gc_ahead(client)
    assert (report.index_entries_deleted, report.reserved_strays) == (1, 2)
    assert [info.path async for info in client.list("/b/")] == ["/b/.blobsdk/chunks/notes.txt", "/b/.blobsdk/mine"]
    assert await client.get("/b/.blobsdk/chunks/notes.txt") == b"notes" * 1000  # its block kept
    assert [r.getMessage() for r in caplog.records if r.name == "blobsdk.ops.gc"] == [
        "gc: 2 blob(s) under /{bucket}/.blobsdk/ are no index entry (first: /b/.blobsdk/chunks/notes.txt): kept"
    ]
    assert entry not in [info.path async for info in client.list("/b/")]
    await client._open.metadata.delete("/b/.blobsdk/mine", kind="index")  # how an admin removes one
    assert (await gc_ahead(client)).reserved_strays == 1
