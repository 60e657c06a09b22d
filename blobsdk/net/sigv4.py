"""AWS Signature Version 4 for the S3 data GETs that go over the SDK's own HTTP GET path
(blobsdk/sources/_s3get.py): header-based signing of a request without a body.

What is signed: the method, the path (each segment URI-encoded once, as S3 wants), the
query, ``host``, ``x-amz-content-sha256`` (``UNSIGNED-PAYLOAD``), ``x-amz-date`` and, with
temporary credentials, ``x-amz-security-token``.  Other headers a GET carries (``Range``,
``If-Match``) are sent unsigned, which SigV4 allows.  The day's signing key is derived once
and kept (four HMACs), so a request costs one SHA-256 and one HMAC.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote

import msgspec

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
ALGORITHM = "AWS4-HMAC-SHA256"
_SAFE = "-_.~"  # with letters and digits: what SigV4 leaves unencoded


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """An access key, its secret and, for temporary credentials, their session token."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key=..., session_token=...)"


def uri_encode_path(path: str) -> str:
    """``path`` URI-encoded as SigV4 and S3 want: every byte but letters, digits, ``-_.~``
    and the ``/`` between segments as ``%XX`` (upper-case hex)."""
    return quote(path, safe="/" + _SAFE)


class Signer:
    """Signs requests to ``service`` in ``region`` with ``credentials``."""

    def __init__(self, credentials: Credentials, region: str, service: str = "s3") -> None:
        self.credentials = credentials
        self.region = region
        self.service = service
        self._day = ""
        self._key = b""

    def headers(
        self,
        method: str,
        host: str,
        path: str,
        query: str = "",
        *,
        also_signed: Mapping[str, str] | None = None,
        payload: str = UNSIGNED_PAYLOAD,
        now: datetime | None = None,
    ) -> dict[str, str]:
        """The headers that sign ``method`` of the already-encoded ``path`` (and canonical
        ``query``) on ``host`` (as the Host header sends it) at ``now`` (default: the clock).
        ``also_signed``: headers the request sends that are signed too (the caller sends
        them); ``payload``: the body's SHA-256 (hex), or UNSIGNED_PAYLOAD."""
        stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        headers = {"x-amz-content-sha256": payload, "x-amz-date": stamp}
        if self.credentials.session_token:
            headers["x-amz-security-token"] = self.credentials.session_token
        signed = {"host": host, **{k.lower(): v.strip() for k, v in (also_signed or {}).items()}, **headers}
        names = ";".join(sorted(signed))
        lines = (f"{k}:{signed[k]}" for k in sorted(signed))
        canonical = "\n".join((method, path, query, *lines, "", names, payload))
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        credential = f"{self.credentials.access_key_id}/{scope}"
        headers["Authorization"] = f"{ALGORITHM} Credential={credential}, SignedHeaders={names}, Signature={signature}"
        return headers

    def _signing_key(self, day: str) -> bytes:
        if day != self._day:
            key = ("AWS4" + self.credentials.secret_access_key).encode()
            for part in (day, self.region, self.service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._day, self._key = day, key
        return self._key
