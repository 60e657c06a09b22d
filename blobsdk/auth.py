"""Tenancy: HMAC-signed bearer tokens and chunk grants (DESIGN §6).

A **keyring** is a set of named secrets shared by the servers of one deployment (and by
whoever issues tokens); one of them, the *active* key, signs, and all of them verify, so a
key is rotated by adding the new one everywhere, making it active, and removing the old one
once every token and grant it signed has expired.  It lives in a TOML file::

    active = "k2"
    [keys]
    k1 = "5f0c...64 or more hex digits..."
    k2 = "9a41..."

A **token** (``bst1.<key id>.<claims>.<mac>``) says who the bearer is: a tenant, the buckets
it may read and write (``*``: all), whether it is an admin, and when it is valid.  Every
server that has the keyring checks it on every request (:meth:`Keyring.verify_token`).

A **chunk grant** (``<key id>.<expiry>.<mac>``) is what the metadata API adds to each chunk
reference of a plan it answers, like an S3 pre-signed URL: it lets one tenant read one byte
range of one block until the expiry.  Block servers and L3 nodes serve a chunk only against a
grant that verifies for the requesting tenant and exactly that range
(:meth:`Keyring.verify_grant`), so no data server needs to know buckets, and a grant is
worthless to another tenant or for other bytes.

A **serve ticket** (``<expiry>.<mac>``) is what a peer tier's tracker hands a child with each
peer source it names: it lets that tenant fetch one chunk key from that one peer until the
expiry.  Peers are clients and hold no keyring (one that did could sign grants for any
bytes), so the tracker, which has the deployment's keyring, checks the child's chunk grant
when it is asked where the chunk is, and signs the ticket with the source peer's own
:class:`ServeKey`, a random secret the peer gave it at hello.  A peer serves a chunk only
against a ticket that verifies with its key, for its tenant and that key: so it never hands
anyone bytes their grant would not let them read from L4.

Clock skew: a server accepts a token or grant from ``not_before - skew`` until
``expires + skew`` by its own clock (``skew`` defaults to :data:`CLOCK_SKEW_S`); a client
drops a cached plan :data:`GRANT_MARGIN_S` before its grants expire by the client's clock.
So clocks that agree within the skew never see a valid grant refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import time
import tomllib
from collections.abc import Mapping

import msgspec

from .errors import Forbidden, Unauthorized

CLOCK_SKEW_S = 30.0  # how far a server's clock may disagree with the issuer's
GRANT_TTL_S = 900.0  # how long the metadata API's chunk grants last (its --grant-ttl)
GRANT_MARGIN_S = 60.0  # a client drops a cached plan this long before its grants expire (metadata/_cache.py)


TOKEN_PREFIX = "bst1"
MIN_SECRET_BYTES = 32
ALL_BUCKETS = "*"
STATIC_TENANT = "default"  # the tenant of a static --token, and of every caller of a server without auth
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}\Z")
_GRANT_MAC_BYTES = 16


class Claims(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a token says about its bearer."""

    tenant: str
    buckets: tuple[str, ...] = ()  # ("*",): every bucket
    admin: bool = False  # may list blocks, scan plans, delete blocks and see every tenant's stats
    not_before: int = 0  # unix seconds
    expires: int = 0  # unix seconds

    def allows(self, bucket: str) -> bool:
        return self.admin or ALL_BUCKETS in self.buckets or bucket in self.buckets

    @property
    def all_buckets(self) -> bool:
        return self.admin or ALL_BUCKETS in self.buckets


def admin_claims(tenant: str) -> Claims:
    """The claims of a static (unsigned) admin token, or of a server without auth."""
    return Claims(tenant=tenant, buckets=(ALL_BUCKETS,), admin=True)


