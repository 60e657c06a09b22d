"""A redis-py client for a URL of blobsdk/_redisurl.py: one server (``redis://``), a Redis
Cluster (any node's URL), or the primary that Sentinels name (``redis+sentinel://``).

Through Sentinels, every new connection asks them for the primary's address, and a
connection to a primary since demoted (``READONLY``) is dropped, so the next call reaches
the promoted one (redis-py's ``SentinelConnectionPool``); a call in flight at the failover
fails, and the caller sees Unavailable.

A call is tried again once, at once, when its connection fails (a pooled connection the
server closed, or one to a primary since demoted), and never after a timeout, so
``timeout`` bounds each connect and each reply and a call takes at most two.  After a
failure the idle pooled connections are dropped (:meth:`RedisConnection.drop_idle`): the
next calls connect afresh (through Sentinels, to the primary they name now) instead of each
timing out on its own connection to a server that is gone."""

from __future__ import annotations

from typing import Any

from .._extras import requires_extra
from .._redisurl import is_sentinel, sentinel_url

with requires_extra("redis", __name__):
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError


SENTINEL_TIMEOUT_S = 1.0  # bounds asking one Sentinel: they are asked in turn, and one that is cut off must not hold up the next


class RedisConnection:
    """``client``, a redis-py asyncio client, and the Sentinel clients behind it (if any),
    closed together by :meth:`aclose`.  ``cluster``: the client is a RedisCluster."""

    def __init__(self, client: Any, *, sentinel: Any = None, cluster: bool = False) -> None:
        self.client = client
        self.sentinel = sentinel
        self.cluster = cluster

    async def drop_idle(self) -> None:
        """Close the pooled connections no call is using (a Cluster client manages its own)."""
        if not self.cluster:
            await self.client.connection_pool.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        finally:
            if self.sentinel is not None:
                await self.sentinel.aclose()


def client_for(url: str, *, timeout: float) -> RedisConnection:
    """A client for one server's URL, or for the Sentinels' primary (it connects on first
    use); ``timeout`` bounds each connect and each reply."""
    once = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    if not is_sentinel(url):
        return RedisConnection(aioredis.Redis.from_url(url, retry=once, socket_timeout=timeout, socket_connect_timeout=timeout))
    found = sentinel_url(url)
    asking = min(timeout, SENTINEL_TIMEOUT_S)
    sentinel = Sentinel(
        found.sentinels, sentinel_kwargs={"socket_timeout": asking, "socket_connect_timeout": asking, "ssl": found.tls}
    )
    primary = sentinel.master_for(
        found.service,
        db=found.db,
        retry=once,
        username=found.username,
        password=found.password,
        ssl=found.tls,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    return RedisConnection(primary, sentinel=sentinel)


async def connect(url: str, *, timeout: float) -> RedisConnection:  # noqa: ASYNC109 (a socket timeout, passed on)
    """:func:`client_for`, or a RedisCluster client when the server at ``url`` says it is a
    Cluster node (``INFO cluster``: one round trip, so an unreachable server fails here)."""
    single = client_for(url, timeout=timeout)
    if single.sentinel is not None:
        return single
    try:
        info = await single.client.info("cluster")
    except BaseException:
        await single.aclose()
        raise
    if not info.get("cluster_enabled"):
        return single
    await single.aclose()
    cluster = RedisCluster.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        await cluster.initialize()
    except BaseException:
        await cluster.aclose()
        raise
    return RedisConnection(cluster, cluster=True)
