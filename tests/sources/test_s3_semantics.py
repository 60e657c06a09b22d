"""What blobsdk/sources/_s3.py relies on from an S3 API, checked on moto and on SeaweedFS: ETags,
If-Match on ranged GETs, 412, 404 and 416, pagination, and where SeaweedFS differs from AWS
(listing order; keys it rewrites or refuses)."""

from __future__ import annotations

import asyncio
import hashlib
import os

import obstore
import pytest
from obstore.exceptions import PreconditionError
from obstore.store import S3Store

from blobsdk.errors import CorruptData, SourceChanged
from blobsdk.sources import S3BlockStore, S3Object
from blobsdk.sources._s3obstore import _status
from blobsdk.sources.base import new_block_id
from tests.helpers import S3_STORES, s3_server

MiB = 1 << 20


@pytest.fixture(scope="module", params=S3_STORES)
def s3(request):
    with s3_server(request) as server:
        server.make_bucket("semantics")
        yield server


@pytest.fixture
def bucket(s3) -> S3Store:
    return S3Store("semantics", prefix=f"t{os.urandom(4).hex()}", config=s3.config, client_options={"allow_http": True})


async def test_etags_are_the_md5_or_the_multipart_form_alike_in_put_head_and_listing(bucket):
    data = os.urandom(1000)
    put = await obstore.put_async(bucket, "one", data)
    assert put["e_tag"] == (await obstore.head_async(bucket, "one"))["e_tag"] == f'"{hashlib.md5(data).hexdigest()}"'
    [listed] = [m async for batch in obstore.list(bucket) for m in batch]
    assert listed["e_tag"] == put["e_tag"]  # what index_s3 records, and later sends as If-Match
    await obstore.put_async(bucket, "one", os.urandom(1000))
    assert (await obstore.head_async(bucket, "one"))["e_tag"] != put["e_tag"]
    big = os.urandom(12 * MiB)
    multipart = await obstore.put_async(bucket, "mp", big, use_multipart=True, chunk_size=5 * MiB)
    assert multipart["e_tag"] is not None and multipart["e_tag"].endswith('-3"')
    assert (await obstore.head_async(bucket, "mp"))["e_tag"] == multipart["e_tag"]


async def test_a_ranged_get_with_if_match_is_served_only_while_the_etag_holds(bucket):
    data = os.urandom(1000)
    etag = (await obstore.put_async(bucket, "k", data))["e_tag"]
    got = await obstore.get_async(bucket, "k", options={"if_match": etag, "range": (10, 20)})
    assert bytes(await got.bytes_async()) == data[10:20]
    await obstore.put_async(bucket, "k", os.urandom(1000))
    with pytest.raises(PreconditionError, match=r"status code: 412 Precondition Failed"):
        await obstore.get_async(bucket, "k", options={"if_match": etag, "range": (10, 20)})
    await obstore.delete_async(bucket, "k")
    with pytest.raises(FileNotFoundError):  # 404, not 412: a deleted object is "gone", not "changed"
        await obstore.get_async(bucket, "k", options={"if_match": etag, "range": (10, 20)})


async def test_the_sdk_reads_an_indexed_object_and_sees_it_change(s3, bucket):
    """Through S3BlockStore: a link block's ranged If-Match read, then SourceChanged."""
    async with S3BlockStore("semantics", f"l4-{os.urandom(4).hex()}", config=s3.config, allow_http=True) as store:
        data = os.urandom(3000)
        key = f"{bucket.prefix}/obj"
        whole = S3Store("semantics", config=s3.config, client_options={"allow_http": True})
        etag = (await obstore.put_async(whole, key, data))["e_tag"]
        link = await store.link(S3Object(bucket="semantics", key=key, etag=etag, size=len(data)))
        assert await store.read_range(link, 100, 200) == data[100:300]
        await obstore.put_async(whole, key, os.urandom(3000))
        with pytest.raises(SourceChanged, match=r"^s3://semantics/.*/obj changed since it was indexed"):
            await store.read_range(link, 100, 200)


