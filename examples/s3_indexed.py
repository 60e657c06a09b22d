"""Objects already in an S3 bucket, read through blobsdk's tiers without copying them.

``client.index_s3("s3://lake/train", "/datasets/train")`` (or ``blobsdk import s3://lake/train
/datasets/train --in-place``) makes each object a blob whose chunks are byte ranges of the
object: the pass reads each object once to checksum it and writes only a tiny link object in
the client's own S3 prefix.  A changed object makes a read of its blob raise SourceChanged
until it is indexed again, and indexing again reads only what changed.

With no arguments this starts a local S3 API (moto's server: ``pip install 'moto[server]'``,
part of the ``dev`` extra) and a local cluster whose L4 is that S3 and whose L3 node reads
through from it; with a real bucket you would point ``client.toml``'s ``source_url`` and
``[s3]`` at your object store instead.  Needs the ``s3`` extra (from a clone: ``pip install -e
'.[s3]'``).

    python examples/s3_indexed.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import obstore
from obstore.store import S3Store

import blobsdk
from blobsdk.config import S3Config
from blobsdk_servers.cluster import start_cluster
from blobsdk_servers.s3d import start_s3

OBJECTS = {f"train/{i:03d}.jpg": bytes([i]) * (100_000 + i) for i in range(20)}


async def main(tmp: Path) -> None:
    with start_s3(tmp / "s3") as s3:
        s3.make_bucket("lake")  # the data lake: objects already there
        s3.make_bucket("blobs")  # blobsdk's own L4: only link objects go here
        lake = S3Store("lake", config=s3.config, client_options={"allow_http": True})
        await asyncio.gather(*(obstore.put_async(lake, key, data) for key, data in OBJECTS.items()))
        print(f"the lake: {len(OBJECTS)} objects under s3://lake/train/ at {s3.endpoint}")

        s3_config = S3Config(allow_http=True, **s3.config)
        async with start_cluster(tmp / "cluster", source="s3://blobs/sdk", s3=s3_config, l3_nodes=1) as cluster:
            assert cluster.config is not None
            async with blobsdk.Client(cluster.config) as c:
                report = await c.index_s3("s3://lake/train", "/datasets/train")
                print(
                    f"indexed in place: {report.indexed} of {report.objects} objects ({report.bytes_indexed} bytes), none copied"
                )

                data = await c.get("/datasets/train/007.jpg")
                assert data == OBJECTS["train/007.jpg"]
                print(f"get /datasets/train/007.jpg: {len(data)} bytes, verified; served by: {served_by(c)}")

                await obstore.put_async(lake, "train/008.jpg", b"a new version")  # the lake changes under us
                try:
                    await c.get("/datasets/train/008.jpg")
                except blobsdk.SourceChanged as exc:
                    print(f"after the object changed: SourceChanged: {exc}")
                else:
                    raise SystemExit("a changed object was read without SourceChanged")
                # (A chunk a tier above L4 already holds is a verified copy of the version that was
                # indexed, and serves it until evicted: the change shows where L4 is read.)
                report = await c.index_s3("s3://lake/train", "/datasets/train")
                print(f"indexed again: {report.indexed} changed object read, {report.unchanged} unchanged not read")
                assert bytes(await c.get("/datasets/train/008.jpg")) == b"a new version"
                print("the new version reads back")
    print("s3_indexed: done")


def served_by(client: blobsdk.Client) -> str:
    stats = client.stats()
    return ", ".join(f"{tier} {stats[tier]['hits']}" for tier in ("l1", "l3", "l4") if stats[tier]["hits"])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="blobsdk-s3-") as tmp:
        asyncio.run(main(Path(tmp)))
