"""Buffers for chunks and restores: fresh ones that skip a pass over memory (for a restore's
one large buffer), and a pool that saves a read's transient chunk buffers from the allocator.

A fresh ``bytearray(n)`` is a ``memset`` over pages the kernel has just faulted in and
zeroed: two passes.  A private anonymous mapping is zeroed by the kernel alone, as it is
first touched (by the read that fills it).  For a 256 MiB restore into a fresh buffer on
this machine: 0.22-0.35 s with a bytearray, 0.19-0.23 s with a mapping (4 rounds each, the
rest of the restore the same).

Not huge pages: advising the mapping ``MADV_HUGEPAGE`` made first touches 5x cheaper
(23 ms for 256 MiB) while the kernel had huge pages freed a moment before, and 30x dearer
(700-800 ms) past them, on this VM (free pages handed back to the host must be faulted
back in from it).  Restores took 0.06-0.56 s with them; predictable beats sometimes fast.

A mapping is unmapped when its last view (a numpy array or tensor over it, too) is gone.

Buffers a read fills whole are not zeroed at all (:func:`uninitialized`): ``bytearray(n)``
``memset``s every byte the read then overwrites.  That pass was the largest item of an L3
get's client CPU (22% of the L3 epoch's samples under py-spy: more than receiving the bytes,
15%, or hashing them, 8%), and ~570 us per 4 MiB chunk alone, where taking the same bytes
unzeroed costs ~0.5 us (malloc hands back memory the last chunk freed; a first touch of new
memory is zeroed by the kernel, once).

Chunk buffers stay bytearrays (:meth:`BufferPool.take`): a whole-chunk ``get`` hands its
reader the fetched bytearray itself (readpath.py), and a freed one goes back to the
allocator's heap, where the next one reuses it without a fault; with mappings for chunks the
L3 epoch of benchmarks/tiers.py fell from 1.07-1.12 to 0.58-0.81 of plain HTTP (an extra copy
into a bytearray per get, and every buffer faulted in anew).
"""

from __future__ import annotations

import ctypes
import mmap

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: fault every page in with the mmap call
MAPPED_FROM = 1 << 20  # smaller buffers are bytearrays: a mapping each would cost more in syscalls
# Smaller buffers are zeroed bytearrays: below this the ctypes call costs more than the memset.
UNZEROED_FROM = 16 << 10

# CPython's PyByteArray_FromStringAndSize(NULL, n) mallocs the bytes and leaves them as they are.
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_new_bytearray.restype = ctypes.py_object


def uninitialized(size: int) -> bytearray:
    """A bytearray of ``size`` bytes whose contents are undefined (what its memory held
    before): for a buffer its caller fills whole before anyone reads it (a chunk received
    or read into it; a get's result, every byte of which a chunk fills), and discards on
    any failure part-way.  Never hand one out before it is filled: it may hold bytes this
    process freed earlier."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if size < UNZEROED_FROM:
        return bytearray(size)
    out: bytearray = _new_bytearray(None, size)
    return out


def kept_buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes, zero-filled, for a chunk that will be kept a
    while (the peer tier's fetches, which its serving cache and L1 keep): a private
    mapping of its own, its pages faulted in at once (``MAP_POPULATE``), off the heap.

    Memory a cache keeps while it grows is new memory, each page faulted in once whatever
    the allocator: ~1.7 us a fault here, one a 4 KiB page.  Faulted in by the mmap call, a
    fresh 4 MiB buffer then filled costs 0.35-0.37 s/GB against 0.49-0.52 faulted page by
    page (and 0.11 for the same copy into touched memory); and off the heap, the chunks
    kept leave it to the transient results of gets, which then reuse each other's memory.
    8 readers of 128 MiB (the p2p benchmark's swarm), 3 alternating pairs: the median
    reader's CPU 2.16, 2.05, 1.96 s/GB before, 1.95, 1.92, 1.96 with it; within the
    spread of ``benchmarks p2p --quick`` on a loaded host (docs/benchmarks.md)."""
    if size < MAPPED_FROM:
        return memoryview(uninitialized(size))
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE))


def fresh_buffer(size: int) -> memoryview:
    """A writable, zero-filled buffer of ``size`` bytes."""
    if size < MAPPED_FROM:
        return memoryview(bytearray(size))
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


class BufferPool:
    """Chunk buffers a read is done with, for the next fetches to read into.

    A fetch that nobody keeps (no tier filled, one reader, its bytes copied out: a
    checkpoint restore, or any read of a client without L1) would otherwise take fresh
    memory for every chunk and hand it back to the allocator, which returns it to the
    kernel in bursts: a 256 MiB restore in 1 MiB chunks took 0.11-0.77 s here, with 400 to
    40,000 page faults (sys time, as the allocator trimmed and grew its heap).  The read
    path gives such buffers back (:meth:`give`) and the L3 and L4 tiers take them
    (:meth:`take`); at most ``max_bytes`` wait here.  A buffer is given
    back only by its sole owner, so none is ever in two places; one a hedge's loser read
    into is never given back (its read may still be running in a thread).  Used from the
    event loop's thread only.

    Every read gives back what it copied out of, gets too.  Gets once did not:
    with the pool, cluster gets of L1-less clients measured 15-20% slower ("same client CPU,
    same page faults"), though embedded ones were 1.7x faster.  Measured again,
    alternating pool on and off round by round in one process (64 and 256 MiB gets, 3
    block servers, 12-16 rounds): on/off 0.96 [0.68-1.15], 0.98 [0.60-1.45] and 1.25
    [0.84-1.99] (median [min-max] per round): the slowdown is not there beyond this shared
    host's spread.  Client CPU per GB was equal within 2% in the first two; in the third,
    the pool's rounds took 0.57 s/GB and the others 0.91.  That is where the allocator
    found each get's result: a 64 MiB result came from the heap the freed chunk buffers
    left (3 page faults per GB) or from a new mapping (244,000 per GB, the kernel zeroing
    each page), which way depending on the heap's history: in the first run both modes
    had 3, in the third only the pool's did.  The tiers the pool does not reach take unzeroed buffers instead: L2
    reads on a worker thread, and the peer tier, whose buffers its serving cache keeps (a
    mapping each: :func:`kept_buffer`).
    The peer server sends those very buffers (no copy: on loopback the kernel took each
    4 MiB send whole, 64 of 64, nothing left in asyncio's write buffer).
    """

    def __init__(self, max_bytes: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._free: dict[int, list[memoryview]] = {}
        self._bytes = 0
        self.reused = 0

    def take(self, size: int) -> memoryview:
        """A writable bytearray's view of ``size`` bytes; its contents are undefined."""
        free = self._free.get(size)
        if free:
            self._bytes -= size
            self.reused += 1
            return free.pop()
        return memoryview(uninitialized(size))

    def give(self, buffer: memoryview) -> None:
        """Take back ``buffer``, which its giver no longer uses, if it is a whole writable
        buffer (not a view of part of one) and there is room."""
        size = buffer.nbytes
        if buffer.readonly or not size or self._bytes + size > self.max_bytes or not _whole(buffer):
            return
        self._free.setdefault(size, []).append(buffer)
        self._bytes += size

    @property
    def free_bytes(self) -> int:
        return self._bytes


def _whole(buffer: memoryview) -> bool:
    owner = buffer.obj
    return isinstance(owner, bytearray) and len(owner) == buffer.nbytes and buffer.contiguous