async def test_a_range_from_past_the_end_is_416_and_one_running_over_it_is_cut_short(s3, bucket):
    await obstore.put_async(bucket, "r", b"0123456789")
    for start in (10, 20):
        with pytest.raises(Exception, match=r"status code: 416 Range Not Satisfiable") as caught:
            await obstore.get_range_async(bucket, "r", start=start, end=start + 2)
        assert _status(caught.value) == 416  # what read_into turns into CorruptData
    assert bytes(await obstore.get_range_async(bucket, "r", start=8, end=12)) == b"89"
    async with S3BlockStore("semantics", f"b-{os.urandom(4).hex()}", config=s3.config, allow_http=True) as store:
        block = new_block_id()
        await store.write_block(block, [b"0123456789"])
        with pytest.raises(CorruptData, match=rf"^block {block}: no 2 bytes at 10: past its end$"):
            await store.read_range(block, 10, 2)
        with pytest.raises(CorruptData, match=rf"^block {block}: 2 bytes at 8, not 4: past its end$"):
            await store.read_range(block, 8, 4)


async def test_a_listing_pages_past_a_thousand_keys_on_seaweedfs(seaweed):
    """(SeaweedFS only: on moto it takes seconds, and moto pages as AWS does.)"""
    seaweed.make_bucket("semantics")
    bucket = S3Store("semantics", prefix=f"p{os.urandom(4).hex()}", config=seaweed.config, client_options={"allow_http": True})
    keys = [f"m/{i:05d}" for i in range(1100)]
    for start in range(0, len(keys), 100):
        await _put_all(bucket, keys[start : start + 100])
    assert [str(m["path"]) async for batch in obstore.list(bucket, prefix="m", chunk_size=1000) for m in batch] == keys


async def test_listing_order_is_utf8_on_moto_and_a_tree_walk_on_seaweedfs(s3, bucket):
    """AWS lists keys in UTF-8 byte order; SeaweedFS walks its directory tree, so "a/b" comes
    right after "a", before "a b", "a-b" and "a.b" (whose bytes sort below "/").  The SDK
    never depends on it: list_blocks sorts, index_s3 reads the whole listing into a dict."""
    keys = ["a", "a b", "a-b", "a.b", "a/b", "a0", "B", "z", "~", "é"]
    await _put_all(bucket, keys)
    listed = [str(m["path"]) async for batch in obstore.list(bucket) for m in batch]
    if s3.name == "SeaweedFS":
        assert listed == ["B", "a", "a/b", "a b", "a-b", "a.b", "a0", "z", "~", "é"]
    else:
        assert listed == sorted(keys, key=str.encode)


async def test_seaweedfs_rewrites_or_refuses_keys_that_aws_takes_as_they_are(s3):
    """An empty segment is dropped ("a//b" is stored as "a/b"); a "." or ".." segment and a
    segment over 255 bytes are refused (400).  moto, like AWS, keeps each key as given."""
    import boto3
    from botocore.exceptions import ClientError

    prefix = f"k{os.urandom(4).hex()}"
    boto = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name=s3.config["region"],
        aws_access_key_id=s3.config["access_key_id"],
        aws_secret_access_key=s3.config["secret_access_key"],
    )
    long_segment = "x" * 256
    weed = s3.name == "SeaweedFS"
    for key in (f"{prefix}/a/../b", f"{prefix}/./b", f"{prefix}/{long_segment}"):
        if weed:
            with pytest.raises(ClientError, match=r"InvalidRequest|KeyTooLongError"):
                boto.put_object(Bucket="semantics", Key=key, Body=b"x")
        else:
            boto.put_object(Bucket="semantics", Key=key, Body=b"x")
    boto.put_object(Bucket="semantics", Key=f"{prefix}/a//c", Body=b"x")
    listed = [o["Key"] for o in boto.list_objects_v2(Bucket="semantics", Prefix=f"{prefix}/a/").get("Contents", [])]
    assert listed == ([f"{prefix}/a/c"] if weed else [f"{prefix}/a/../b", f"{prefix}/a//c"])


async def _put_all(bucket: S3Store, keys: list[str]) -> None:
    await asyncio.gather(*(obstore.put_async(bucket, key, b"") for key in keys))
