"""The Redis URLs blobsdk takes, checked where a setting or an argument names one:

- ``redis://[[USER]:PASSWORD@]HOST:PORT/DB`` (``rediss://`` for TLS): one server, or any node
  of a Redis Cluster;
- ``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``
  (``rediss+sentinel://``): the Sentinels that watch the primary named SERVICE.  Every new
  connection asks them where the primary is, so a failover they perform is followed with no
  change of address (docs/deployment.md).  The user and password are the data servers'; the
  Sentinels are asked without them.

A leaf: it parses, and never imports redis (the ``redis`` extra may be absent where a config
is checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

FORM = "redis://HOST:PORT/DB (or rediss://), or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]"
SCHEMES = ("redis", "rediss")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A ``redis+sentinel://`` URL, parsed: where to ask, for which primary, and how to log in."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    tls: bool


def check_redis_url(url: object, what: str) -> str:
    """``url`` if it is a Redis URL of a form above, else ValueError naming ``what``."""
    if not isinstance(url, str):
        raise ValueError(f"{what} must be {FORM}, got {url!r}")
    scheme = url.partition("://")[0]
    if scheme in SENTINEL_SCHEMES:
        sentinel_url(url, what)
    elif scheme not in SCHEMES or not urlsplit(url).hostname:
        raise ValueError(f"{what} must be {FORM}, got {url!r}")
    return url


def is_sentinel(url: str) -> bool:
    return url.partition("://")[0] in SENTINEL_SCHEMES


def sentinel_url(url: str, what: str = "a Redis Sentinel URL") -> SentinelURL:
    """The parts of a ``redis+sentinel://`` URL; ValueError naming ``what`` for a bad one."""
    scheme, _, rest = url.partition("://")
    location, _, path = rest.partition("/")
    credentials, _, hosts = location.rpartition("@")
    parts = path.split("/")
    if scheme not in SENTINEL_SCHEMES or not hosts or not parts[0] or len(parts) > 2:
        raise ValueError(f"{what} must be {FORM}, got {url!r}")
    db = parts[1] if len(parts) == 2 and parts[1] else "0"
    if not db.isdigit():
        raise ValueError(f"{what}: the database must be a number, got {db!r} in {url!r}")
    username, _, password = credentials.partition(":") if credentials else ("", "", "")
    return SentinelURL(
        sentinels=tuple(_address(item, what, url) for item in hosts.split(",")),
        service=unquote(parts[0]),
        db=int(db),
        username=unquote(username) or None,
        password=unquote(password) or None,
        tls=scheme == "rediss+sentinel",
    )


def _address(item: str, what: str, url: str) -> tuple[str, int]:
    """``HOST[:PORT]`` or ``[V6]:PORT`` of one Sentinel (port 26379 if none)."""
    host, port = item, str(SENTINEL_PORT)
    if item.startswith("["):
        host, _, tail = item[1:].partition("]")
        if tail:
            port = tail.removeprefix(":")
    elif ":" in item:
        host, _, port = item.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what}: a Sentinel's address is HOST:PORT, got {item!r} in {url!r}")
    return host, int(port)