class Keyring:
    """Named HMAC secrets; ``active`` names the one that signs."""

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if not keys:
            raise ValueError("a keyring needs at least one key")
        for kid, secret in keys.items():
            if not _KEY_ID.match(kid):
                raise ValueError(f"key id {kid!r}: want 1-32 letters, digits, '_' or '-'")
            if len(secret) < MIN_SECRET_BYTES:
                raise ValueError(f"key {kid!r} is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed")
        if active not in keys:
            raise ValueError(f"active key {active!r} is not in the keyring ({', '.join(sorted(keys))})")
        self._keys = dict(keys)
        self.active = active
        # One keyed HMAC state per key, copied per message: half the cost of hmac.digest,
        # which derives the padded keys again each time (1.05 vs 1.8 us a MAC here).
        self._hmacs = {kid: hmac.new(secret, digestmod=hashlib.sha256) for kid, secret in self._keys.items()}

    def __repr__(self) -> str:  # never the secrets
        return f"Keyring(keys={sorted(self._keys)}, active={self.active!r})"

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    @classmethod
    def generate(cls, kid: str = "k1") -> Keyring:
        return cls({kid: secrets.token_bytes(MIN_SECRET_BYTES)}, kid)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Keyring:
        """Read a keyring file; ValueError naming what is wrong with it."""
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"keyring {os.fspath(path)!r} is not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ValueError(f"cannot read keyring {os.fspath(path)!r}: {exc.strerror or exc}") from exc
        try:
            return cls.from_dict(raw)
        except ValueError as exc:
            raise ValueError(f"keyring {os.fspath(path)!r}: {exc}") from exc

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> Keyring:
        keys, active = raw.get("keys"), raw.get("active")
        if set(raw) - {"keys", "active"}:
            raise ValueError(f"unknown keys {sorted(set(raw) - {'keys', 'active'})}; want 'active' and a [keys] table")
        if not isinstance(keys, dict) or not isinstance(active, str):
            raise ValueError("want active = KEY_ID and a [keys] table of KEY_ID = HEX_SECRET")
        decoded = {}
        for kid, text in keys.items():
            try:
                decoded[kid] = bytes.fromhex(text) if isinstance(text, str) else b""
            except ValueError:
                raise ValueError(f"key {kid!r} is not hex") from None
        return cls(decoded, active)

    def to_toml(self) -> str:
        lines = [f'active = "{self.active}"', "", "[keys]"]
        lines += [f'{kid} = "{self._keys[kid].hex()}"' for kid in self.key_ids]
        return "\n".join(lines) + "\n"

    def with_key(self, kid: str) -> Keyring:
        """This keyring plus a new random key ``kid``, which becomes the active one."""
        if kid in self._keys:
            raise ValueError(f"key id {kid!r} is already in the keyring")
        return Keyring({**self._keys, kid: secrets.token_bytes(MIN_SECRET_BYTES)}, kid)

    # --- tokens -----------------------------------------------------------------------

    def sign_token(self, claims: Claims) -> str:
        check_claims(claims)
        payload = _b64(msgspec.msgpack.encode(claims))
        signed = f"{TOKEN_PREFIX}.{self.active}.{payload}"
        return f"{signed}.{_b64(self._mac(self.active, b'token', signed.encode()))}"

    def verify_token(self, token: str, now: float, skew: float = CLOCK_SKEW_S) -> Claims:
        """The claims of a token this keyring signed that is valid at ``now``; Unauthorized
        saying why not."""
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != TOKEN_PREFIX:
            raise Unauthorized(f"malformed bearer token: want {TOKEN_PREFIX}.KEY_ID.CLAIMS.SIGNATURE")
        kid = parts[1]
        if kid not in self._keys:
            raise Unauthorized(f"bearer token signed with unknown key id {kid[:32]!r}")
        expected = self._mac(kid, b"token", ".".join(parts[:3]).encode())
        if not hmac.compare_digest(_unb64(parts[3]), expected):
            raise Unauthorized("bearer token signature does not verify")
        try:
            claims = msgspec.msgpack.decode(_unb64(parts[2]), type=Claims)
        except msgspec.DecodeError as exc:  # signed by us, so only a bug gets here
            raise Unauthorized(f"bearer token claims are malformed: {exc}") from exc
        return check_valid(claims, now, skew)

    # --- chunk grants -------------------------------------------------------------------

    def sign_grant(self, tenant: str, block_id: str, offset: int, length: int, expires: int) -> str:
        mac = self._grant_mac(self.active, tenant, block_id, offset, length, expires)
        return f"{self.active}.{expires}.{_b64(mac)}"

    def verify_grant(
        self, grant: str | None, tenant: str, block_id: str, offset: int, length: int, now: float, skew: float = CLOCK_SKEW_S
    ) -> None:
        """Forbidden unless ``grant`` lets ``tenant`` read ``length`` bytes of ``block_id``
        at ``offset`` at ``now``."""
        if not grant:
            raise Forbidden(f"a chunk grant (header {GRANT_HEADER}) is needed to read block {block_id}")
        kid, _, rest = grant.partition(".")
        expires_text, _, mac = rest.partition(".")
        if kid not in self._keys or not (expires_text.isascii() and expires_text.isdigit()) or len(expires_text) > 12:
            raise Forbidden("malformed chunk grant")
        expires = int(expires_text)
        expected = self._grant_mac(kid, tenant, block_id, offset, length, expires)
        if not hmac.compare_digest(_unb64(mac), expected):
            raise Forbidden(f"the chunk grant is not for tenant {tenant!r} and bytes {offset}+{length} of block {block_id}")
        _check_window("chunk grant", 0, expires, now, skew, Forbidden)

    def _grant_mac(self, kid: str, tenant: str, block_id: str, offset: int, length: int, expires: int) -> bytes:
        message = f"{tenant}\0{block_id}\0{offset}\0{length}\0{expires}".encode()
        return self._mac(kid, b"grant", message)[:_GRANT_MAC_BYTES]

    def _mac(self, kid: str, purpose: bytes, message: bytes) -> bytes:
        # The purpose keeps a token's MAC from ever passing for a grant's, and back.
        mac = self._hmacs[kid].copy()
        mac.update(b"blobsdk " + purpose + b" v1\0" + message)
        return mac.digest()


