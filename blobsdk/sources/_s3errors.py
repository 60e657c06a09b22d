"""What a failure of the S3 L4 (blobsdk/sources/_s3.py) means, as blobsdk's errors: the one
error map of obstore's exceptions and of the signed GETs' replies (sources/_s3get.py), so a
status travels in our classes, never in ``__cause__``; and, since every request goes through
it, the place where a process forked after its first obstore request is refused one
(NotForkSafe, saying what to do).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from .._extras import requires_extra

with requires_extra("s3", __name__):
    from obstore.exceptions import BaseError, PermissionDeniedError, PreconditionError, UnauthenticatedError

from ..errors import (
    BlobError,
    BlobNotFound,
    BlockNotFound,
    Forbidden,
    NotForkSafe,
    SourceChanged,
    TimedOut,
    Unauthorized,
    Unavailable,
)
from ._s3get import S3Refused
from ._s3obstore import _first_line, _forked_after_obstore, _listing_error, _unavailable

_FORKED = (
    "S3 {what} (obstore) cannot run in a process forked after its parent used obstore: obstore's runtime threads do "
    "not survive fork(). Do it in the parent, or start the workers with "
    'multiprocessing_context="forkserver" (or "spawn")'
)
_READS_NEED_OBSTORE = "; reads go through obstore too because {why}: give static credentials to read in forked workers"
_AGAIN = "index it again (client.index_s3, or blobsdk import --in-place) to read its new bytes"


class Indexed(Protocol):
    """An object a link block points at (:class:`~blobsdk.sources.S3Object`), as messages name it."""

    @property
    def etag(self) -> str: ...

    @property
    def url(self) -> str: ...


class S3Errors:
    """The error map of one store (its ``name`` in messages).  ``signs_reads``: its reads are
    signed GETs, which run in any process; else ``why_obstore_reads`` says why they go through
    obstore, for the message a forked process gets."""

    def __init__(self, name: str, *, signs_reads: bool, why_obstore_reads: str) -> None:
        self._name, self._signs_reads, self._why_obstore_reads = name, signs_reads, why_obstore_reads

    @contextmanager
    def mapped(
        self, block_id: str = "", *, obj: Indexed | None = None, where: str = "", signed: bool = False, listing: bool = False
    ) -> Iterator[None]:
        """obstore's errors, and the signed GETs' (``signed``), as ours: the one place where
        they are read, so what a failure means (a status among them) travels in our classes,
        never in ``__cause__``.  ``obj``: the indexed object a link block's read reads;
        ``where``: what else a request is about (a ``listing``), for messages.  Every request
        goes through here, so here is where a forked process is refused an obstore request."""
        if not signed and _forked_after_obstore():
            raise NotForkSafe(self._not_here(block_id, obj, where))
        place = obj.url if obj is not None else (where or self._name)
        try:
            yield
        except S3Refused as exc:
            raise self._refused(exc, block_id, obj, place) from exc
        except Unavailable as exc:
            if not signed:
                raise  # ours already
            cls = type(exc) if isinstance(exc, TimedOut) else Unavailable  # a signed GET's connection error, timeout, stall
            raise cls(f"{place}: {exc}") from exc
        except BlobError:
            raise  # ours already (BlobNotFound is also a FileNotFoundError)
        except FileNotFoundError as exc:  # obstore's "not found"
            if obj is not None:
                raise SourceChanged(f"{obj.url} is gone: it was deleted since it was indexed; {_AGAIN}") from exc
            if not block_id:
                raise BlobNotFound(f"{place}: {_first_line(exc)}") from exc
            raise BlockNotFound(f"block {block_id} is not in {self._name}") from exc
        except PreconditionError as exc:  # If-Match failed: only the reads of indexed objects send one
            if obj is None:
                raise Unavailable(f"{place}: {_first_line(exc)}") from exc
            raise SourceChanged(f"{obj.url} changed since it was indexed (its ETag then: {obj.etag}); {_AGAIN}") from exc
        except UnauthenticatedError as exc:
            raise Unauthorized(f"{place}: {_first_line(exc)}") from exc
        except PermissionDeniedError as exc:
            raise Forbidden(f"{place}: {_first_line(exc)}") from exc
        except (BaseError, OSError) as exc:
            listed = _listing_error(place, exc) if listing else None
            raise (listed or _unavailable(f"{place}: {_first_line(exc)}", exc)) from exc

    def _not_here(self, block_id: str, obj: Indexed | None, where: str) -> str:
        """NotForkSafe's message for an obstore request about a block, object or ``where``."""
        if self._signs_reads or where or not (block_id or obj):
            return _FORKED.format(what="writes, listings and indexing")
        return _FORKED.format(what="reads") + _READS_NEED_OBSTORE.format(why=self._why_obstore_reads)

    def _refused(self, exc: S3Refused, block_id: str, obj: Indexed | None, place: str) -> BlobError:
        """What an S3 error reply to a signed GET means for the block or object it read."""
        if exc.status == 404:
            if obj is not None:
                return SourceChanged(f"{obj.url} is gone: it was deleted since it was indexed; {_AGAIN}")
            return BlockNotFound(f"block {block_id} is not in {self._name}")
        if exc.status == 412 and obj is not None:
            return SourceChanged(f"{obj.url} changed since it was indexed (its ETag then: {obj.etag}); {_AGAIN}")
        if exc.status == 401:
            return Unauthorized(f"{place}: {exc}")
        if exc.status == 403:
            return Forbidden(f"{place}: {exc}")
        return _unavailable(f"{place}: {exc}", exc)
