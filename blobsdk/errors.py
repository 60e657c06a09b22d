"""The one exception tree of blobsdk.

    BlobError
     ├── BlobNotFound          (also FileNotFoundError)  no such blob
     │    ├── BlockNotFound    a block named by a read plan is gone (blob deleted or replaced)
     │    │    └── SourceChanged  an object indexed in place changed or was deleted since
     │    └── PeerNotFound     a tracker does not know the peer (never registered, or aged out)
     ├── InvalidPath           (also ValueError)          path breaks the rules of chunks/names.py
     ├── PreconditionFailed    compare-and-swap on the version did not match
     ├── BlockCollected        a commit names a block garbage collection has taken or is taking
     │                         (the write is not committed; ``put`` writes its blocks anew once)
     ├── CorruptData           no tier could return bytes matching the chunk checksum
     │    ├── BadCopy          one copy failed verification (the reader tries another copy)
     │    ├── BadUpload        a chunk PUT body does not match its reference (422 on the wire)
     │    └── RangeNotSatisfiable  a Range past the end of a block (416 on the wire)
     ├── BufferChanged         the caller's buffer was written while a read filled it: a chunk
     │                         failed its check there, and the store's copy, read again into the
     │                         client's own memory, passed (no store is blamed or counted corrupt)
     ├── QuotaExceeded         a tenant's byte quota would be exceeded
     ├── InsufficientStorage   a cache node could not admit a chunk it was asked to store (507)
     ├── Unauthorized          (also PermissionError)     bad, expired or missing bearer token (401)
     │    └── Forbidden        a valid token that does not allow this (a bucket, an admin
     │                         route, a chunk without a valid grant: 403)
     ├── Unavailable           a server or quorum could not be reached in time
     │    ├── Unreachable      no connection to a server could be made (refused: nothing listens
     │    │                    at its address; an unknown host; no route): ``role``, ``address``
     │    ├── TimedOut         a request got no (complete) answer within its deadline
     │    │    ├── BodyTimedOut  a server stopped waiting for a stalled request body (408)
     │    │    └── ReplyStalled  a reply's body stopped arriving mid-transfer (the data GET's
     │    │                      stall bound): that attempt failed, to retry or fail over
     │    ├── Overloaded       a server shed the request (429 on the wire)
     │    │    └── PeerBusy     a peer's upload slots are all sending (the child moves on)
     │    └── HedgeExhausted   every candidate of a hedged read failed (``failures`` says how)
     ├── BadRequest            (also ValueError)          a malformed or oversized request or argument
     │    ├── PayloadTooLarge  a request body over the server's bound (413)
     │    └── UnsupportedEncoding  a compressed request body, which servers never inflate (415)
     ├── ClientClosed          (also RuntimeError)        the client was used outside `async with`
     ├── NotForkSafe           (also RuntimeError)        what cannot run in a process forked after its
     │                                                    parent used it (S3: obstore; what a parent's
     │                                                    SyncClient started)
     └── IncompatibleFormat    a directory (local block store, disk cache) in an on-disk format
                               this build does not read, or holding something else: refused

    MissingExtra               (an ImportError, not a BlobError) a module needs an optional extra
                               that is not installed; the message names it and the pip install
                               that works where blobsdk came from (pip install -e '<checkout>[torch]')

Subclasses whose ``code`` is their parent's travel as the parent (a client sees a 422
BadUpload as CorruptData); the others map back to themselves.
Backends translate foreign errors (aiohttp, sqlite3, OSError) at the boundary where they meet
them: ``raise Unavailable(...) from exc``.  Servers send errors as ``ErrorBody(code, message)``
and clients map ``code`` back to the same class with :func:`error_from_code`.
"""

from __future__ import annotations

from collections.abc import Sequence


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


class SourceChanged(BlockNotFound):
    """The object a blob was indexed from in place (``blobsdk import --in-place``) changed or
    was deleted since: the bytes its plan names are gone until it is indexed again."""

    code = "source_changed"
    http_status = 404


class PeerNotFound(BlobNotFound):
    code = "peer_not_found"
    http_status = 404


class InvalidPath(BlobError, ValueError):
    code = "invalid_path"
    http_status = 400


class PreconditionFailed(BlobError):
    code = "precondition_failed"
    http_status = 412


class BlockCollected(BlobError):
    """A commit named a block that garbage collection has fenced (it is deleting it, or has):
    nothing was committed.  The writer's blocks are gone or going; write them anew."""

    code = "block_collected"
    http_status = 409


class CorruptData(BlobError):
    code = "corrupt_data"
    http_status = 502


class BadCopy(CorruptData):
    """One copy of a chunk failed verification (the caller tries another copy)."""


class BadUpload(CorruptData):
    """A PUT body that does not match its ChunkRef."""

    http_status = 422


class RangeNotSatisfiable(CorruptData):
    """A Range past the end of the block: 416 on the wire, CorruptData for the client."""

    http_status = 416


