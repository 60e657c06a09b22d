"""s3_read's small-object rows: whole ~323 KB objects (MLPerf Storage's retinanet-like
samples: many objects, each read whole, not a range of a larger one), in objects/s, against
every S3 client a training job would use, in the same run as the range rows
(benchmarks/s3_read.py has the rounds, the row order and the checks).

Rows, each reading every object once, ``CONCURRENCY`` at a time, every byte checked:
- ``obstore``: ``obstore.get_async`` then ``bytes_async()``;
- ``boto3``: ``get_object`` then ``Body.read()``, in a pool of ``CONCURRENCY`` threads;
- ``s3torch``: s3torchconnector's ``S3Client.get_object`` then ``read()`` of its default
  (sequential) reader, the CRT client every DataLoader worker of its datasets uses, in a pool
  of ``CONCURRENCY`` threads (its calls block);
- ``store``: S3BlockStore.read_into of a whole block (the L4 read: its size is the plan's);
- ``client``: Client.get of the same objects indexed in place (``client.index_s3``: a link
  block per object, each get an ``If-Match`` GET of the object), L1 off, plans cached: how
  the SDK reads a dataset of objects already in S3;
- ``client_put``: Client.get of blobs holding the same bytes, written with ``put_many``:
  small blobs are packed into shared blocks, so each get is a range of a larger object.  No
  goal: SeaweedFS serves a range of a large object at about half its rate of small objects
  whole (obstore, 323,000-byte ranges of 32 MiB objects, 8 in flight: ~480/s, against
  ~1,100/s whole), and this row reads at that rate: see ``obstore_put``;
- ``obstore_put``: obstore's ranged GETs of the very byte ranges ``client_put`` reads (the
  ranges its read plans name), the server's rate for them, not a peer: reported as
  ``client_put_vs_obstore_put_323KB``.

Reported per row: objects/s (``*_objps_323KB``) and CPU s per GB; the blobsdk rows against
the best of obstore, boto3 and s3torch *in each round* (``store_vs_best_323KB`` and
``client_vs_best_323KB``, median [min, max] over the rounds; goal >= 1.0), and against each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import obstore
from obstore.store import S3Store

import blobsdk
from blobsdk.sources import S3BlockStore
from blobsdk.sources.base import new_block_id

from ._report import Report, median
from ._s3_rows import BUCKET, CONCURRENCY, Boto3, Read, Row, check, rounds_of, s3_client
from ._servers import scoped_environ

OBJECT_BYTES = 323_000  # MLPerf Storage's retinanet-like sample (~323 KB)
LABEL = "323KB"
PEERS = ("obstore", "boto3", "s3torch")
OURS = ("store", "client", "client_put")
GOALS = ("store", "client")  # client_put's gap is the server's (see the module docstring)
GOAL = ">= 1.0"
INDEXED = "/bench/indexed/"  # the objects indexed in place: the blob of key objects/K is INDEXED + K


async def measure_objects(config: dict[str, str], redis_url: str, count: int, rounds: int) -> dict[str, Row]:
    """Write ``count`` objects, then time every row reading each of them whole, ``rounds`` times."""
    store = S3BlockStore(BUCKET, "objects", config=config, allow_http=True)
    with _aws_env(config), _S3Torch(config) as torch:
        async with store, Boto3(config) as boto, s3_client(config, redis_url, "objects") as client:
            data = {new_block_id(): os.urandom(OBJECT_BYTES) for _ in range(count)}
            await asyncio.gather(*(store.write_block(block, [body]) for block, body in data.items()))
            await client.index_s3(f"s3://{BUCKET}/objects", INDEXED)
            paths = [f"/bench/objects/{i:05d}" for i in range(count)]
            await client.put_many(zip(paths, data.values(), strict=True))
            order = list(range(count))
            random.Random(count).shuffle(order)  # not in the order they were written
            blocks, paths = [list(data)[i] for i in order], [paths[i] for i in order]
            reads = _reads(store, boto, torch, client, config, blocks, data, paths)
            reads["obstore_put"] = await _put_ranges(client, config, paths, [data[block] for block in blocks])
            return await rounds_of(reads, count, OBJECT_BYTES, rounds)


def _reads(
    store: S3BlockStore,
    boto: Boto3,
    torch: _S3Torch,
    client: blobsdk.Client,
    config: dict[str, str],
    blocks: list[str],
    data: dict[str, bytes],
    paths: list[str],
) -> dict[str, Read]:
    """Each row's read of object ``i``, checked."""
    raw = S3Store(BUCKET, config=config, client_options={"allow_http": True})  # type: ignore[arg-type]
    keys = [store._full_key(block) for block in blocks]
    indexed = [INDEXED + store._key(block) for block in blocks]
    want = [data[block] for block in blocks]  # paths[i] holds the same bytes as blocks[i]

    async def via_obstore(i: int) -> None:
        got = await (await obstore.get_async(raw, keys[i])).bytes_async()
        check(got == want[i], "obstore", i)

    async def via_boto3(i: int) -> None:
        check(await boto.get_whole(keys[i]) == want[i], "boto3", i)

    async def via_s3torch(i: int) -> None:
        check(await torch.get(keys[i]) == want[i], "s3torch", i)

    async def via_store(i: int) -> None:
        out = bytearray(OBJECT_BYTES)
        await store.read_into(blocks[i], 0, memoryview(out))
        check(out == want[i], "store", i)

    async def via_client(i: int) -> None:
        check(await client.get(indexed[i]) == want[i], "client", i)

    async def via_client_put(i: int) -> None:
        check(await client.get(paths[i]) == want[i], "client_put", i)

    reads = {"obstore": via_obstore, "boto3": via_boto3, "s3torch": via_s3torch, "store": via_store}
    return reads | {"client": via_client, "client_put": via_client_put}


