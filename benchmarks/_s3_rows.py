"""The pieces the s3_read rows share (benchmarks/s3_read.py: ranges; benchmarks/_s3_objects.py:
whole objects): the bucket, the concurrency, the timed rounds in a random order, boto3 from a
pool of threads, and a client over an S3 L4."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

import blobsdk
from blobsdk.config import ClientConfig, L1Config, ReadConfig, S3Config, WriteConfig

CONCURRENCY = 8
MiB = 1 << 20
BUCKET = "bench-s3-read"
Read = Callable[[int], Awaitable[None]]  # read range i and check it


@dataclass
class Row:
    rates: list[float]  # MB/s per round
    cpu_s: float = 0.0
    bytes_read: int = 0


def check(ok: bool, row: str, i: int) -> None:
    if not ok:
        raise AssertionError(f"{row}: range {i} came back with the wrong bytes")


async def rounds_of(reads: dict[str, Read], count: int, range_bytes: int, rounds: int) -> dict[str, Row]:
    rows = {name: Row(rates=[]) for name in reads}
    for read in reads.values():  # warm-up: connections, plans
        await timed(read, min(count, 2 * CONCURRENCY))
    shuffle = random.Random(rounds).shuffle  # a new order each round: no row always follows the same one
    for _ in range(rounds):
        order = list(reads)
        shuffle(order)
        for name in order:
            wall, cpu = await timed(reads[name], count)
            row = rows[name]
            row.rates.append(count * range_bytes / wall / 1e6)
            row.cpu_s += cpu
            row.bytes_read += count * range_bytes
    return rows


async def timed(read: Read, count: int) -> tuple[float, float]:
    """(wall s, CPU s of this process) of reads 0..count-1, CONCURRENCY at a time."""
    todo = iter(range(count))

    async def worker() -> None:
        for i in todo:
            await read(i)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - wall, time.process_time() - cpu


class Boto3:
    """A boto3 S3 client used from ``CONCURRENCY`` threads (boto3 clients are thread-safe)."""

    def __init__(self, config: dict[str, str]) -> None:
        import boto3
        from botocore.config import Config

        self._client: Any = boto3.client(
            "s3",
            endpoint_url=config["endpoint"],
            region_name=config["region"],
            aws_access_key_id=config["access_key_id"],
            aws_secret_access_key=config["secret_access_key"],
            config=Config(max_pool_connections=CONCURRENCY, s3={"addressing_style": "path"}),
        )
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="boto3")

    async def __aenter__(self) -> Boto3:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._pool.shutdown()
        self._client.close()

    def _get(self, key: str, start: int, length: int) -> bytes:
        reply = self._client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{start + length - 1}")
        body: bytes = reply["Body"].read()
        return body

    async def get(self, key: str, start: int, length: int) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._get, key, start, length)

    def _get_whole(self, key: str) -> bytes:
        body: bytes = self._client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return body

    async def get_whole(self, key: str) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._get_whole, key)


def s3_client(config: dict[str, str], redis_url: str, name: str, chunk_size: int = 4 * MiB) -> blobsdk.Client:
    """A client over an S3 L4 (its blocks under ``client-NAME``), one chunk per blob."""
    s3 = msgspec.convert({**config, "allow_http": True}, S3Config)
    return blobsdk.Client(
        ClientConfig(
            metadata_url=redis_url,
            source_url=f"s3://{BUCKET}/client-{name}",
            s3=s3,
            l1=L1Config(capacity_bytes=0),  # every get reads L4
            write=WriteConfig(chunk_size=chunk_size, compression="none"),
            read=ReadConfig(plan_cache_ttl_seconds=3600),  # the data path, not Redis
        )
    )
