"""Blob path rules (DESIGN §1).

A path is ``/bucket/key...``: absolute, a bucket and at least one key segment, UTF-8, at most
1024 bytes once encoded, made of non-empty segments, none of them ``.`` or ``..``, and no
NUL.  A *prefix* for listing follows the same rules except that it may end with ``/``, may be
just ``/`` and may name only a bucket.

Listing (:func:`listing_prefix`): ``/`` lists every bucket; ``/a`` and ``/a/`` list bucket
``a`` only (never ``/a2/...``); a longer prefix is matched as a string inside its bucket, as
S3's ListObjects does: ``/a/dir/`` lists what is under the directory, ``/a/dir`` also
``/a/dir2`` and ``/a/dir.x``, ``/a/logs/2024-`` every key that starts with it.
"""

from __future__ import annotations

from .errors import InvalidPath

MAX_PATH_BYTES = 1024
RESERVED_DIR = ".blobsdk"  # /{bucket}/.blobsdk/: blobsdk's own records
INDEX_DIR = f"{RESERVED_DIR}/chunks"  # the chunk index's entries: /{bucket}/.blobsdk/chunks/<32 hex>
_HEX = frozenset("0123456789abcdef")


def validate_path(path: object) -> str:
    """Return ``path`` unchanged if it is a valid blob path, else raise InvalidPath."""
    text = _check_text(path)
    if text == "/":
        raise InvalidPath("path '/' names no blob")
    segments = text[1:].split("/")
    _check_segments(text, segments)
    if len(segments) == 1:
        raise InvalidPath(f"path {text!r} names a bucket, not a blob: a blob path is /bucket/key")
    return text


def validate_prefix(prefix: object) -> str:
    """Return a valid listing prefix (``/``, ``/bucket``, ``/bucket/dir/``...)."""
    text = _check_text(prefix)
    body = text[1:]
    body = body.removesuffix("/")
    if body:
        _check_segments(text, body.split("/"))
    elif text != "/":
        raise InvalidPath(f"invalid prefix {text!r}: empty segment")
    return text


def listing_prefix(prefix: object) -> str:
    """A valid listing prefix, a bare bucket (``/a``) made ``/a/`` so that it never matches
    another bucket whose name starts with it."""
    text = validate_prefix(prefix)
    return text + "/" if text != "/" and "/" not in text[1:] else text


def validate_writable(path: object) -> str:
    """Return ``path`` unchanged if a user may write or delete it: a valid blob path outside
    the reserved namespace; else InvalidPath."""
    text = validate_path(path)
    refuse_reserved(text)
    return text


def is_reserved(path: str) -> bool:
    """Whether a valid path or prefix lies in its bucket's reserved namespace
    (``/{bucket}/.blobsdk``, or under ``/{bucket}/.blobsdk/``)."""
    parts = path.split("/", 3)
    return len(parts) >= 3 and parts[2] == RESERVED_DIR


def refuse_reserved(path: str) -> None:
    """InvalidPath if a valid path or prefix lies in the reserved namespace."""
    if is_reserved(path):
        bucket = bucket_of(path)
        raise InvalidPath(
            f"path {path!r}: /{bucket}/{RESERVED_DIR}/ is reserved for blobsdk's own records"
            " (it can be read and listed, not written or deleted)"
        )


def is_index_entry(path: str) -> bool:
    """Whether ``path`` is exactly a chunk index entry: ``/{bucket}/.blobsdk/chunks/<32 hex>``."""
    parts = path.split("/")
    return len(parts) == 5 and parts[2:4] == INDEX_DIR.split("/") and len(parts[4]) == 32 and _HEX.issuperset(parts[4])


def bucket_of(path: str) -> str:
    """The bucket (first segment) of a valid path."""
    return path.split("/", 2)[1]


def _check_text(path: object) -> str:
    if not isinstance(path, str):
        raise InvalidPath(f"path must be str, not {type(path).__name__}")
    if not path:
        raise InvalidPath("path is empty")
    if "\x00" in path:
        raise InvalidPath("path contains NUL")
    if not path.startswith("/"):
        raise InvalidPath(f"path must be absolute (start with '/'): {path!r}")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidPath(f"path is not valid UTF-8: {path!r}") from exc
    if size > MAX_PATH_BYTES:
        raise InvalidPath(f"path is {size} bytes, over the limit of {MAX_PATH_BYTES}")
    return path


def _check_segments(path: str, segments: list[str]) -> None:
    for segment in segments:
        if segment == "":
            raise InvalidPath(f"empty segment ('//' or trailing '/') in {path!r}")
        if segment in (".", ".."):
            raise InvalidPath(f"'{segment}' segment in {path!r}")
