"""The one exception tree of blobsdk.

    BlobError
     ├── BlobNotFound          (also FileNotFoundError)  no such blob
     │    └── BlockNotFound    a block named by a read plan is gone (blob deleted or replaced)
     ├── InvalidPath           (also ValueError)          path breaks the rules of paths.py
     ├── PreconditionFailed    compare-and-swap on the version did not match
     ├── CorruptData           no tier could return bytes matching the chunk checksum
     ├── QuotaExceeded         a tenant's byte quota would be exceeded
     ├── Unauthorized          (also PermissionError)     bad or missing bearer token
     ├── Unavailable           a server or quorum could not be reached in time
     ├── BadRequest            (also ValueError)          a server rejected a malformed or oversized request
     └── ClientClosed          (also RuntimeError)        the client was used outside `async with`

Backends translate foreign errors (aiohttp, sqlite3, OSError) at the boundary where they meet
them: ``raise Unavailable(...) from exc``.  Servers send errors as ``ErrorBody(code, message)``
and clients map ``code`` back to the same class with :func:`error_from_code`.
"""

from __future__ import annotations


class BlobError(Exception):
    """Base class of every expected failure the SDK raises."""

    code = "error"
    http_status = 500


class BlobNotFound(BlobError, FileNotFoundError):
    code = "not_found"
    http_status = 404


class BlockNotFound(BlobNotFound):
    code = "block_not_found"
    http_status = 404


class InvalidPath(BlobError, ValueError):
    code = "invalid_path"
    http_status = 400


class PreconditionFailed(BlobError):
    code = "precondition_failed"
    http_status = 412


class CorruptData(BlobError):
    code = "corrupt_data"
    http_status = 502


class QuotaExceeded(BlobError):
    code = "quota_exceeded"
    http_status = 429


class Unauthorized(BlobError, PermissionError):
    code = "unauthorized"
    http_status = 401


class Unavailable(BlobError):
    code = "unavailable"
    http_status = 503


class BadRequest(BlobError, ValueError):
    code = "bad_request"
    http_status = 400


class ClientClosed(BlobError, RuntimeError):
    code = "client_closed"
    http_status = 500


_BY_CODE: dict[str, type[BlobError]] = {
    cls.code: cls
    for cls in (
        BlobError,
        BlobNotFound,
        BlockNotFound,
        InvalidPath,
        PreconditionFailed,
        CorruptData,
        QuotaExceeded,
        Unauthorized,
        Unavailable,
        BadRequest,
    )
}


def error_from_code(code: str, message: str) -> BlobError:
    """The exception a server's error ``code`` stands for (unknown codes -> BlobError)."""
    return _BY_CODE.get(code, BlobError)(message)
