"""How a server's failures reach the caller, as blobsdk errors, in one place for every
endpoint (the control requests and data GETs of blobsdk/net/endpoint.py and
blobsdk/net/rawget.py, and Redis as the metadata store, blobsdk/metadata/_redis.py):

- **A server nothing listens for** (:func:`unreachable`): which server it is (its *role*),
  where, what happened, and the likely cause.  A refused connection means nothing listens at
  the address.  For a cluster's servers the likely causes are that the cluster is down, or
  that the config (a ``client.toml``) is from an earlier run, whose servers listened
  elsewhere; the message says so, so a user whose cluster is stopped reads that, not an
  aiohttp class name.  A connection attempt that gets no answer at all within the connect
  timeout (the host is down, or a partition drops its packets) is Unreachable too
  (:func:`no_answer`): the request never reached the server.  Other failures to connect (a
  reset, a TLS failure) are not this: the caller words them as before.
- **An error reply** (:func:`error_for`): the blobsdk error its ErrorBody encodes, and an
  overloaded server's answer told to the request's concurrency-limiter permit
  (:func:`report_overload`).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec

from ..errors import BlobError, QuotaExceeded, Unavailable, Unreachable, error_from_code
from ..wire import ErrorBody
from .limiter import Permit

OVERLOAD_STATUSES = frozenset({429, 503})  # answers that tell a concurrency limiter to back off
REFUSED = "connection refused"
NO_ANSWER = "no answer to connect"
CLUSTER_DOWN = "the cluster is down, or client.toml is from an earlier run"


@dataclass(frozen=True, slots=True)
class Role:
    """Who a server is to the client (``name``: "the API server", "a block server") and the
    likely reason nothing listens at its address (``down``)."""

    name: str
    down: str


API_SERVER = Role("the API server", CLUSTER_DOWN)
BLOCK_SERVER = Role("a block server", CLUSTER_DOWN)
L3_NODE = Role("an L3 node", CLUSTER_DOWN)
TRACKER = Role("a tracker", CLUSTER_DOWN)
PEER = Role("a peer", "that client has stopped")
S3_ENDPOINT = Role("the S3 endpoint", "the object store is down, or the endpoint in the config is wrong")
REDIS = Role("Redis", "Redis is not running there, or metadata_url is wrong")
SERVER = Role("the server", "it is not running, or its URL is wrong")

_REASONS = {
    errno.ECONNREFUSED: REFUSED,
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
}


def unreachable(role: Role, base_url: str, what: str, exc: BaseException) -> Unreachable | None:
    """The error for a connection to ``role`` at ``base_url`` that could not be made (``exc``,
    raised while connecting for ``what``, e.g. "POST /v1/list"), or None if ``exc`` is not
    such a failure."""
    reason = _reason(exc)
    if reason is None:
        return None
    address = urlsplit(base_url).netloc.rpartition("@")[2]
    hint = f"nothing listens there: {role.down}" if reason == REFUSED else "check the address in the config"
    message = f"cannot reach {role.name} at {address} ({what}): {reason} ({hint})"
    return Unreachable(message, role=role.name, address=address, reason=reason, hint=hint)


def no_answer(role: Role, base_url: str, what: str) -> Unreachable:
    """The error for a connection to ``role`` at ``base_url`` that got no answer within the
    connect timeout (for ``what``, e.g. "POST /v1/commit"): the request was never sent."""
    address = urlsplit(base_url).netloc.rpartition("@")[2]
    reason, hint = NO_ANSWER, "the host is down or cut off from this one, or its packets are dropped"
    message = f"cannot reach {role.name} at {address} ({what}): {reason} ({hint})"
    return Unreachable(message, role=role.name, address=address, reason=reason, hint=hint)


def _reason(exc: BaseException) -> str | None:
    """What kept the connection from being made, or None: not a failure to connect at all."""
    cause = _os_error(exc)
    if isinstance(cause, socket.gaierror):
        return "unknown host"
    if cause is not None and cause.errno is not None:
        return _REASONS.get(cause.errno)
    return None


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, or what aiohttp's ClientConnectorError wraps
    (``os_error``), or the cause of redis-py's ConnectionError."""
    seen: BaseException | None = getattr(exc, "os_error", exc)
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__cause__
    return seen


_error_decoder = msgspec.msgpack.Decoder(ErrorBody)


def report_overload(permit: Permit | None, status: int, error: BlobError) -> None:
    """Tell a request's concurrency-limiter slot that the server said it is overloaded (a
    tenant's byte quota is not overload)."""
    if permit is not None and status in OVERLOAD_STATUSES and not isinstance(error, QuotaExceeded):
        permit.overloaded()


def error_for(status: int, body: bytes, url: str) -> BlobError:
    """The blobsdk error an error reply encodes (an ErrorBody in msgpack or JSON); a reply
    without one is Unavailable for the statuses that mean "try again or elsewhere"."""
    try:
        err = _error_decoder.decode(body)
    except msgspec.DecodeError:
        try:
            err = msgspec.json.decode(body, type=ErrorBody)
        except msgspec.DecodeError:
            if status in (429, 502, 503, 504):
                return Unavailable(f"{url}: HTTP {status}")
            return BlobError(f"{url}: HTTP {status}: {body[:200]!r}")
    return error_from_code(err.code, err.message)
