"""One disk-cache file (blobsdk/cache/_disk.py): a header, then the payload.

The header: magic, version, pad, tenant length, payload length, xxh3-64 of the payload,
xxh3-64 of the header and the key, then the tenant name.  The key is in the header's
checksum, so a file renamed to another key is caught too.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import xxhash

MAGIC = b"BSDC"
VERSION = 1
# magic, version, pad, tenant length, payload length, payload xxh3-64, header xxh3-64
HEAD = struct.Struct("<4sBxHQQQ")
HEAD_READ = HEAD.size + 255  # the fixed part and the longest tenant name in one read


class Damaged(Exception):
    """A file that fails its header or checksum checks (it has been deleted)."""


class Header(NamedTuple):
    """What a file's header says about its payload: owner, length, xxh3-64, start."""

    tenant: str
    length: int
    checksum: int
    offset: int


class Expected(NamedTuple):
    """What the caller knows of the payload (its chunk reference): its xxh3-64 and its length,
    each None if unknown.  A file's header that records otherwise is damaged before anything is
    read past it, or allocated for the length it claims."""

    checksum: int | None = None
    length: int | None = None

    def check(self, head: Header, key: str) -> None:
        if self.checksum is not None and head.checksum != self.checksum:
            raise Damaged(f"{key}: holds other bytes than the caller expects")
        if self.length is not None and head.length != self.length:
            raise Damaged(f"{key}: holds {head.length} bytes, the caller expects {self.length}")


def header_check(fixed: bytes, tenant: bytes, key: str) -> int:
    """Checksum of the header; the key is included, so a misnamed file is caught too."""
    return xxhash.xxh3_64_intdigest(fixed + tenant + key.encode())


def encode_header(key: str, tenant: str, payload: memoryview) -> bytes:
    name = tenant.encode()
    fields = (MAGIC, VERSION, len(name), payload.nbytes, xxhash.xxh3_64_intdigest(payload))
    fixed = HEAD.pack(*fields, 0)[:-8]
    return fixed + header_check(fixed, name, key).to_bytes(8, "little") + name


def decode_header(head: bytes, key: str) -> Header:
    if len(head) < HEAD.size:
        raise Damaged(f"{key}: shorter than a header")
    magic, version, name_len, length, checksum, check = HEAD.unpack_from(head)
    name = head[HEAD.size : HEAD.size + name_len]
    if magic != MAGIC or version != VERSION or len(name) != name_len:
        raise Damaged(f"{key}: not a cache file of version {VERSION}")
    if header_check(head[: HEAD.size - 8], name, key) != check:
        raise Damaged(f"{key}: header checksum mismatch")
    return Header(name.decode("utf-8", "replace"), length, checksum, HEAD.size + name_len)


def read_header(fd: int, key: str) -> tuple[os.stat_result, Header]:
    """The file's stat and header, once they agree on its size (else Damaged)."""
    st = os.fstat(fd)
    head = decode_header(os.pread(fd, HEAD_READ, 0), key)
    if head.offset + head.length != st.st_size:
        raise Damaged(f"{key}: {st.st_size} bytes, header says {head.offset + head.length}")
    return st, head
