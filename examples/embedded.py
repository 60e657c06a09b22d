"""Embedded blobsdk: SQLite and a local directory, no servers.

put, get (whole and a range), stat, list, put_many, compare-and-swap, delete and gc, first with
the asyncio Client, then with the blocking SyncClient.

    python examples/embedded.py [DIR]     # default: a temporary directory, removed at the end
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

import blobsdk


async def with_the_async_client(root: str) -> None:
    async with blobsdk.Client.local(root) as c:
        info = await c.put("/bucket/hello.txt", b"hello world")
        print(f"put {info.path}: {info.size} bytes, version {info.version}")
        print(f"get {info.path}: {bytes(await c.get(info.path))!r}")
        print(f"get a range: {bytes(await c.get(info.path, offset=6, length=5))!r}")

        await c.put_many((f"/bucket/samples/{i:04d}", bytes([i % 256]) * 1000) for i in range(100))
        listed = [info.path async for info in c.list("/bucket/samples/")]
        print(f"put_many: {len(listed)} small blobs, packed into shared blocks; first {listed[0]}, last {listed[-1]}")

        try:
            await c.put("/bucket/hello.txt", b"stale", if_version=0)  # create-only: it exists
        except blobsdk.PreconditionFailed as exc:
            print(f"compare-and-swap refused: {exc}")
        info = await c.put("/bucket/hello.txt", b"hello again", if_version=info.version)
        print(f"replaced as version {info.version}")

        await c.delete("/bucket/hello.txt")
        try:
            await c.get("/bucket/hello.txt")
        except blobsdk.BlobNotFound:
            print("deleted: a get is BlobNotFound")
        report = await c.gc(grace=3600)  # deletes unreferenced blocks older than an hour
        unreferenced = report.blocks_scanned - report.blocks_referenced
        print(f"gc: {report.blocks_scanned} blocks, {unreferenced} unreferenced (kept until older than the grace)")


def with_the_sync_client(root: str) -> None:
    with blobsdk.SyncClient.local(root) as c:
        c.put("/bucket/sync.txt", b"blocking code uses the same methods")
        print(f"SyncClient get: {bytes(c.get('/bucket/sync.txt'))!r}")
        print(f"SyncClient stat: {c.stat('/bucket/sync.txt')}")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="blobsdk-embedded-") as tmp:
        root = sys.argv[1] if len(sys.argv) > 1 else tmp
        asyncio.run(with_the_async_client(root))
        with_the_sync_client(root)
    print("embedded: done")


if __name__ == "__main__":
    main()
