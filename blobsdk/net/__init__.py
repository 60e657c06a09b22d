"""The HTTP data path, client and server side: one server's ``Endpoint`` (control requests
over the shared aiohttp session, data GETs received into the caller's buffer, its
concurrency limiter: ``LimiterRegistry``, ``AdaptiveLimiter``, a ``Permit`` per request, with
its priority queue), the pauses between tries, SigV4 signing, what an unreachable server
is said to be, and how every server bounds slow and idle clients (``listening``).  The
function that words an unreachable server's error keeps its module's name, so it is imported
from ``blobsdk.net.unreachable`` itself."""

from __future__ import annotations

from .endpoint import Endpoint
from .limiter import AdaptiveLimiter, LimiterRegistry, Permit
from .rawget import RawGetEndpoint
from .retry import Backoff
from .rpc import OVERLOAD_STATUSES, HttpEndpoint, new_session
from .serving import (
    ServerLimits,
    check_positive_fields,
    end_connection,
    limits_of_args,
    listening,
    progress_every,
    sent_past_writer,
)
from .sigv4 import Credentials, Signer, uri_encode_path
from .unreachable import API_SERVER, BLOCK_SERVER, L3_NODE, PEER, REDIS, S3_ENDPOINT, TRACKER

__all__ = [
    "API_SERVER",
    "BLOCK_SERVER",
    "L3_NODE",
    "OVERLOAD_STATUSES",
    "PEER",
    "REDIS",
    "S3_ENDPOINT",
    "TRACKER",
    "AdaptiveLimiter",
    "Backoff",
    "Credentials",
    "Endpoint",
    "HttpEndpoint",
    "LimiterRegistry",
    "Permit",
    "RawGetEndpoint",
    "ServerLimits",
    "Signer",
    "check_positive_fields",
    "end_connection",
    "limits_of_args",
    "listening",
    "new_session",
    "progress_every",
    "sent_past_writer",
    "uri_encode_path",
]
