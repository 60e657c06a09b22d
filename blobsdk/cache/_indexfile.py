"""The disk cache's index file, ``root/INDEX``: the index as it was when the cache closed, so
that a restart is back in service without reading a million headers (issue 27: a restart with
10^6 chunks in <= 2 s; reading every header took ~80 s per million on the dev machine).

Layout: a fixed header (magic, version, body length, xxh3-64 of the body, the engine clock and
the wall clock when written), then the body: the entries, least recently used first, as
msgpack arrays (``policy.Entry`` is an array-like msgspec Struct, decoded in C).

The file is a hint, never trusted for bytes: every read still verifies the entry's file, and
the cache reconciles the index with the directory in the background after loading it
(blobsdk/cache/disk.py).  A file that is torn, of another version, or fails its checksum is
ignored (the cache scans instead).  Times are moved onto this run's engine clock by the wall
clock's progress since the file was written (ages, like the file times a scan reads); pins are
not kept.
"""

from __future__ import annotations

import struct
import time

import msgspec
import xxhash

from ..runtime.rootdir import UnsafeEntry, read_root_file, write_root_file
from .policy import Entry

INDEX_FILE = "INDEX"
_MAGIC = b"BSDI"
_VERSION = 1
_HEAD = struct.Struct("<4sB3xQQdd")  # magic, version, body length, body xxh3-64, engine clock, wall clock
_DECODER = msgspec.msgpack.Decoder(list[Entry])


def write_index(root: str, entries: list[Entry], now: float, token: str) -> None:
    """Write ``entries`` (least recently used first) as ``root/INDEX``, atomically (a temp
    file renamed over it; no fsync: a torn file fails its checksum and is ignored)."""
    body = msgspec.msgpack.encode(entries)
    head = _HEAD.pack(_MAGIC, _VERSION, len(body), xxhash.xxh3_64_intdigest(body), now, time.time())
    write_root_file(root, INDEX_FILE, [head, body], token, durable=False)


def read_index(root: str, now: float) -> list[Entry] | None:
    """The entries of ``root/INDEX`` on the engine clock ``now`` (least recently used first),
    or None if there is no usable index file."""
    try:
        data = read_root_file(root, INDEX_FILE)
    except UnsafeEntry:
        raise  # the caller ignores it, with a warning naming it
    except OSError:  # unreadable: the headers are read instead
        return None
    if data is None:
        return None
    return _decode(memoryview(data), now)


def _decode(data: memoryview, now: float) -> list[Entry] | None:
    if len(data) < _HEAD.size:
        return None
    magic, version, length, checksum, then, wall = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if (magic, version, length) != (_MAGIC, _VERSION, len(body)) or xxhash.xxh3_64_intdigest(body) != checksum:
        return None
    try:
        entries = _DECODER.decode(body)
    except msgspec.DecodeError:
        return None
    # An entry's age is its age when written plus the wall time since (none if the wall clock
    # stepped back): t + shift <= now, as every t <= then.
    shift = now - then - max(0.0, time.time() - wall)
    for entry in entries:
        entry.created += shift
        entry.last_access += shift
        entry.pin_until = 0.0
    return entries
