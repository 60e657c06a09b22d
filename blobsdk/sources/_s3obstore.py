"""obstore's side of the S3 L4 (blobsdk/sources/_s3.py): which process its runtime runs in,
its errors' status and first line, a listing's own errors, and an upload's pieces."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._extras import requires_extra

with requires_extra("s3", __name__):
    from obstore.exceptions import InvalidPathError

from ..errors import BadRequest, BlobError, BlobNotFound, Overloaded, RangeNotSatisfiable, Unavailable
from ..net import Backoff
from ..runtime import Held
from ._s3get import S3Refused
from .base import Buffer

if TYPE_CHECKING:
    from obstore.store import BackoffConfig, RetryConfig

OBSTORE_MAX_RETRIES = 1000  # obstore's retries end at its retry_timeout (the budget), not at a count

# Held in the process whose first obstore request started obstore's runtime (one per
# process, like the runtime itself): see _forked_after_obstore.
_RUNTIME: Held[bool] = Held()


def _forked_after_obstore() -> bool:
    """Whether this process was forked after the S3 L4's first obstore request (see
    blobsdk/sources/_s3.py); if not, this process starts the runtime if none has."""
    if _RUNTIME.inherited:
        return True
    if _RUNTIME.get() is None:
        _RUNTIME.put(True)
    return False


def _listing_error(where: str, exc: BaseException) -> BlobError | None:
    """What a listing's own obstore error means, if it is one: a key obstore cannot list, or
    a missing bucket."""
    if isinstance(exc, InvalidPathError):  # obstore lists no key with an empty or a ".." segment
        return BadRequest(f"{where}: obstore cannot list a key in it ({_first_line(exc)}): list a prefix without it")
    if _status(exc) == 404:  # NoSuchBucket
        return BlobNotFound(f"{where}: no such bucket")
    return None


_STATUS = re.compile(r"status code: (\d{3}) ")


def _status(exc: BaseException) -> int:
    """The HTTP status an S3 error reply or an obstore error reports (0 if none: a
    connection error, a timeout).  obstore's errors carry it only in their message, so it
    is read there once, where they are translated (S3BlockStore._errors)."""
    if isinstance(exc, S3Refused):
        return exc.status
    found = _STATUS.search(str(exc))
    return int(found.group(1)) if found else 0


def _unavailable(message: str, exc: BaseException) -> Unavailable | RangeNotSatisfiable:
    """A failed request as the class its status names: a range past the end, a throttle
    (429 or 503 SlowDown, still, after the retries), or any other failure."""
    status = _status(exc)
    if status == 416:
        return RangeNotSatisfiable(message)
    if status in (429, 503):
        return Overloaded(message)
    return Unavailable(message)


def _copied(data: Buffer, out: memoryview) -> int:
    """``data`` (at most ``out``'s size) into the start of ``out``: its size."""
    view = memoryview(data).cast("B")
    out[: view.nbytes] = view
    return view.nbytes


def _first_line(exc: BaseException) -> str:
    """obstore's messages end in a multi-line debug dump: the first line says it."""
    return str(exc).split("\n", 1)[0] or type(exc).__name__


def _pieces(parts: Sequence[Buffer], size: int) -> Iterator[Any]:
    """The parts as buffers of at most ``size`` bytes (obstore uploads an iterator of them)."""
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, view.nbytes, size):
            yield view[start : start + size]


def _obstore_retries(backoff: Backoff, budget_s: float) -> RetryConfig:
    """obstore's retries, as the signed GETs': ``backoff``'s pauses, within ``budget_s``."""
    pauses: BackoffConfig = {
        "init_backoff": timedelta(seconds=backoff.base_s),
        "max_backoff": timedelta(seconds=backoff.cap_s),
        "base": 2,
    }
    return {"max_retries": OBSTORE_MAX_RETRIES, "retry_timeout": timedelta(seconds=budget_s), "backoff": pauses}
