"""The disk cache's index file, ``root/INDEX``: the index as it was when the cache closed, so
that a restart is back in service without reading a million headers (a restart with 10^6
chunks in <= 2 s; reading every header took ~80 s per million on the dev machine).

Layout: a fixed header (magic, version, body length, xxh3-64 of the body, the engine clock and
the wall clock when written), then the body: the entries, least recently used first, as
msgpack arrays (``policy.Entry`` is an array-like msgspec Struct, decoded in C).

The file is a hint, never trusted for bytes: every read still verifies the entry's file, and
the cache reconciles the index with the directory in the background after loading it
(blobsdk/cache/_disk.py).  A file that is torn, of another version, or fails its checksum is
ignored (the cache scans instead).  Times are moved onto this run's engine clock by the wall
clock's progress since the file was written (ages, like the file times a scan reads); pins are
not kept.

Nor is it trusted for its entries: any process sharing the directory can write one with a
valid checksum.  An entry is kept only if it is one this cache writes: a size from 0 to 2^40
bytes, times that are finite and not after the file's own clock, a tenant name
(``validate_tenant``), and a chunk key (the one rule, blobsdk/cache/base.py ``validate_key``);
a key listed twice is the index's to settle (``Index.load``).  The others are dropped and
counted for the caller's one warning; their files, if any, are read by their headers when the
reconciliation meets them.

:func:`read_index` checks all but a key's digits, on the restart's path: the usual file whole
and in C as it decodes (and its times in the pass that moves them onto this run's clock), and
only a file that fails that entry by entry, to drop the bad ones.  A key there is a string of
32 characters; whether they are lowercase hex digits is :func:`by_shard_of`, which the cache
asks first when it reconciles, in the background: gathering a million separate strings to
look at their digits costs ~8% of a restart, the rest ~3%.  Until then such a key names no
file (every file operation takes chunk keys only: blobsdk/cache/_diskfiles.py): a request
cannot name it, and its eviction removes nothing.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, cast

import msgspec
import xxhash

from ..chunks import is_hex32
from ..errors import BadRequest
from ..runtime import UnsafeEntry, read_root_file, write_root_file
from .base import DEFAULT_TENANT, validate_key
from .policy import Entry, validate_tenant

INDEX_FILE = "INDEX"
_MAX_ENTRY_BYTES = 1 << 40  # no chunk is near it (the largest a plan may name is 64 MiB)
_MAGIC = b"BSDI"
_VERSION = 1
_HEAD = struct.Struct("<4sB3xQQdd")  # magic, version, body length, body xxh3-64, engine clock, wall clock
_TIME = msgspec.Meta(ge=-1e18, le=1e18)  # finite: a NaN or an infinity fails both
_HEX_DIGITS = b"0123456789abcdef"
_MAX_WHY = 200  # characters of a dropped entry's problem in the warning (it may quote a long tenant name)


class _Listed(Entry, array_like=True, gc=False):
    """An entry as the file may list it, checked in C as it decodes (but a key's digits:
    :func:`by_shard_of`)."""

    key: Annotated[str, msgspec.Meta(min_length=32, max_length=32)]
    size: Annotated[int, msgspec.Meta(ge=0, le=_MAX_ENTRY_BYTES)]
    created: Annotated[float, _TIME]
    last_access: Annotated[float, _TIME]
    tenant: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] = DEFAULT_TENANT


class _Quick(_Listed, array_like=True, gc=False):
    """:class:`_Listed` for the whole-file check: a tenant of at most 63 characters has at most
    252 UTF-8 bytes, so it needs no count of its bytes (a longer one sends the file to the
    entry-by-entry check, which counts them)."""

    tenant: Annotated[str, msgspec.Meta(min_length=1, max_length=63)] = DEFAULT_TENANT


_WHOLE = msgspec.msgpack.Decoder(list[_Quick])
_ROWS = msgspec.msgpack.Decoder(list[msgspec.Raw])
_ONE = msgspec.msgpack.Decoder(_Listed)


@dataclass(slots=True)
class Dropped:
    """The entries of an index file that one open dropped, for its one warning: how many of
    the ``listed``, and why the first was."""

    listed: int
    count: int = 0
    first: str = ""

    def add(self, why: str, count: int = 1) -> None:
        if not self.count:
            self.first = why if len(why) <= _MAX_WHY else why[:_MAX_WHY] + "..."
        self.count += count

    def describe(self, path: object) -> str:
        return (
            f"dropped {self.count} of the {self.listed} entries of {path}, not as this cache writes them "
            f"(the first: {self.first}); their files, if any, are indexed by their headers"
        )


@dataclass(slots=True)
class Listing:
    """What an index file lists: the entries kept (least recently used first) and the others."""

    entries: list[Entry]
    dropped: Dropped


def write_index(root: str, entries: list[Entry], now: float, token: str) -> None:
    """Write ``entries`` (least recently used first) as ``root/INDEX``, atomically (a temp
    file renamed over it; no fsync: a torn file fails its checksum and is ignored)."""
    body = msgspec.msgpack.encode(entries)
    head = _HEAD.pack(_MAGIC, _VERSION, len(body), xxhash.xxh3_64_intdigest(body), now, time.time())
    write_root_file(root, INDEX_FILE, [head, body], token, durable=False)


def read_index(root: str, now: float) -> Listing | None:
    """What ``root/INDEX`` lists: the entries that pass, on the engine clock ``now`` (least
    recently used first), and the count of the others; None if there is no usable index file."""
    try:
        data = read_root_file(root, INDEX_FILE)
    except UnsafeEntry:
        raise  # the caller ignores it, with a warning naming it
    except OSError:  # unreadable: the headers are read instead
        return None
    if data is None:
        return None
    return _decode(memoryview(data), now)


def _decode(data: memoryview, now: float) -> Listing | None:
    if len(data) < _HEAD.size:
        return None
    magic, version, length, checksum, then, wall = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if (magic, version, length) != (_MAGIC, _VERSION, len(body)) or xxhash.xxh3_64_intdigest(body) != checksum:
        return None
    if not (math.isfinite(then) and math.isfinite(wall)):
        return None
    # An entry's age is its age when written plus the wall time since (none if the wall clock
    # stepped back): t + shift <= now, as every t <= then.
    shift = now - then - max(0.0, time.time() - wall)
    whole = _whole(body, then, shift)
    return Listing(whole, Dropped(len(whole))) if whole is not None else _sift(body, then, shift)


def _whole(body: memoryview, then: float, shift: float) -> list[Entry] | None:
    """Every entry, moved by ``shift``, if every one is as this cache writes it (module
    docstring); else None."""
    try:
        entries = cast("list[Entry]", _WHOLE.decode(body))
    except msgspec.DecodeError:  # a ValidationError too
        return None
    for entry in entries:  # (one pass: checked and moved)
        created, last = entry.created, entry.last_access
        if created > then or last > then:
            return None
        entry.created, entry.last_access, entry.pin_until = created + shift, last + shift, 0.0
    return entries


def _sift(body: memoryview, then: float, shift: float) -> Listing | None:
    """The entries that pass, one by one, moved by ``shift``, and the count of the others;
    None if the body is not even a list."""
    try:
        rows = _ROWS.decode(body)
    except msgspec.DecodeError:
        return None
    listing = Listing([], Dropped(len(rows)))
    for n, row in enumerate(rows):
        try:
            entry = _ONE.decode(row)
            problem = _problem(entry, then)
        except msgspec.DecodeError as exc:
            problem = str(exc)
        if problem is None:
            entry.created, entry.last_access, entry.pin_until = entry.created + shift, entry.last_access + shift, 0.0
            listing.entries.append(entry)
        else:
            listing.dropped.add(f"entry {n}: {problem}")
    return listing


def _problem(entry: Entry, then: float) -> str | None:
    """What is wrong with an entry that decoded (None: nothing)."""
    try:
        validate_tenant(entry.tenant)
    except BadRequest as exc:
        return str(exc)
    if entry.created > then or entry.last_access > then:
        return f"its times ({entry.created}, {entry.last_access}) are after the file's clock ({then})"
    return None


def by_shard_of(entries: list[Entry]) -> tuple[dict[str, list[Entry]], list[Entry], str]:
    """A listing's entries grouped by shard, for the reconciliation, but for those whose key is
    not a chunk key (the one rule, blobsdk/cache/base.py ``validate_key``), set apart with why
    the first is not: the index file's second check (module docstring).  All keys are looked
    at in one pass; entry by entry only if that fails."""
    keys = "".join(map(attrgetter("key"), entries))
    foreign: list[Entry] = []
    why = ""
    if not keys.isascii() or keys.encode("ascii").translate(None, _HEX_DIGITS):
        foreign = [e for e in entries if not is_hex32(e.key)]
        try:
            validate_key(foreign[0].key)
        except BadRequest as exc:
            why = str(exc)
        bad = set(map(id, foreign))
        entries = [e for e in entries if id(e) not in bad]
    grouped: dict[str, list[Entry]] = {}
    for entry in entries:
        grouped.setdefault(entry.key[:2], []).append(entry)
    return grouped, foreign, why
