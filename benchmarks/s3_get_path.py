"""``python -m benchmarks.s3_get_path [--quick] [--endpoint URL --bucket B]``: the S3 L4's
read path (issue 21 item 2) against raw obstore, on the same ranges of the same objects.

Three ways, each reading every range once, ``CONCURRENCY`` at a time, every byte checked:
- ``obstore``: ``obstore.get_range_async`` (what the L4 used to read with);
- ``signed GET``: blobsdk.sources.s3get.S3Getter (SigV4 over the SDK's own HTTP GET path,
  the body received into the caller's buffer), what the L4 reads with now;
- ``S3BlockStore``: the whole L4 read (limiter, deadline, error mapping) over it.

Figures: MB/s of wall time and CPU seconds per GB (this process's, all threads: obstore's
Rust runtime included).  Without ``--endpoint`` it starts moto (servers/s3d.py), whose own
speed (~0.08 GB/s) caps every row: against moto the figures compare the clients' CPU, not
their speed; the issue's target (>= 0.9 of raw obstore) is for a real store (SeaweedFS).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable

import obstore
from obstore.store import S3Store

from blobsdk.sources.base import new_block_id
from blobsdk.sources.s3 import S3BlockStore
from blobsdk.sources.s3get import S3Getter, S3Target, target_of

CONCURRENCY = 8
MiB = 1 << 20


async def _timed(reads: list[Callable[[], Awaitable[None]]]) -> tuple[float, float]:
    """(wall s, CPU s) of running ``reads``, CONCURRENCY at a time."""
    queue = list(reversed(reads))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(config: dict[str, str], bucket: str, *, objects: int, object_bytes: int, range_bytes: int) -> None:
    store = S3BlockStore(bucket, "bench-get", config=config, allow_http=True)
    data = {new_block_id(): os.urandom(object_bytes) for _ in range(objects)}
    await asyncio.gather(*(store.write_block(block, [body]) for block, body in data.items()))
    rng = random.Random(0)
    ranges = [(b, rng.randrange(0, object_bytes - range_bytes + 1)) for b in data for _ in range(object_bytes // range_bytes)]
    rng.shuffle(ranges)
    raw = S3Store(bucket, prefix="bench-get", config=config, client_options={"allow_http": True})  # type: ignore[arg-type]
    target = target_of(config, True)
    assert isinstance(target, S3Target), target
    getter = S3Getter(target, timeout_s=30, max_retries=3)

    def via_obstore(block: str, at: int) -> Callable[[], Awaitable[None]]:
        async def read() -> None:
            got = await obstore.get_range_async(raw, store._key(block), start=at, length=range_bytes)
            assert memoryview(got) == memoryview(data[block])[at : at + range_bytes]

        return read

    def via_signed_get(block: str, at: int) -> Callable[[], Awaitable[None]]:
        async def read() -> None:
            out = bytearray(range_bytes)
            assert await getter.get_into(bucket, store._full_key(block), memoryview(out), start=at) == range_bytes
            assert out == memoryview(data[block])[at : at + range_bytes]

        return read

    def via_store(block: str, at: int) -> Callable[[], Awaitable[None]]:
        async def read() -> None:
            out = bytearray(range_bytes)
            await store.read_into(block, at, memoryview(out))
            assert out == memoryview(data[block])[at : at + range_bytes]

        return read

    total = len(ranges) * range_bytes
    print(f"{len(ranges)} ranges of {range_bytes >> 10} KiB ({total / MiB:.0f} MiB), {CONCURRENCY} at a time, every byte checked")
    print(f"{'path':<14} {'MB/s':>8} {'CPU s/GB':>9} {'ratio':>6}")
    results = {}
    for name, make in (("obstore", via_obstore), ("signed GET", via_signed_get), ("S3BlockStore", via_store)):
        await _timed([make(*r) for r in ranges[: CONCURRENCY * 2]])  # warm the connections
        wall, cpu = await _timed([make(*r) for r in ranges])
        results[name] = total / wall / 1e6
        ratio = results[name] / results["obstore"]
        print(f"{name:<14} {results[name]:8.1f} {cpu / (total / 1e9):9.2f} {ratio:6.2f}")
    await getter.aclose()
    await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.s3_get_path", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller objects")
    parser.add_argument("--endpoint", help="an S3 endpoint (keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
    parser.add_argument("--bucket", default="bench-get", help="its bucket (made when moto is started)")
    args = parser.parse_args()
    sizes = {"objects": 2, "object_bytes": 8 * MiB} if args.quick else {"objects": 4, "object_bytes": 32 * MiB}
    for range_bytes in (64 << 10, 1 * MiB):
        if args.endpoint:
            keys = {"access_key_id": os.environ["AWS_ACCESS_KEY_ID"], "secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
            asyncio.run(measure({"endpoint": args.endpoint, **keys}, args.bucket, range_bytes=range_bytes, **sizes))
            continue
        from servers.s3d import start_s3

        with tempfile.TemporaryDirectory() as tmp, start_s3(tmp) as s3:
            s3.make_bucket(args.bucket)
            asyncio.run(measure(s3.config, args.bucket, range_bytes=range_bytes, **sizes))


if __name__ == "__main__":
    main()
