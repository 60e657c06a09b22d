"""A client process of a client host (tests/servers/test_partitions.py): ``python -m
tests.servers.peer_process CONFIG`` opens a client of that ``client.toml``, then for each line
``get PATH`` on stdin reads the blob and prints one JSON line: the bytes' sha256 (or the
error), the read's monotonic begin and end (one clock for every namespace of the machine) and
its client's peer and L4 hits so far.  It serves what it read to the other peers until stdin
closes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time

import blobsdk
from blobsdk.config import ClientConfig


async def main(config_path: str) -> None:
    async with blobsdk.Client(ClientConfig.from_toml(config_path)) as client:
        print(json.dumps({"ready": True}), flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            path = line.removeprefix("get ").strip()
            begun = time.monotonic()
            try:
                digest, error = hashlib.sha256(bytes(await client.get(path))).hexdigest(), None
            except blobsdk.BlobError as exc:
                digest, error = None, f"{type(exc).__name__}: {exc}"
            stats = client.stats()
            hits = {tier: int(stats[tier]["hits"]) for tier in ("peer", "l4")}
            peer = {k: v for k, v in stats["peer"].items() if isinstance(v, int) and v}
            answer = {"peer": peer, "sha256": digest, "error": error, "begun": begun, "ended": time.monotonic(), "hits": hits}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
