"""The HTTP data path, client and server side: one server's ``Endpoint`` (control requests
over the shared aiohttp session, data GETs received into the caller's buffer, its
concurrency limiter: ``LimiterRegistry``, ``AdaptiveLimiter``, a ``Permit`` per request, with
its priority queue), the pauses between tries, SigV4 signing, what an unreachable server
is said to be and what an error reply encodes (``failures``), and how every server bounds
slow and idle clients (``listening``)."""

from __future__ import annotations

from .endpoint import Endpoint, HttpEndpoint, new_session
from .failures import API_SERVER, BLOCK_SERVER, L3_NODE, OVERLOAD_STATUSES, PEER, REDIS, S3_ENDPOINT, TRACKER, unreachable
from .limiter import AdaptiveLimiter, LimiterRegistry, Permit
from .rawget import RawGetEndpoint
from .retry import Backoff
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
    "unreachable",
    "uri_encode_path",
]
