"""The API servers a client's metadata calls go to (blobsdk/metadata/_http.py): one, or
several over one store, failed over between.

With several (``api_urls``), a call goes to the first server in the config's order that is
not down; one that fails with Unavailable (refused, reset, 5xx, 429, or silent for
``[timeouts] api_failover`` seconds: a stopped process accepts connections and never answers)
is marked down for ``down_s`` and the call goes on to the next.  Servers marked down are tried
last, not never, so a call fails only when every server failed it, and a success clears the
mark at once (a restarted server serves again).  The error then names every server and what
each did: :class:`~blobsdk.errors.Unreachable` if no connection to any could be made,
Unavailable otherwise.

A read is simply asked again.  A write may have been applied by a server whose answer was
lost, so every write the caller sends here carries a request id (made once per write, sent
with each attempt) that the store behind the servers applies at most once
(:class:`~blobsdk.metadata.base.RetryAwareStore`): the retry answers what the first
application did.  An API server whose store cannot do that refuses the request id (400).
With one server nothing is retried and no request id is sent: ``call`` is that server's own
POST (:meth:`~blobsdk.net.endpoint.HttpEndpoint.post`), with nothing of this class around it.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import aiohttp

from ..config import Timeouts
from ..errors import BlobError, Unavailable, Unreachable
from ..net import API_SERVER, HttpEndpoint
from ..tail import Reason, TargetHealth

T = TypeVar("T")

DOWN_S = 5.0  # a server that failed a call is tried after the others this long


class Post(Protocol):
    """POST ``body`` to ``route`` and decode the answer into ``kind``."""

    def __call__(self, route: str, body: Any, kind: type[T], /) -> Awaitable[T]: ...


class ApiServers:
    """See the module docstring.  ``timeouts``: the client's (``api_failover`` bounds a silent
    server, with several); ``clock``: for ``down_s``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Sequence[str],
        token: str | None = None,
        *,
        timeouts: Timeouts | None = None,
        down_s: float = DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("ApiServers needs at least one API server URL")
        self.endpoints = [HttpEndpoint(session, url, token, role=API_SERVER) for url in urls]
        self.health = TargetHealth(clock=clock, down_seconds=down_s)
        self.counts: Counter[str] = Counter()  # "failovers": attempts that failed and went on
        self._options: dict[str, Any] = {}
        # With one server a call is that server's POST, no frame of this class around it.
        self.call: Post = self.endpoints[0].post
        if len(urls) > 1:
            t = timeouts or Timeouts()
            silent = min(t.sock_read, t.api_failover)
            self._options["timeout"] = aiohttp.ClientTimeout(
                total=t.total, connect=t.connect, sock_connect=t.connect, sock_read=silent
            )
            self.call = self._fail_over

    @property
    def several(self) -> bool:
        return len(self.endpoints) > 1

    def request_id(self) -> str | None:
        """A new write's request id (None with one server: it is never retried)."""
        return secrets.token_hex(16) if self.several else None

    def down(self) -> list[str]:
        """The base URLs of the servers marked down now."""
        return [e.base_url for e in self.endpoints if self.health.has(e.base_url, Reason.DOWN)]

    async def _fail_over(self, route: str, body: Any, kind: type[T]) -> T:
        """``call`` with several servers: POST ``body`` to ``route`` of the first server that
        answers (module docstring)."""
        failures: list[tuple[HttpEndpoint, Unavailable]] = []
        for endpoint in self._order():
            try:
                answer = await endpoint.call("POST", route, body, kind, **self._options)
            except Unavailable as exc:
                self.health.mark(endpoint.base_url, Reason.DOWN)
                self.counts["failovers"] += 1
                failures.append((endpoint, exc))
                continue
            self.health.clear(endpoint.base_url, Reason.DOWN)
            return answer
        raise all_failed(f"POST {route}", failures)

    def _order(self) -> list[HttpEndpoint]:
        """The servers up, in the config's order, then those marked down."""
        down = {e.base_url for e in self.endpoints if self.health.has(e.base_url, Reason.DOWN)}
        return [e for e in self.endpoints if e.base_url not in down] + [e for e in self.endpoints if e.base_url in down]


def all_failed(what: str, failures: list[tuple[HttpEndpoint, Unavailable]]) -> BlobError:
    """The error of a call every server failed: Unreachable naming each address if none
    could be connected to, else Unavailable naming each server and its failure."""
    n = len(failures)
    if all(isinstance(exc, Unreachable) for _, exc in failures):
        errors = [exc for _, exc in failures if isinstance(exc, Unreachable)]
        hints = {e.hint for e in errors}
        each = "; ".join(f"{e.address}: {e.reason}" + ("" if len(hints) == 1 else f" ({e.hint})") for e in errors)
        tail = f" ({next(iter(hints))})" if len(hints) == 1 else ""
        return Unreachable(
            f"cannot reach any of the {n} API servers ({what}): {each}{tail}",
            role=API_SERVER.name,
            address=", ".join(e.address for e in errors),
            reason="; ".join(dict.fromkeys(e.reason for e in errors)),
            hint="; ".join(hints),
        )
    each = "; ".join(f"{endpoint.base_url}: {exc}" for endpoint, exc in failures)
    return Unavailable(f"none of the {n} API servers answered ({what}): {each}")
