"""blob://'s names (blobsdk/fsspec.py): an fsspec name ``bucket/key`` as a blob path, a
writable one or a directory's listing prefix (each checked by blobsdk/chunks/names.py's rules: a bad
one is InvalidPath, a ValueError), the directories above a name, and the fsspec entries
(``info`` dicts) of a blob and of a directory synthesised from ``/``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..chunks import validate_path, validate_prefix, validate_writable
from ..wire import BlobInfo
from .fsfiles import Entry


def blob_path(name: str) -> str:
    """The blob path of fsspec name ``bucket/key`` (InvalidPath, a ValueError, if bad)."""
    return validate_path("/" + name)


def writable_path(name: str) -> str:
    """The blob path of fsspec name ``bucket/key``, if a user may write or delete it."""
    return validate_writable("/" + name)


def dir_prefix(name: str) -> str:
    """The listing prefix of directory ``name`` (``""`` is the root)."""
    return validate_prefix(f"/{name}/" if name else "/")


def parents(name: str) -> list[str]:
    """The directories above ``name``: ``a/b/c`` -> ``a/b``, ``a``."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def file_entry(info: BlobInfo) -> Entry:
    return {
        "name": info.path[1:],
        "size": info.size,
        "type": "file",
        "version": info.version,
        "etag": info.etag,
        "created": info.created,
        "mtime": datetime.fromtimestamp(info.created, UTC),
    }


def dir_entry(name: str) -> Entry:
    return {"name": name, "size": 0, "type": "directory"}
