"""The S3 L4's data GETs: SigV4-signed ranged GETs over the SDK's own HTTP GET
path (blobsdk/net/rawget.py: keep-alive connections, the body received straight into the
caller's buffer), not over obstore.

Why: obstore runs every request on one Rust (tokio) runtime per process, whose threads do not
survive fork(); in a child forked after the parent used it, every obstore request hangs, a
fresh store's too (measured: obstore 0.12.1, a GET on a new S3Store in the child got no
answer in 10 s).  These GETs are plain asyncio sockets, opened per process and per event
loop (:class:`S3Getter`), so a DataLoader worker forked after its parent read S3, listed a
dataset or indexed one reads S3 like any process.

They sign with static credentials only (:func:`target_of`): ``access_key_id`` and
``secret_access_key`` (and ``session_token``) from the store's config, else the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``); the endpoint
from the config, else ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT``), else AWS's
``https://s3.REGION.amazonaws.com``; the region from the config, else ``AWS_REGION`` (or
``AWS_DEFAULT_REGION``), else ``us-east-1``.  Requests are path-style.  Without static
keys (``~/.aws`` files, SSO, an instance role), or with a config option this module does
not know, the store reads through obstore as before (and cannot in a forked child).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from urllib.parse import urlsplit

import aiohttp
import msgspec

from ..errors import BlobError, ReplyStalled, TimedOut, Unavailable
from ..net import OVERLOAD_STATUSES, S3_ENDPOINT, Backoff, Credentials, Permit, RawGetEndpoint, Signer, uri_encode_path
from ..runtime import Held

# The config options a signed GET understands (S3Config.options() and obstore's names for them).
KNOWN_OPTIONS = frozenset({"endpoint", "region", "access_key_id", "secret_access_key", "session_token", "token"})
Admit = Callable[[], AbstractAsyncContextManager[Permit | None]]  # a limiter permit for one try
_CODE = re.compile(rb"<Code>([^<]{1,200})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{1,500})</Message>")


class S3Target(msgspec.Struct, frozen=True, kw_only=True):
    """Where and as whom the signed GETs go."""

    endpoint: str  # scheme://host[:port], no path
    region: str
    credentials: Credentials


class S3Refused(Unavailable):
    """An S3 error reply (``status``, S3's ``code``): the store says what it means for the
    block or object it read (S3BlockStore._errors)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def target_of(config: Mapping[str, str], allow_http: bool, environ: Mapping[str, str] = os.environ) -> S3Target | str:
    """The signed GETs' target for a store's obstore ``config``, or why there is none (the
    store then reads through obstore): see the module docstring."""
    unknown = sorted(set(config) - KNOWN_OPTIONS)
    if unknown:
        return f"the config sets {', '.join(unknown)}, which only obstore understands"
    key_id = config.get("access_key_id") or environ.get("AWS_ACCESS_KEY_ID")
    secret = config.get("secret_access_key") or environ.get("AWS_SECRET_ACCESS_KEY")
    if not key_id or not secret:
        return (
            "no static credentials (access_key_id and secret_access_key in the config, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY): credentials from ~/.aws files, SSO or an instance role are obstore's alone"
        )
    token = config.get("session_token") or config.get("token") or environ.get("AWS_SESSION_TOKEN") or None
    region = config.get("region") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = (
        config.get("endpoint")
        or environ.get("AWS_ENDPOINT_URL")
        or environ.get("AWS_ENDPOINT")
        or f"https://s3.{region}.amazonaws.com"
    )
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        return f"endpoint {endpoint!r} is not scheme://host[:port]"
    if parts.scheme == "http" and not allow_http:
        return f"endpoint {endpoint!r} is plain HTTP and allow_http is not set"
    credentials = Credentials(access_key_id=key_id, secret_access_key=secret, session_token=token)
    return S3Target(endpoint=f"{parts.scheme}://{parts.netloc}", region=region, credentials=credentials)


def s3_refusal(status: int, body: bytes, url: str) -> BlobError:
    """An S3 error reply as :class:`S3Refused` (its XML's Code and Message, if any)."""
    code = _CODE.search(body)
    message = _MESSAGE.search(body)
    name = code.group(1).decode("utf-8", "replace") if code else ""
    text = message.group(1).decode("utf-8", "replace") if message else ""
    detail = f"HTTP {status}" + (f" {name}" if name else "") + (f": {text}" if text else "")
    return S3Refused(f"GET {url}: {detail}", status, name)


class S3Getter:
    """Signed GETs to ``target``: one :class:`RawGetEndpoint` per process and event loop
    (a forked child or another loop never uses the connections of the one that opened
    them).

    A GET that fails for a reason another try may not meet (:func:`why_again`: a throttle,
    429 or 503 SlowDown; another 5xx, such as S3's 500 InternalError; a connection error;
    a body that stalled for ``stall_s`` mid-transfer) is tried again after a pause of
    ``backoff``'s (full jitter, blobsdk/net/retry.py), for as long as the pause ends within
    ``timeout_s`` of the first try: the read's budget, not a count.  Each try holds its own
    permit of ``admit`` (the endpoint's concurrency limiter), which the GET tells of a
    throttle or a timeout (blobsdk/net/rawget.py), so every throttle backs the limit off,
    and no slot is held through a pause.  A try after a stall goes out on a new connection.
    Each try is bounded by ``timeout_s`` too; the caller bounds the whole."""

    def __init__(
        self, target: S3Target, *, timeout_s: float, stall_s: float | None = None, backoff: Backoff | None = None
    ) -> None:
        self.target = target
        self._signer = Signer(target.credentials, target.region)
        self._host = urlsplit(target.endpoint).netloc.rpartition("@")[2]
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, 5.0), sock_read=timeout_s)
        self._stall_s = stall_s
        self._budget_s = timeout_s
        self._backoff = backoff if backoff is not None else Backoff()
        self._endpoints: Held[RawGetEndpoint] = Held(per_loop=True)

    def _here(self) -> RawGetEndpoint:
        """This process's and this loop's endpoint (a new one the first time here)."""
        # Another process's or loop's connections are never touched (not even closed: a
        # forked child's copies of the parent's sockets are the parent's to use).
        return self._endpoints.get_or_make(self._new_endpoint)

    def _new_endpoint(self) -> RawGetEndpoint:
        return RawGetEndpoint(
            self.target.endpoint, timeout=self._timeout, stall_s=self._stall_s, refusal=s3_refusal, role=S3_ENDPOINT
        )

    async def get_into(
        self,
        bucket: str,
        key: str,
        out: memoryview,
        *,
        start: int | None = None,
        if_match: str | None = None,
        admit: Admit | None = None,
    ) -> int:
        """GET ``key`` of ``bucket`` (from byte ``start`` on, ``out.nbytes`` of them; with no
        ``start``, the whole object, at most ``out.nbytes``) into ``out``: the number of
        bytes received (fewer than asked when the object ends first).  ``if_match``: only
        that ETag's version (else S3Refused 412).  ``admit``: a limiter permit for each try
        (None: none).  Every try writes the range from its first byte into ``out``, so the
        bytes a failed try left there are overwritten by the try that succeeds."""
        route = uri_encode_path(f"/{bucket}/{key}")
        headers: dict[str, str] = {}
        if start is not None:
            headers["Range"] = f"bytes={start}-{start + out.nbytes - 1}"
        if if_match is not None:
            headers["If-Match"] = if_match
        expect = 200 if start is None else 206
        retries = self._backoff.start(self._budget_s)
        fresh = False
        while True:
            try:
                return await self._try(route, out, headers, expect, admit, fresh)
            except Unavailable as exc:
                why = why_again(exc)
                if why is None:
                    raise
                if not await retries.again(why):
                    raise _gave_up(exc, retries.summary()) from exc
                fresh = isinstance(exc, ReplyStalled)

    async def _try(
        self, route: str, out: memoryview, headers: dict[str, str], expect: int, admit: Admit | None, fresh: bool
    ) -> int:
        """One signed GET, under a permit of ``admit``'s: the bytes received."""
        signed = {**headers, **self._signer.headers("GET", self._host, route)}
        async with admit() if admit is not None else nullcontext() as permit:
            got = await self._here().get_into(route, out, expect=expect, headers=signed, permit=permit, up_to=True, fresh=fresh)
        return int(got.get("content-length", "0"))

    async def aclose(self) -> None:
        """Close this process's connections, if this loop opened them."""
        loop, endpoint = self._endpoints.loop, self._endpoints.take()
        if endpoint is not None and loop is asyncio.get_running_loop():
            await endpoint.aclose()


def why_again(exc: Unavailable) -> str | None:
    """Why another try may go better than this one ("throttled", "stalled", "server error",
    "connection error"), or None: a 4xx other than 429 (the request itself is refused) or a
    timeout (it took its time already)."""
    if isinstance(exc, S3Refused):
        if exc.status in OVERLOAD_STATUSES:
            return "throttled"
        return "server error" if exc.status >= 500 else None
    if isinstance(exc, ReplyStalled):
        return "stalled"
    return None if isinstance(exc, TimedOut) else "connection error"


def _gave_up(exc: Unavailable, summary: str) -> Unavailable:
    """``exc``, the last try's error, with how the tries went."""
    message = f"{exc}; {summary}"
    if isinstance(exc, S3Refused):
        return S3Refused(message, exc.status, exc.code)
    return type(exc)(message)
