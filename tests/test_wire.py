import msgspec

from blobsdk.wire import ChunkRef, ReadPlan, encode, etag_of


def ref(**kw):
    base = {"block_id": "a" * 32, "offset": 0, "length": 10, "raw_length": 10, "checksum": 7}
    return ChunkRef(**{**base, **kw})


def test_chunk_key_names_the_stored_bytes_and_how_they_verify():
    assert ref().key == ref().key and len(ref().key) == 32
    assert ref().key != ref(offset=10).key
    assert ref().key != ref(length=11).key
    # Another checksum, raw length or codec is another key: nobody can store bytes of their
    # own under the key of a real chunk (issue 9: a tenant poisoning L3).
    assert ref().key != ref(checksum=8).key
    assert ref().key != ref(raw_length=11).key
    assert ref().key != ref(codec="lz4").key


def test_plan_round_trip_msgpack():
    plan = ReadPlan(path="/b/x", version=3, etag="e", size=10, chunk_size=10, chunks=(ref(codec="lz4"),))
    assert msgspec.msgpack.decode(encode(plan), type=ReadPlan) == plan
    assert plan.info().chunks == 1 and plan.block_ids() == {"a" * 32}


def test_etag_depends_on_content_only():
    assert etag_of([ref()], 10) == etag_of([ref(block_id="b" * 32)], 10)
    assert etag_of([ref()], 10) != etag_of([ref(checksum=8)], 10)
