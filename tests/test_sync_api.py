"""The blocking API is the async one: every public method of ``Client``, and of the handles it
returns (Checkpoints, its Pending saves, Prefetch), has a blocking twin taking the same
parameters.  A hand-written SyncClient once drifted (no ``scrub``, ``node_stats`` nor
``from_stores``); these tests name what a twin lacks or takes differently."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

import blobsdk
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.read.prefetch import Prefetch
from blobsdk.sources import LocalBlockStore
from blobsdk.sync import SyncCheckpoints, SyncPending, SyncPrefetch
from blobsdk.write.checkpoint import Checkpoints, Pending
from tests.conftest import SMALL

TWINS = [
    (blobsdk.Client, blobsdk.SyncClient),
    (Checkpoints, SyncCheckpoints),
    (Pending, SyncPending),
    (Prefetch, SyncPrefetch),
]
RENAMED = {"aclose": "close"}  # a blocking client is closed by close()
Parameters = list[tuple[str, Any, Any, Any]]


def public_methods(cls: type) -> dict[str, Any]:
    """Name -> method (classmethods included) of ``cls``'s public callables."""
    return {name: member for name, member in inspect.getmembers(cls) if not name.startswith("_") and callable(member)}


def public_properties(cls: type) -> set[str]:
    return {name for name, member in inspect.getmembers(cls) if not name.startswith("_") and isinstance(member, property)}


def parameters(method: Any) -> Parameters:
    """Each parameter's name, kind, default and annotation: the signature but for its result."""
    return [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(method).parameters.values()]


@pytest.mark.parametrize(("async_cls", "sync_cls"), TWINS, ids=[s.__name__ for _, s in TWINS])
def test_every_public_method_and_property_has_a_blocking_twin(async_cls: type, sync_cls: type) -> None:
    wanted = {RENAMED.get(name, name) for name in public_methods(async_cls)} | public_properties(async_cls)
    missing = sorted(name for name in wanted if not hasattr(sync_cls, name))
    assert not missing, f"{sync_cls.__name__} lacks {', '.join(missing)}"


@pytest.mark.parametrize(("async_cls", "sync_cls"), TWINS, ids=[s.__name__ for _, s in TWINS])
def test_each_blocking_twin_takes_the_same_parameters(async_cls: type, sync_cls: type) -> None:
    differ: dict[str, tuple[Parameters, Parameters]] = {}
    for name, method in public_methods(async_cls).items():
        twin = getattr(sync_cls, RENAMED.get(name, name), None)
        if twin is not None and parameters(twin) != parameters(method):
            differ[name] = (parameters(method), parameters(twin))
    assert not differ, f"{sync_cls.__name__} takes other parameters in {', '.join(differ)}: {differ}"


def test_a_blocking_twin_keeps_the_docstring_and_a_bound_one_drops_self(tmp_path: Path) -> None:
    assert blobsdk.SyncClient.scrub.__doc__ == blobsdk.Client.scrub.__doc__
    assert blobsdk.SyncClient.put.__name__ == "put"
    client = blobsdk.SyncClient.local(tmp_path)  # never opened: nothing to close
    assert str(inspect.signature(client.put)) == "(path: 'str', data: 'Buffer', *, if_version: 'int | None' = None)"


def test_the_methods_the_blocking_client_lacked_work(tmp_path: Path) -> None:
    meta, blocks = SqliteMetadataStore(tmp_path / "meta.sqlite"), LocalBlockStore(tmp_path / "blocks")
    try:
        with blobsdk.SyncClient.from_stores(meta, blocks, write=SMALL) as c:
            assert isinstance(c, blobsdk.SyncClient)
            c.put("/b/x", b"given")
            report = c.scrub(dry_run=True)
            assert (report.blocks_checked, report.copies_missing, report.blocks_unrepaired) == (1, 0, 0)
            assert c.node_stats() == {}  # no L3
            again = c.copy()
        with again:
            assert bytes(again.get("/b/x")) == b"given"
    finally:
        asyncio.run(close(meta, blocks))


def test_a_prefetch_reads_its_paths_in_the_callers_thread(tmp_path: Path) -> None:
    """So that they may come from the same client: its loop thread may not call it."""
    with blobsdk.SyncClient.local(tmp_path, write=SMALL) as c:
        c.put_many([("/b/x", b"x"), ("/b/y", b"y")])
        handle = c.prefetch((info.path for info in c.list("/b/")), tier="l1")
        assert handle.wait().chunks_total == 2


async def close(meta: SqliteMetadataStore, blocks: LocalBlockStore) -> None:
    await meta.aclose()
    await blocks.aclose()
