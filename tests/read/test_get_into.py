"""get_into and get_many_into: reads into the caller's memory (blobsdk/read/into.py for the
buffer rules, ReadPath.read_ranges_into for where the bytes come from)."""

from __future__ import annotations

import array
import asyncio
import mmap
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

import blobsdk
from blobsdk.config import L1Config, L2Config
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.runtime.buffers import BufferPool
from blobsdk.sources import LocalBlockStore, ReplicatedBlockStore, _localread
from servers.cluster import start_cluster
from tests.block_fixtures import GatedSpans, OneAtATime
from tests.conftest import SMALL

NO_L1 = L1Config(capacity_bytes=0)
CHUNK = SMALL.chunk_size


def data_of(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


class NoBuffers(BufferPool):
    """A buffer pool that refuses to hand out a buffer: the read must not need one."""

    def take(self, size: int) -> memoryview:
        raise AssertionError("a chunk buffer was taken")


class Spans(LocalBlockStore):
    """A local store that counts the groups (requests of many chunks) it is asked for."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.groups: list[int] = []

    async def read_spans(self, block_id, spans, *, check=None, call=None):
        self.groups.append(len(spans))
        return await super().read_spans(block_id, spans, check=check, call=call)


class WrittenInSpans(LocalBlockStore):
    """A local store whose caller (while ``target`` is set) writes into its buffer at the
    moment each chunk has landed there, before the chunk is checked there (on the store's
    thread, between its read and the check): what a caller that reuses a buffer while a read
    fills it does.  Spans are only ever read into the caller's memory."""

    target: object | None = None

    async def read_spans(self, block_id, spans, *, check=None, call=None):
        def written_then_checked(i: int) -> None:
            if self.target is not None:
                spans[i].windows[0][0] ^= 0xFF
            check(i)

        return await super().read_spans(block_id, spans, check=written_then_checked, call=call)


class WrittenOneAtATime(OneAtATime):
    """A lone replica that reads one chunk per request (as a block server or S3 does), whose
    caller writes into its buffer ``target`` each time a chunk has landed there."""

    def __init__(self, root: Path) -> None:
        super().__init__(LocalBlockStore(root))
        self.target: bytearray | None = None

    async def read_into(self, block_id, offset, out, *, call=None):
        await super().read_into(block_id, offset, out, call=call)
        if out.obj is self.target:  # the caller's memory, not a buffer of the tier's
            out[0] ^= 0xFF


def kinds(n: int) -> dict[str, object]:
    """Every kind of buffer get_into fills, each of ``n`` bytes, filled with 0xEE."""
    buffers: dict[str, object] = {
        "bytearray": bytearray(n),
        "memoryview": memoryview(bytearray(n + 8))[4:-4],
        "array": array.array("B", bytes(n)),
        "mmap": mmap.mmap(-1, n),
        "numpy_uint8": np.zeros(n, np.uint8),
        "numpy_float32_2d": np.zeros((n // 8, 2), np.float32),
        "torch_uint8": torch.zeros(n, dtype=torch.uint8),
        "torch_bfloat16_2d": torch.zeros((n // 4, 2), dtype=torch.bfloat16),
        "torch_requires_grad": torch.zeros(n // 4, dtype=torch.float32, requires_grad=True),
    }
    for buffer in buffers.values():
        memoryview_of(buffer)[:] = b"\xee" * n
    return buffers


def memoryview_of(buffer: object) -> memoryview:
    if isinstance(buffer, torch.Tensor):
        return memoryview(buffer.detach().reshape(-1).view(torch.uint8).numpy())
    return memoryview(buffer).cast("B")  # type: ignore[arg-type]


@pytest.mark.parametrize("l1", [NO_L1, L1Config()], ids=["no_l1", "l1"])
async def test_every_kind_of_buffer_is_filled_in_place(tmp_path: Path, l1: L1Config) -> None:
    """A range over three chunks (cut inside the first and the last) into the start of each
    kind of buffer, the rest of it untouched; the count returned."""
    n = 3 * CHUNK
    async with blobsdk.Client.local(tmp_path, write=SMALL, l1=l1) as c:
        data = data_of(5 * CHUNK, 1)
        await c.put("/b/x", data)
        for name, buffer in kinds(n).items():
            view = memoryview_of(buffer)
            got = await c.get_into("/b/x", buffer, 100)
            assert got == n, name
            assert view == data[100 : 100 + n], name
        whole = kinds(8 * CHUNK)["torch_uint8"]
        assert await c.get_into("/b/x", whole) == len(data)
        assert bytes(memoryview_of(whole)[: len(data)]) == data
        assert bytes(memoryview_of(whole)[len(data) :]) == b"\xee" * (3 * CHUNK)


@pytest.mark.parametrize(
    ("offset", "size", "want"),
    [(0, 10, 10), (5, 100, 5), (9, 1, 1), (10, 4, 0), (99, 4, 0), (0, 0, 0), (3, 4, 4)],
)
async def test_ranges_count_like_readinto(client, offset: int, size: int, want: int) -> None:
    await client.put("/b/r", b"0123456789")
    buffer = bytearray(b"-" * size)
    assert await client.get_into("/b/r", buffer, offset) == want
    assert buffer == b"0123456789"[offset : offset + want] + b"-" * (size - want)


async def test_an_empty_blob_fills_nothing(client) -> None:
    await client.put("/b/empty", b"")
    assert await client.get_into("/b/empty", bytearray(b"abc")) == 0


async def test_ranges_across_chunks_match_get(client) -> None:
    data = data_of(1_000_000, 2)
    await client.put("/b/r", data)
    for offset, size in [(0, 1), (CHUNK - 1, 2), (CHUNK, CHUNK), (100, 300_000), (999_999, 10), (500_000, 700_000)]:
        buffer = np.empty(size, np.uint8)
        n = await client.get_into("/b/r", buffer, offset)
        assert n == min(size, len(data) - offset)
        assert buffer[:n].tobytes() == await client.get("/b/r", offset, size)


async def test_without_l1_whole_chunks_go_straight_into_the_buffer(tmp_path: Path) -> None:
    """No L1, a lone local replica: the whole chunks need no chunk buffer (the range's cut
    chunks at either end do, from the pool, given back); a flipped byte is CorruptData,
    verified where it was read."""
    async with blobsdk.Client.local(tmp_path, write=SMALL, l1=NO_L1) as c:
        data = data_of(5 * CHUNK, 3)
        await c.put("/b/x", data)
        path = c._open.readpath
        l4 = path.tiers[-1]
        real, l4.buffers = l4.buffers, NoBuffers()
        out = torch.empty(len(data), dtype=torch.uint8)
        assert await c.get_into("/b/x", out) == len(data)
        assert out.numpy().tobytes() == data
        with pytest.raises(AssertionError, match=r"^a chunk buffer was taken$"):
            await c.get_into("/b/x", bytearray(CHUNK), 1)
        l4.buffers = real
        out = bytearray(3 * CHUNK)
        assert await c.get_into("/b/x", out, 1) == 3 * CHUNK
        assert out == data[1 : 1 + 3 * CHUNK]
        plan = await c.plan("/b/x")
        block = next(p for p in (tmp_path / "blocks").rglob(plan.chunks[2].block_id) if p.is_file())
        raw = bytearray(block.read_bytes())
        raw[plan.chunks[2].offset] ^= 0xFF
        block.chmod(0o644)
        block.write_bytes(raw)
        with pytest.raises(blobsdk.CorruptData):
            await c.get_into("/b/x", bytearray(len(data)))


async def test_with_l1_a_hit_is_copied_and_a_fetch_fills_l1_with_its_own_copy(tmp_path: Path) -> None:
    """With L1, a fetched chunk is kept there as get keeps it: the caller's memory is not
    (writing into the buffer afterwards changes nothing a later read sees); the next
    get_into is an L1 hit."""
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        data = data_of(2 * CHUNK, 4)
        await c.put("/b/x", data)
        out = bytearray(len(data))
        assert await c.get_into("/b/x", out) == len(data) and out == data
        assert c.stats()["l4"]["hits"] == 2 and c.stats()["l1"]["cache_entries"] == 2
        out[:] = bytes(len(data))
        again = np.empty(len(data), np.uint8)
        assert await c.get_into("/b/x", again) == len(data)
        assert again.tobytes() == data
        assert c.stats()["l1"]["hits"] == 2 and c.stats()["l4"]["hits"] == 2


async def test_l2_is_filled_then_serves(tmp_path: Path) -> None:
    """No L1, an L2: a fetch from L4 fills L2 (which keeps its own buffer), the next read is
    an L2 hit copied into the caller's buffer."""
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=64 << 20)
    async with blobsdk.Client.local(tmp_path / "data", write=SMALL, l1=NO_L1, l2=l2) as c:
        data = data_of(3 * CHUNK + 5, 5)
        await c.put("/b/x", data)
        out = bytearray(len(data))
        assert await c.get_into("/b/x", out) == len(data) and out == data
        await c.flush()
        out = bytearray(len(data))
        assert await c.get_into("/b/x", out) == len(data) and out == data
        stats = c.stats()
        assert stats["l4"]["hits"] == 4 and stats["l2"]["hits"] == 4


async def test_two_replicas_go_through_a_pooled_buffer(tmp_path: Path) -> None:
    """Hedged replicas cannot share the caller's memory: each chunk lands in a pool buffer,
    is copied out and given back; the next read reuses it."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        ReplicatedBlockStore([LocalBlockStore(tmp_path / "r0"), LocalBlockStore(tmp_path / "r1")]) as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=NO_L1) as c,
    ):
        data = data_of(4 * CHUNK, 6)
        await c.put("/b/x", data)
        pool = c._open.readpath.buffers
        for _ in range(2):
            out = np.empty(len(data), np.uint8)
            assert await c.get_into("/b/x", out) == len(data) and out.tobytes() == data
        assert pool.reused > 0


async def test_get_many_into_reads_small_blobs_of_one_block_as_one_group(tmp_path: Path) -> None:
    """Blobs packed by put_many, read back to back into one tensor made for their total: one
    request for the block's chunks; the sizes returned; the buffer may be larger."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        Spans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, l1=NO_L1) as c,
    ):
        items = [(f"/b/{i:02d}", data_of(1000 + 17 * i, i)) for i in range(20)]
        await c.put_many(items)
        order = [*[path for path, _ in items][::-1], "/b/03", "/b/03"]  # a path twice: two windows
        made: list[int] = []

        def batch(total: int) -> torch.Tensor:
            made.append(total)
            return torch.empty(total, dtype=torch.uint8)

        sizes = await c.get_many_into(order, batch)
        assert sizes == [len(dict(items)[p]) for p in order] and made == [sum(sizes)]
        assert blocks.groups == [22]
        out = bytearray(sum(sizes) + 3)
        assert await c.get_many_into(order, out) == sizes
        assert out == b"".join(dict(items)[p] for p in order) + bytes(3)
        assert await c.get_many_into([], bytearray()) == []


async def test_get_many_into_refuses_before_reading(client) -> None:
    await client.put("/b/a", b"abc")
    with pytest.raises(blobsdk.BadRequest, match=r"^get_many_into: a buffer of 5 bytes for 2 blobs of 6 bytes$"):
        await client.get_many_into(["/b/a", "/b/a"], bytearray(5))
    with pytest.raises(blobsdk.BlobNotFound, match=r"^no blob at '/b/nope'$"):
        await client.get_many_into(["/b/a", "/b/nope"], lambda n: pytest.fail("allocated"))
    with pytest.raises(
        TypeError, match=r"^get_many_into: paths must be a sequence of paths, not a str \(use get_into for one\)$"
    ):
        await client.get_many_into("/b/a", bytearray(3))
    with pytest.raises(
        TypeError, match=r"^get_many_into: buffer is read-only \(bytes\): pass a writable one, such as a bytearray$"
    ):
        await client.get_many_into(["/b/a"], lambda n: bytes(n))


BUFFER_ERRORS = [
    ("x", r"buffer must be a bytearray, a writable memoryview, a numpy array or a CPU torch tensor, not str"),
    (7, r"buffer must be a bytearray, a writable memoryview, a numpy array or a CPU torch tensor, not int"),
    ([0, 0], r"buffer must be a bytearray, a writable memoryview, a numpy array or a CPU torch tensor, not list"),
    (b"abc", r"buffer is read-only \(bytes\): pass a writable one, such as a bytearray"),
    (memoryview(bytearray(3)).toreadonly(), r"buffer is read-only \(memoryview\): pass a writable one, such as a bytearray"),
    (np.frombuffer(b"abcd", np.uint8), r"buffer is read-only \(ndarray\): pass a writable one, such as a bytearray"),
    (
        np.zeros(8, np.uint8)[::2],
        r"buffer is not C-contiguous \(ndarray of shape \(4,\)\): pass a contiguous one \(numpy.ascontiguousarray,"
        r" tensor.contiguous\(\)\) and copy from it",
    ),
    (
        np.zeros((2, 3), np.uint8).T,
        r"buffer is not C-contiguous \(ndarray of shape \(3, 2\)\): pass a contiguous one \(numpy.ascontiguousarray,"
        r" tensor.contiguous\(\)\) and copy from it",
    ),
    (
        torch.zeros((2, 3), dtype=torch.uint8).T,
        r"buffer is not C-contiguous \(tensor of shape \(3, 2\), strides \(1, 3\)\): pass a contiguous one"
        r" \(numpy.ascontiguousarray, tensor.contiguous\(\)\) and copy from it",
    ),
    (
        torch.empty(4, device="meta"),
        r"a torch tensor must be on the CPU, not meta: read into a pinned CPU tensor, then .to\(device, non_blocking=True\)",
    ),
    (
        torch.zeros(4, dtype=torch.complex64).conj(),
        r"buffer is a conjugate view \(tensor of shape \(4,\) with its conjugate bit set\): pass a tensor of its own"
        r" \(tensor.resolve_conj\(\)\) and copy from it",
    ),
    (
        torch.zeros(4, dtype=torch.complex64).conj().imag,
        r"buffer is a negative view \(tensor of shape \(4,\) with its negative bit set\): pass a tensor of its own"
        r" \(tensor.resolve_neg\(\)\) and copy from it",
    ),
    (
        torch.zeros(4).to_sparse(),
        r"buffer is not a dense tensor \(torch.sparse_coo\): pass a dense one \(tensor.to_dense\(\)\) and copy from it",
    ),
    (
        torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged),
        r"buffer is not a dense tensor \(nested\): pass a dense one \(tensor.to_dense\(\)\) and copy from it",
    ),
]


@pytest.mark.parametrize(("buffer", "message"), BUFFER_ERRORS)
async def test_a_buffer_it_cannot_fill_is_a_type_error(client, buffer: object, message: str) -> None:
    await client.put("/b/a", b"abc")
    with pytest.raises(TypeError, match=f"^get_into: {message}$"):
        await client.get_into("/b/a", buffer)


@pytest.mark.parametrize("offset", [-1, 1.5, True, "0"])
async def test_a_bad_offset_is_a_bad_request(client, offset: object) -> None:
    await client.put("/b/a", b"abc")
    with pytest.raises(blobsdk.BadRequest, match=f"^offset must be an int >= 0, got {offset!r}$"):
        await client.get_into("/b/a", bytearray(3), offset)  # type: ignore[arg-type]


async def test_a_missing_blob_is_not_found(client) -> None:
    with pytest.raises(blobsdk.BlobNotFound):
        await client.get_into("/b/nope", bytearray(3))


@pytest.mark.parametrize("store", [WrittenInSpans, WrittenOneAtATime], ids=["spans", "one_at_a_time"])
async def test_a_buffer_written_during_the_read_is_buffer_changed_and_blames_no_store(tmp_path: Path, store: type) -> None:
    """A healthy lone replica; the caller writes into its buffer while get_into fills it,
    once each chunk is in and before it is checked there.  The read raises BufferChanged
    naming a chunk; no copy is counted corrupt or an error, the replica is not demoted; the
    same blob then reads whole."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        store(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=NO_L1) as c,
    ):
        data = data_of(5 * CHUNK, 9)
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        out = bytearray(len(data))
        blocks.target = out
        with pytest.raises(blobsdk.BufferChanged) as info:
            await c.get_into("/b/x", out)
        assert str(info.value) in {
            f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: the caller's buffer changed while the read filled it"
            " (the store's copy, read again, is good): write nothing into a buffer until the read that fills it returns"
            for ref in plan.chunks
        }
        l4 = c.stats()["l4"]
        assert (l4["corrupt"], l4["errors"], l4["misses"], l4["replicas_demoted"]) == (0, 0, 0, 0)
        blocks.target = None
        out = bytearray(len(data))
        assert await c.get_into("/b/x", out) == len(data) and out == data


@pytest.mark.parametrize("store", [WrittenInSpans, WrittenOneAtATime], ids=["spans", "one_at_a_time"])
async def test_a_copy_bad_in_the_store_is_still_a_bad_copy(tmp_path: Path, store: type) -> None:
    """The second read, into the tier's own memory, fails too: CorruptData, the copy counted
    corrupt and the replica demoted, as before the second read existed."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        store(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=NO_L1) as c,
    ):
        data = data_of(CHUNK, 10)
        await c.put("/b/x", data)
        (bad,) = (await c.plan("/b/x")).chunks
        (path,) = (tmp_path / "blocks").rglob(bad.block_id)
        raw = bytearray(path.read_bytes())
        raw[bad.offset + 7] ^= 0x01
        path.chmod(0o644)
        path.write_bytes(raw)
        with pytest.raises(blobsdk.CorruptData, match=rf"^chunk {bad.key}: no replica returned bytes matching its checksum"):
            await c.get_into("/b/x", bytearray(CHUNK))
        l4 = c.stats()["l4"]
        assert (l4["corrupt"], l4["replicas_demoted"]) == (1, 1)


async def test_a_restore_into_arrays_written_during_it_is_buffer_changed_and_blames_no_store(tmp_path: Path) -> None:
    """``load(into=)`` reads straight into the caller's arrays too: written meanwhile, the
    restore raises BufferChanged and counts nothing corrupt; unwritten, it restores exactly."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        WrittenInSpans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c,
    ):
        ck = c.checkpoints("/ck/x")
        weights = np.frombuffer(data_of(3 * CHUNK, 11), np.uint8).copy()
        await (await ck.save(1, {"w": weights})).wait()
        blocks.target = True
        with pytest.raises(blobsdk.BufferChanged, match=r"the caller's buffer changed while the read filled it"):
            await ck.load(into={"w": np.zeros_like(weights)})
        l4 = c.stats()["l4"]
        assert (l4["corrupt"], l4["errors"], l4["misses"], l4["replicas_demoted"]) == (0, 0, 0, 0)
        blocks.target = None
        into = {"w": np.zeros_like(weights)}
        await ck.load(into=into)
        assert into["w"].tobytes() == weights.tobytes()


def test_the_blocking_client_reads_into_buffers(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path, write=SMALL) as c:
        data = data_of(2 * CHUNK + 1, 7)
        c.put("/b/x", data)
        c.put("/b/y", b"xyz")
        out = np.empty(len(data) + 1, np.uint8)
        assert c.get_into("/b/x", out) == len(data) and out[:-1].tobytes() == data
        assert c.get_into("/b/x", bytearray(5), offset=len(data) - 2) == 2
        batch = torch.empty(len(data) + 3, dtype=torch.uint8)
        assert c.get_many_into(["/b/y", "/b/x"], batch) == [3, len(data)]
        assert batch.numpy().tobytes() == b"xyz" + data
        with pytest.raises(TypeError, match=r"^get_into: buffer is read-only \(bytes\)"):
            c.get_into("/b/x", b"")


@pytest.mark.parametrize(
    ("servers", "l3_nodes", "tier"),
    [(1, 0, "l4"), (3, 1, "l3")],
    ids=["lone_block_server", "three_block_servers_and_l3"],
)
async def test_over_a_cluster(tmp_path: Path, servers: int, l3_nodes: int, tier: str) -> None:
    """Through real servers, no L1: a lone block server's whole chunks are read over HTTP
    straight into the buffer (no chunk buffer); three replicas behind an L3 node go through
    the pool.  Whole blobs, ranges and a batch alike."""
    async with start_cluster(tmp_path, block_servers=servers, l3_nodes=l3_nodes, trackers=0) as cluster:
        config = msgspec.structs.replace(cluster.config, write=SMALL, l1=NO_L1)
        async with blobsdk.Client(config) as c:
            data = data_of(4 * CHUNK + 9, 8)
            await c.put("/b/x", data)
            await c.put_many([(f"/b/s{i}", data_of(3000 + i, i)) for i in range(5)])
            if l3_nodes == 0:
                l4 = c._open.readpath.tiers[-1]
                l4.buffers = NoBuffers()
            out = torch.empty(len(data), dtype=torch.uint8)
            assert await c.get_into("/b/x", out) == len(data) and out.numpy().tobytes() == data
            if l3_nodes == 0:
                l4.buffers = BufferPool()
            part = np.empty(2 * CHUNK, np.uint8)
            assert await c.get_into("/b/x", part, CHUNK + 3) == 2 * CHUNK
            assert part.tobytes() == data[CHUNK + 3 : 3 * CHUNK + 3]
            paths = [f"/b/s{i}" for i in range(5)]
            batch = bytearray(sum(3000 + i for i in range(5)))
            assert await c.get_many_into(paths, batch) == [3000 + i for i in range(5)]
            assert batch == b"".join(data_of(3000 + i, i) for i in range(5))
            assert c.stats()[tier]["hits"] > 0


async def test_a_cancelled_get_many_into_ends_only_when_nothing_writes_into_the_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while the store's thread is inside its read, get_many_into waits for that
    thread before the cancellation goes on; the thread reads nothing after its run."""
    monkeypatch.setattr(_localread, "RUN_BYTES", 1)  # each chunk a run of its own
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        GatedSpans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, l1=NO_L1) as c,
    ):
        items = [(f"/b/{i}", data_of(2000, i)) for i in range(3)]
        await c.put_many(items)
        out, paths = bytearray(6000), [path for path, _ in items]
        task = asyncio.create_task(c.get_many_into(paths, out))
        await blocks.started.wait()
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()  # waiting for the store's thread
        blocks.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert blocks.checked == [0]
        assert out == items[0][1] + bytes(4000)
