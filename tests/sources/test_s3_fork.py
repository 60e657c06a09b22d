"""DataLoader workers over an S3 L4 (issue 21 item 2): forked after the parent used S3 (wrote,
listed, read and prefetched through it, its client still open), forkserver and spawn ones,
every byte verified; what still needs obstore in a forked child says so (NotForkSafe).

Real worker processes against moto's S3 API (servers/s3d.py) and redis-server; every
DataLoader has a ``timeout`` and every bare process a join deadline, so a hang fails the test."""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import blobsdk
from blobsdk.config import ClientConfig
from blobsdk.sources import S3BlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.torch import BlobDataset, BlobIterableDataset
from servers.redisd import start_redis
from servers.s3d import start_s3
from tests.helpers import in_a_forked_child, redis_s3_toml

pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
HANG_S = 120  # a worker that gives no batch (or a process that does not end) this long fails the test
N = 48


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with start_redis(tmp_path_factory.mktemp("redis")) as redis, start_s3(tmp_path_factory.mktemp("s3")) as s3:
        s3.make_bucket("blobs")
        yield redis, s3


def content(path: str) -> bytes:
    return path.encode() * (1 + len(path) * 37 % 2000)  # 1 to ~100 KiB, several 64 KiB chunks some


@pytest.fixture
def toml(services: Any, tmp_path: Path) -> Path:
    redis, s3 = services
    run = secrets.token_hex(4)
    text = redis_s3_toml(redis.url, f"s3://blobs/fork-{run}", s3.endpoint, write={"chunk_size": 65536})
    (tmp_path / "client.toml").write_text(text)
    return tmp_path / "client.toml"


def samples(loader: DataLoader[Any]) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    for batch in loader:
        for path, data in batch:
            assert path not in got
            got[path] = bytes(data)
    return got


def test_workers_forked_after_the_parent_wrote_listed_read_and_prefetched_s3_read_every_byte(toml: Path) -> None:
    """The parent writes through S3 (obstore's runtime runs here from then on), lists, reads
    and prefetches into L1, and keeps its client open: workers forked from it read every
    sample of a map-style and an iterable dataset, verified; so do forkserver and spawn ones."""
    prefix = "/train/"
    paths = [f"{prefix}{i:04d}" for i in range(N)]
    with blobsdk.SyncClient(ClientConfig.from_toml(toml)) as parent:
        parent.put_many((p, content(p)) for p in paths)
        assert [info.path for info in parent.list(prefix)] == paths
        assert parent.get(paths[0]) == content(paths[0])
        parent.prefetch(prefix, tier="l1").wait()
        expected = {p: content(p) for p in paths}

        def read(dataset: Any, context: str, **kw: Any) -> dict[str, bytes]:
            return samples(
                DataLoader(
                    dataset,
                    num_workers=2,
                    batch_size=8,
                    collate_fn=list,
                    multiprocessing_context=context,
                    timeout=HANG_S,
                    **kw,
                )
            )

        with BlobDataset(toml, prefix) as mapped, BlobIterableDataset(toml, prefix) as iterable:
            assert read(mapped, "fork", shuffle=True) == expected
            assert read(iterable, "fork") == expected
            for context in ("forkserver", "spawn"):
                assert read(mapped, context) == expected, context


async def test_a_child_forked_after_the_parent_read_s3_reads_through_the_inherited_store_on_its_own_connections(
    seaweed: Any,
) -> None:
    """Fork after a parent S3 read, the store still open with its keep-alive connection
    pooled (SeaweedFS keeps connections; moto closes each): the child reads through the same
    store object on a loop and connections of its own, and closes them; the parent's pooled
    connection was neither used nor closed there, and serves the parent's next read."""
    seaweed.make_bucket("fork-held")
    block = new_block_id()
    async with S3BlockStore("fork-held", "held", config=seaweed.config, allow_http=True) as store:
        await store.write_block(block, [b"hello world"])  # obstore's runtime runs in this process now
        assert await store.read_range(block, 0, 5) == b"hello"  # a signed GET, its connection kept
        endpoint = store._getter._endpoints.get() if store._getter is not None else None
        assert endpoint is not None and len(endpoint._idle) == 1
        pooled = endpoint._idle[0]

        async def in_the_child() -> bytes:
            async with store:  # closes the child's connections only
                return bytes(await store.read_range(block, 6, 5))

        assert in_a_forked_child(lambda: asyncio.run(in_the_child()), timeout=HANG_S) == b"world"
        assert await store.read_range(block, 0, 11) == b"hello world"
        assert endpoint._idle == [pooled] and not pooled.closed  # the parent's connection served it


def child_tries(queue: Any, what: str, toml: str, config: dict[str, str], block: str) -> None:
    """What a forked child gets when it tries ``what`` ("put": a client's put; "read": a
    store's read of ``block``): "ok", or the error's type and message."""
    import asyncio

    async def read() -> None:
        async with S3BlockStore("blobs", "keyless", config=config, allow_http=True) as store:
            assert await store.read_range(block, 0, 5) == b"hello"

    try:
        if what == "put":
            with blobsdk.SyncClient(ClientConfig.from_toml(toml)) as c:
                c.put("/child/x", b"child")
        else:
            asyncio.run(read())
        queue.put("ok")
    except Exception as exc:  # noqa: BLE001 (reported to the parent, whatever it is)
        queue.put(f"{type(exc).__name__}: {exc}")


def forked(what: str, toml: Path, config: dict[str, str] | None = None, block: str = "") -> str:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=child_tries, args=(queue, what, str(toml), config or {}, block))
    child.start()
    child.join(HANG_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the forked child hung ({what})")
    return str(queue.get(timeout=5))


FORKED = (
    "NotForkSafe: S3 {what} (obstore) cannot run in a process forked after its parent used obstore: obstore's runtime "
    'threads do not survive fork(). Do it in the parent, or start the workers with multiprocessing_context="forkserver" '
    '(or "spawn")'
)


def test_a_write_in_a_forked_child_is_not_fork_safe_and_says_what_to_do(toml: Path) -> None:
    with blobsdk.SyncClient(ClientConfig.from_toml(toml)) as parent:
        parent.put("/parent/x", b"parent")  # obstore's runtime runs in this process now
    assert forked("put", toml) == FORKED.format(what="writes, listings and indexing")


async def test_reads_without_static_credentials_go_through_obstore_and_say_so_in_a_forked_child(
    services: Any, toml: Path
) -> None:
    """A config option only obstore understands: reads go through obstore (they work here),
    and a child forked after that is told why it cannot read, and what to do."""
    config = {**services[1].config, "virtual_hosted_style_request": "false"}
    block = new_block_id()
    async with S3BlockStore("blobs", "keyless", config=config, allow_http=True) as store:
        await store.write_block(block, [b"hello"])
        assert await store.read_range(block, 0, 5) == b"hello"
    why = "the config sets virtual_hosted_style_request, which only obstore understands"
    expected = (
        FORKED.format(what="reads")
        + f"; reads go through obstore too because {why}: give static credentials to read in forked workers"
    )
    assert forked("read", toml, config, block) == expected