GRANT_HEADER = "X-Blobsdk-Grant"
TICKET_HEADER = "X-Blobsdk-Ticket"
TICKET_TTL_S = 60.0  # how long a tracker's serve tickets last


class ServeKey:
    """A peer's serving secret (see the module docstring): the peer verifies, its trackers sign."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"a serve key is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed")
        self._hmac = hmac.new(secret, digestmod=hashlib.sha256)
        self.hex = secret.hex()

    def __repr__(self) -> str:  # never the secret
        return "ServeKey(...)"

    @classmethod
    def generate(cls) -> ServeKey:
        return cls(secrets.token_bytes(MIN_SECRET_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> ServeKey:
        """ValueError unless ``text`` is a hex secret of at least 32 bytes."""
        try:
            return cls(bytes.fromhex(text))
        except ValueError as exc:
            raise ValueError(f"invalid serve key: {exc}") from None

    def ticket(self, tenant: str, key: str, expires: int) -> str:
        return f"{expires}.{_b64(self._mac(tenant, key, expires))}"

    def verify(self, ticket: str | None, tenant: str, key: str, now: float, skew: float = CLOCK_SKEW_S) -> None:
        """Unauthorized without a ticket; Forbidden unless it lets ``tenant`` fetch ``key``
        from this peer at ``now``."""
        if not ticket:
            raise Unauthorized(f"a serve ticket from the tracker (header {TICKET_HEADER}) is needed to fetch chunk {key}")
        expires_text, _, mac = ticket.partition(".")
        if not (expires_text.isascii() and expires_text.isdigit()) or len(expires_text) > 12:
            raise Forbidden("malformed serve ticket")
        expires = int(expires_text)
        if not hmac.compare_digest(_unb64(mac), self._mac(tenant, key, expires)):
            raise Forbidden(f"the serve ticket is not this peer's for tenant {tenant!r} and chunk {key}")
        _check_window("serve ticket", 0, expires, now, skew, Forbidden)

    def _mac(self, tenant: str, key: str, expires: int) -> bytes:
        mac = self._hmac.copy()
        mac.update(f"blobsdk ticket v1\0{tenant}\0{key}\0{expires}".encode())
        return mac.digest()[:_GRANT_MAC_BYTES]


def check_claims(claims: Claims) -> None:
    """ValueError for claims no token should carry."""
    check_name(claims.tenant, "tenant")
    if claims.tenant == STATIC_TENANT:
        raise ValueError(f"tenant name {STATIC_TENANT!r} is reserved for a server's static --token")
    for bucket in claims.buckets:
        if bucket != ALL_BUCKETS:
            check_name(bucket, "bucket")
    if not claims.buckets and not claims.admin:
        raise ValueError("a token needs at least one bucket ('*' for all) or admin")
    if claims.expires <= claims.not_before:
        raise ValueError(f"a token must expire after it becomes valid ({claims.expires} <= {claims.not_before})")


def check_valid(claims: Claims, now: float, skew: float = CLOCK_SKEW_S) -> Claims:
    """``claims``, if their token is valid at ``now`` (Unauthorized if not)."""
    _check_window("bearer token", claims.not_before, claims.expires, now, skew, Unauthorized)
    return claims


def check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"{what} {name!r}: want 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return name


def new_claims(tenant: str, buckets: tuple[str, ...], ttl_s: float, *, admin: bool = False, now: float | None = None) -> Claims:
    """Claims valid from ``now`` (default: the clock) for ``ttl_s`` seconds."""
    if not ttl_s > 0 or ttl_s == float("inf"):
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl_s}")
    start = int(time.time() if now is None else now)
    claims = Claims(tenant=tenant, buckets=buckets, admin=admin, not_before=start, expires=start + max(1, round(ttl_s)))
    check_claims(claims)
    return claims


def read_claims(token: str) -> Claims:
    """The claims a token carries, without checking its signature (to show them)."""
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != TOKEN_PREFIX:
        raise ValueError(f"not a signed blobsdk token: want {TOKEN_PREFIX}.KEY_ID.CLAIMS.SIGNATURE")
    try:
        return msgspec.msgpack.decode(_unb64(parts[2]), type=Claims)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed token claims: {exc}") from exc


def _check_window(what: str, not_before: int, expires: int, now: float, skew: float, error: type[Unauthorized]) -> None:
    if now < not_before - skew:
        raise error(f"{what} is not valid before {_utc(not_before)} (server time {_utc(now)}, clock skew allowed {skew:g} s)")
    if now >= expires + skew:
        raise error(f"{what} expired at {_utc(expires)} (server time {_utc(now)}, clock skew allowed {skew:g} s)")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return b""  # compares unequal to every MAC