async def _put_ranges(client: blobsdk.Client, config: dict[str, str], paths: list[str], want: list[bytes]) -> Read:
    """obstore's read of the byte range blob ``paths[i]``'s plan names, checked."""
    raw = S3Store(BUCKET, config=config, client_options={"allow_http": True})  # type: ignore[arg-type]
    layout = S3BlockStore(BUCKET, "client-objects", config=config, allow_http=True)  # s3_client()'s blocks
    refs = [(await client._open.metadata.get_plan(path)).chunks[0] for path in paths]
    assert all(ref.length == OBJECT_BYTES for ref in refs)  # one uncompressed chunk each

    async def via_obstore_put(i: int) -> None:
        ref = refs[i]
        got = await obstore.get_range_async(raw, layout._full_key(ref.block_id), start=ref.offset, length=ref.length)
        check(got == want[i], "obstore_put", i)

    return via_obstore_put


def record_objects(report: Report, rows: dict[str, Row], server_cpu_s: float) -> None:
    """Each row's objects/s and CPU s/GB; ours against the best peer of each round, and each peer."""
    rates = {name: [rate * 1e6 / OBJECT_BYTES for rate in row.rates] for name, row in rows.items()}
    for name, row in rows.items():
        report.metrics[f"{name}_objps_{LABEL}"] = median(rates[name])
        report.metrics[f"{name}_cpu_s_per_GB_{LABEL}"] = row.cpu_s / (row.bytes_read / 1e9)
    best = [max(round_rates) for round_rates in zip(*(rates[peer] for peer in PEERS), strict=True)]
    for name in OURS:
        for against, base in [("best", best), *((peer, rates[peer]) for peer in PEERS)]:
            ratios = [ours / theirs for ours, theirs in zip(rates[name], base, strict=True)]
            key = f"{name}_vs_{against}_{LABEL}"
            report.ratios[key] = median(ratios)
            report.ratios[f"{key}_min"] = min(ratios)
            report.ratios[f"{key}_max"] = max(ratios)
        if name in GOALS:
            report.goals[f"{name}_vs_best_{LABEL}"] = GOAL
    ratios = [ours / theirs for ours, theirs in zip(rates["client_put"], rates["obstore_put"], strict=True)]
    key = f"client_put_vs_obstore_put_{LABEL}"
    report.ratios.update({key: median(ratios), f"{key}_min": min(ratios), f"{key}_max": max(ratios)})
    total = sum(row.bytes_read for row in rows.values())
    report.metrics[f"seaweed_cpu_s_per_GB_{LABEL}"] = server_cpu_s / (total / 1e9)


def _aws_env(config: Mapping[str, str]) -> contextlib.AbstractContextManager[None]:
    """The store's keys in ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (s3torchconnector's
    CRT client reads only the standard chain), put back as they were afterwards."""
    return scoped_environ({"AWS_ACCESS_KEY_ID": config["access_key_id"], "AWS_SECRET_ACCESS_KEY": config["secret_access_key"]})


class _S3Torch:
    """s3torchconnector's S3Client (the one its datasets make; not in its ``__all__``) used
    from ``CONCURRENCY`` threads (its reads block)."""

    def __init__(self, config: Mapping[str, str]) -> None:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client

        self._client: Any = S3Client(
            config["region"], endpoint=config["endpoint"], s3client_config=S3ClientConfig(force_path_style=True)
        )
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="s3torch")

    def __enter__(self) -> _S3Torch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown()

    def _get(self, key: str) -> bytes:
        body: bytes = self._client.get_object(BUCKET, key).read()
        return body

    async def get(self, key: str) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._get, key)
