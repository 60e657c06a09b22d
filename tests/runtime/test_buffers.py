"""blobsdk/runtime/buffers.py: fresh buffers, mapped when large, and the pool."""

from __future__ import annotations

import mmap

import pytest

from blobsdk.runtime.buffers import MAPPED_FROM, UNZEROED_FROM, BufferPool, fresh_buffer, kept_buffer, uninitialized


@pytest.mark.parametrize("size", [0, 1, MAPPED_FROM - 1])
def test_a_small_buffer_is_a_bytearray_of_zeros(size: int) -> None:
    view = fresh_buffer(size)
    assert isinstance(view.obj, bytearray) and view.nbytes == size and not view.readonly
    assert not any(view)


@pytest.mark.parametrize("size", [MAPPED_FROM, 3 * MAPPED_FROM + 4097])
def test_a_large_buffer_is_a_private_mapping_of_zeros_that_is_writable(size: int) -> None:
    view = fresh_buffer(size)
    assert isinstance(view.obj, mmap.mmap) and view.nbytes == size and not view.readonly
    assert view.tobytes() == bytes(size)
    view[size - 1] = 7
    other = fresh_buffer(size)  # private: another buffer never sees this one's bytes
    assert other[size - 1] == 0 and view[size - 1] == 7


@pytest.mark.parametrize("size", [MAPPED_FROM, 4 * MAPPED_FROM + 1])
def test_a_large_kept_buffer_is_a_private_mapping_of_zeros_that_is_writable(size: int) -> None:
    view = kept_buffer(size)
    assert isinstance(view.obj, mmap.mmap) and view.nbytes == size and not view.readonly
    assert view.tobytes() == bytes(size)
    view[0] = 9
    assert kept_buffer(size)[0] == 0 and view[0] == 9


@pytest.mark.parametrize("size", [0, UNZEROED_FROM, MAPPED_FROM - 1])
def test_a_small_kept_buffer_is_a_writable_bytearray_of_its_size(size: int) -> None:
    view = kept_buffer(size)
    assert isinstance(view.obj, bytearray) and view.nbytes == size and not view.readonly


def test_the_pool_hands_back_what_it_was_given_and_fresh_buffers_past_that() -> None:
    pool = BufferPool(max_bytes=3000)
    given = memoryview(bytearray(1000))
    pool.give(given)
    assert pool.free_bytes == 1000
    assert pool.take(1000) is given and pool.reused == 1 and pool.free_bytes == 0
    other = pool.take(1000)  # the pool is empty: a fresh one
    assert other is not given and other.nbytes == 1000 and pool.reused == 1
    assert pool.take(999).nbytes == 999  # only a buffer of the exact size is reused


def test_the_pool_refuses_parts_read_only_views_and_what_is_past_its_bound() -> None:
    pool = BufferPool(max_bytes=2500)
    whole = memoryview(bytearray(1000))
    pool.give(whole[:500])  # part of a buffer: its owner may still use the rest
    pool.give(memoryview(bytes(1000)))  # read-only
    pool.give(memoryview(bytearray(0)))
    assert pool.free_bytes == 0
    pool.give(memoryview(bytearray(1000)))
    pool.give(memoryview(bytearray(1000)))
    pool.give(memoryview(bytearray(1000)))  # past 2500 bytes
    assert pool.free_bytes == 2000
    with pytest.raises(ValueError, match=r"^max_bytes must be >= 0, got -1$"):
        BufferPool(-1)


def test_the_pool_takes_back_only_bytearrays() -> None:
    """A mapping (a restore's buffer) never goes into the pool: chunk buffers are bytearrays,
    which a whole-chunk get may hand to its reader as they are."""
    pool = BufferPool(max_bytes=8 * MAPPED_FROM)
    pool.give(fresh_buffer(MAPPED_FROM))
    assert pool.free_bytes == 0
    assert isinstance(pool.take(MAPPED_FROM).obj, bytearray)


@pytest.mark.parametrize("size", [0, 1, UNZEROED_FROM - 1])
def test_a_small_uninitialized_buffer_is_a_zeroed_bytearray(size: int) -> None:
    buf = uninitialized(size)
    assert type(buf) is bytearray and len(buf) == size and not any(buf)


@pytest.mark.parametrize("size", [UNZEROED_FROM, 4 * MAPPED_FROM + 3])
def test_a_large_uninitialized_buffer_is_a_writable_bytearray_of_its_size(size: int) -> None:
    buf = uninitialized(size)
    assert type(buf) is bytearray and len(buf) == size
    buf[:] = b"\x07" * size
    assert buf.count(7) == size
    buf.extend(b"x")  # an ordinary bytearray: it grows
    assert len(buf) == size + 1


def test_an_uninitialized_buffer_of_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^size must be >= 0, got -1$"):
        uninitialized(-1)


def test_the_pool_hands_out_unzeroed_buffers_of_the_size_asked() -> None:
    view = BufferPool(max_bytes=0).take(UNZEROED_FROM)
    assert isinstance(view.obj, bytearray) and view.nbytes == UNZEROED_FROM and not view.readonly
