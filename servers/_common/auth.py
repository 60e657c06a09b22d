"""Who is asking: the bearer token of each request, checked once, as :class:`Claims`.

A server runs in one of three modes (its ``--token`` and ``--keys`` flags):

- neither: no auth; every request is the admin of tenant "default";
- ``--token T``: one shared secret; a request bearing it is the admin of tenant "default";
- ``--keys FILE``: signed tokens (:mod:`blobsdk.auth`) name the tenant, its buckets and
  whether it is an admin, and data routes want a chunk grant for the bytes they serve
  (:func:`check_grant`).  ``--token`` may be given too, for servers that talk to each other.

The routes in ``PUBLIC_ROUTES`` (health, metrics, fault admin) need no token.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable

import cachetools
from aiohttp import web

from blobsdk.auth import CLOCK_SKEW_S, GRANT_HEADER, STATIC_TENANT, Claims, Keyring, admin_claims, check_valid
from blobsdk.errors import Forbidden, Unauthorized

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ADMIN_FAULTS_ROUTE = "/admin/faults"
# Not guarded by the data token (the fault admin route checks its own) and never faulted.
PUBLIC_ROUTES = frozenset({"/healthz", "/metrics", ADMIN_FAULTS_ROUTE})
CLAIMS_KEY = web.RequestKey("claims", Claims)
_OPEN = admin_claims(STATIC_TENANT)
VERIFIED_TOKENS = 4096  # distinct verified tokens a server remembers


class ServerAuth:
    """The token rules of one server (see the module docstring)."""

    def __init__(
        self,
        token: str | None = None,
        keyring: Keyring | None = None,
        *,
        clock_skew: float = CLOCK_SKEW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keyring = keyring
        self.clock_skew = clock_skew
        self.clock = clock
        self._static = f"Bearer {token}".encode() if token else None
        # Tokens whose signature verified: a client sends the same one on every request,
        # so each needs its MAC checked once; its validity window is checked every time.
        self._verified: cachetools.LRUCache[str, Claims] = cachetools.LRUCache(VERIFIED_TOKENS)

    @property
    def required(self) -> bool:
        return self._static is not None or self.keyring is not None

    def claims_of_header(self, header: str) -> Claims:
        if self._static is not None and hmac.compare_digest(header.encode(), self._static):
            return _OPEN
        if self.keyring is None:
            raise Unauthorized("missing or wrong bearer token")
        scheme, _, token = header.partition(" ")
        if scheme != "Bearer" or not token:
            raise Unauthorized("missing bearer token (want 'Authorization: Bearer TOKEN')")
        now = self.clock()
        claims = self._verified.get(token)
        if claims is not None:
            return check_valid(claims, now, self.clock_skew)
        claims = self._verified[token] = self.keyring.verify_token(token, now, self.clock_skew)
        return claims

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_ROUTES:
            request[CLAIMS_KEY] = self.claims_of_header(request.headers.get("Authorization", ""))
        return await handler(request)

    def check_grant(self, claims: Claims, grant: str | None, block_id: str, offset: int, length: int) -> None:
        """Forbidden unless ``claims`` may read these bytes: an admin (or any caller of a
        server without a keyring) may read anything; a tenant needs a grant."""
        if self.keyring is None or claims.admin:
            return
        self.keyring.verify_grant(grant, claims.tenant, block_id, offset, length, self.clock(), self.clock_skew)


AUTH_KEY = web.AppKey("auth", ServerAuth)


def claims_of(request: web.Request) -> Claims:
    """The caller's claims (the admin of tenant "default" on a server without auth)."""
    claims: Claims = request.get(CLAIMS_KEY, _OPEN)
    return claims


def require_admin(request: web.Request) -> Claims:
    claims = claims_of(request)
    if not claims.admin:
        raise Forbidden(f"{request.method} {request.path} needs an admin token (tenant {claims.tenant!r} is not one)")
    return claims


def check_grant(request: web.Request, block_id: str, offset: int, length: int) -> Claims:
    """The caller's claims, once its grant (header ``X-Blobsdk-Grant``) for these bytes
    verifies (Forbidden if it does not)."""
    claims = claims_of(request)
    request.app[AUTH_KEY].check_grant(claims, request.headers.get(GRANT_HEADER), block_id, offset, length)
    return claims
