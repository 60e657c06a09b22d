"""What the Redis metadata store (blobsdk/metadata/_redis.py) names and reads back: its keys,
and the stored values it decodes, each checked as untrusted (another writer of the same Redis
can put anything there): a path's plan, a listed page, a retryable write's record.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from ..chunks import bucket_of
from ..errors import BadRequest, CorruptData
from ..wire import BlobInfo, ReadPlan
from .base import decode_stored

_page_decoder = msgspec.msgpack.Decoder(builtins.list[BlobInfo], strict=False)  # the numbers come as strings
_plan_decoder = msgspec.msgpack.Decoder(ReadPlan)


@dataclass(frozen=True)
class Keys:
    """The keys of a namespace (the layout is in blobsdk/metadata/_redis.py's docstring)."""

    namespace: str

    def path(self, path: str) -> str:
        return f"{self.stem(bucket_of(path))}{path}"

    def stem(self, bucket: str) -> str:
        """What the keys of a bucket's paths start with."""
        return f"{self.namespace}:{{{bucket}}}:p:"

    def request(self, path: str, request_id: str) -> str:
        """The record of a retryable write (in the slot of the bucket of its first path)."""
        return f"{self.namespace}:{{{bucket_of(path)}}}:r:{request_id}"

    def index(self, bucket: str) -> str:
        return f"{self.namespace}:{{{bucket}}}:idx"

    def refs(self, bucket: str, block_id: str) -> str:
        return f"{self.namespace}:{{{bucket}}}:b:{block_id}"

    @property
    def refs_done(self) -> str:
        return f"{self.namespace}:refs"

    @property
    def buckets(self) -> str:
        return f"{self.namespace}:buckets"

    def fences(self, bucket: str | None) -> str:
        """A bucket's fence set (in its slot, for the commit script), or the global one (None)."""
        return f"{self.namespace}:fences" if bucket is None else f"{self.namespace}:{{{bucket}}}:fences"


def record(raw: bytes, path: str) -> builtins.list[Any]:
    """A retryable write's record, as the scripts stored it (CorruptData if it is not one)."""
    try:
        stored = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise _bad_record(path, str(exc)) from exc
    if not isinstance(stored, builtins.list) or not stored:
        raise _bad_record(path, f"{raw[:100]!r} is no list")
    return stored


def replayed_commit(raw: bytes, paths: builtins.list[str], request_id: str | None) -> tuple[float, builtins.list[int]]:
    """The time and versions of a commit applied before, if it was of ``paths``."""
    stored = record(raw, paths[0])
    if len(stored) != 3 or not isinstance(stored[1], builtins.list) or len(stored[1]) != len(paths):
        raise _bad_record(paths[0], f"{raw[:100]!r} is no commit's")
    if stored[2] != paths:
        raise BadRequest(f"request_id {request_id} was used for another write")
    try:
        return float(stored[0]), [int(v) for v in stored[1]]
    except (TypeError, ValueError) as exc:
        raise _bad_record(paths[0], f"{raw[:100]!r}: {exc}") from exc


def _bad_record(path: str, why: str) -> CorruptData:
    return CorruptData(f"the stored record of a write to {path!r} is corrupt: {why}")


def plan_of(path: str, fields: builtins.list[bytes | None]) -> ReadPlan | None:
    plan, version, created = fields
    if plan is None or version is None or created is None:
        return None
    return decode_stored(
        path, lambda: msgspec.structs.replace(_plan_decoder.decode(plan), version=int(version), created=float(created))
    )


def listed(packed: bytes) -> builtins.list[BlobInfo]:
    """A page the listing script packed; CorruptData naming the first damaged path in it."""
    try:
        return _page_decoder.decode(packed)
    except msgspec.DecodeError:  # a damaged hash: found again, row by row
        rows = msgspec.msgpack.decode(packed)
        return [info(row["path"], [_field(row, name) for name in _LISTED]) for row in rows]


_LISTED = ("version", "size", "etag", "chunks", "created")


def _field(row: dict[str, Any], name: str) -> Any:
    """A listed row's field (a field missing from the hash was false in Lua)."""
    value = row.get(name)
    return None if value is False else value


def info(path: str, fields: Sequence[Any]) -> BlobInfo:
    return decode_stored(path, lambda: _info_of(path, fields))


def _info_of(path: str, fields: Sequence[Any]) -> BlobInfo:
    version, size, etag, chunks, created = fields
    return BlobInfo(
        path=path,
        version=int(version),
        size=int(size),
        etag=etag.decode() if isinstance(etag, bytes) else etag,
        created=float(created),
        chunks=int(chunks),
    )


def redacted(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()