class BufferChanged(BlobError):
    """A read into the caller's memory (``get_into``, ``get_many_into``, ``load(into=)``)
    found a chunk's bytes there failing their checksum, and the store's copy, read again into
    memory of the client's own, verified: the buffer was written by someone else while the
    read filled it.  No store is blamed: nothing is counted corrupt, demoted or repaired.
    The buffer's contents are undefined; read again into a buffer nothing else writes."""

    code = "buffer_changed"
    http_status = 500


class QuotaExceeded(BlobError):
    code = "quota_exceeded"
    http_status = 429


class InsufficientStorage(BlobError):
    """A cache could not store a chunk (larger than its capacity, disk full, pinned data)."""

    code = "insufficient_storage"
    http_status = 507


class Unauthorized(BlobError, PermissionError):
    code = "unauthorized"
    http_status = 401


class Forbidden(Unauthorized):
    code = "forbidden"
    http_status = 403


class Unavailable(BlobError):
    code = "unavailable"
    http_status = 503


class Unreachable(Unavailable):
    """No connection to a server could be made: it was refused (nothing listens at the
    address), the host is unknown or has no route, or it never answered the connect (down, or
    cut off by a partition): the request never reached it.  ``role`` names the server ("the API
    server", "a block server"), ``address`` is its host:port, ``reason`` what happened
    ("connection refused"), ``hint`` the likely cause.  Made by the client where it connects
    (blobsdk/net/failures.py); never sent on the wire."""

    def __init__(self, message: str, *, role: str = "", address: str = "", reason: str = "", hint: str = "") -> None:
        super().__init__(message)
        self.role, self.address, self.reason, self.hint = role, address, reason, hint


class TimedOut(Unavailable):
    code = "timed_out"
    http_status = 504


class Overloaded(Unavailable):
    """More requests than a server will queue: 429 on the wire, Unavailable for clients."""

    http_status = 429


class PeerBusy(Overloaded):
    """A peer (the peer tier) has every upload slot sending: the child moves on to its next source."""

    code = "peer_busy"
    http_status = 429


class HedgeExhausted(Unavailable):
    """Every candidate failed.  ``failures`` lists ``(candidate, error)`` in the order the
    attempts failed; the tier maps this to its own error (e.g. CorruptData if a copy was
    bad)."""

    def __init__(self, message: str, failures: Sequence[tuple[object, BaseException]] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)


class BadRequest(BlobError, ValueError):
    code = "bad_request"
    http_status = 400


class PayloadTooLarge(BadRequest):
    code = "payload_too_large"
    http_status = 413


class UnsupportedEncoding(BadRequest):
    """A request with a ``Content-Encoding``: 415 on the wire, BadRequest for the client."""

    http_status = 415


class BodyTimedOut(TimedOut):
    """A request body stalled: 408 on the wire, TimedOut for the client."""

    http_status = 408


class ReplyStalled(TimedOut):
    """A data GET's reply body made no progress for its stall bound (``[timeouts] stall``):
    that attempt failed, and is retried (S3) or failed over (replicas); TimedOut on the wire."""


class ClientClosed(BlobError, RuntimeError):
    code = "client_closed"
    http_status = 500


class NotForkSafe(BlobError, RuntimeError):
    """What cannot run in a process forked after its parent used it (its runtime's threads
    did not survive the fork): a backend (start such workers with "forkserver" or "spawn"),
    or what a parent's SyncClient started (start it again in the child).  The message says
    which, and what to do."""

    code = "not_fork_safe"
    http_status = 500


class IncompatibleFormat(BlobError):
    """A directory whose FORMAT marker names another kind of directory, a version this build
    does not read, or is not a marker: refused at open, nothing in it touched."""

    code = "incompatible_format"
    http_status = 500


class MissingExtra(ImportError):
    """An optional dependency group ("extra") is not installed: the message names the module
    that needs it and the ``pip install`` that fixes it where this blobsdk came from (a checkout:
    ``pip install -e '<checkout>[torch]'``).  An ImportError, so code that treats
    an optional import as absent keeps working; not a BlobError: it is about the install, not
    a store, and never travels on the wire.  Raised by :func:`blobsdk._extras.requires_extra`."""


_BY_CODE: dict[str, type[BlobError]] = {
    cls.code: cls
    for cls in (
        BlobError,
        BlobNotFound,
        BlockNotFound,
        SourceChanged,
        PeerNotFound,
        InvalidPath,
        PreconditionFailed,
        BlockCollected,
        CorruptData,
        QuotaExceeded,
        InsufficientStorage,
        Unauthorized,
        Forbidden,
        Unavailable,
        TimedOut,
        PeerBusy,
        BadRequest,
        PayloadTooLarge,
    )
}


def error_from_code(code: str, message: str) -> BlobError:
    """The exception a server's error ``code`` stands for (unknown codes -> BlobError)."""
    return _BY_CODE.get(code, BlobError)(message)
