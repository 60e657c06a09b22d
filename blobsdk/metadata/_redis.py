"""Redis metadata store (extra ``redis``): the :class:`~blobsdk.metadata.base.MetadataStore`
for deployments past one machine, over redis-py's asyncio client, on a single Redis server,
a primary its Sentinels name and fail over (``redis+sentinel://``, blobsdk/_redisurl.py), or
a Redis Cluster (found out at open: ``INFO cluster``).

Layout, under a namespace ``ns`` (default ``blobsdk``), per bucket (a path's first segment):

- ``ns:{bucket}:p:<path>``: a hash per path: ``v``, the last version assigned (kept by a
  delete, so versions stay monotonic across delete and re-create, like SQLite's tombstones),
  and while the path is live ``plan`` (the msgpack ReadPlan, stored with version 0 and
  created 0: the two live in ``v`` and ``t``), ``size``, ``etag`` and ``chunks`` (so listing
  never decodes plans) and ``t`` (created).  A lookup is one ``HMGET``: O(1).
- ``ns:{bucket}:idx``: a sorted set of the bucket's live paths, all of score 0, so that
  ``ZRANGEBYLEX`` lists a prefix in byte order (UTF-8 bytes order like code points, as
  SQLite's).
- ``ns:buckets``: a sorted set of every bucket ever committed to (added before a commit; a
  bucket whose blobs are all gone stays, and lists nothing).
- ``ns:{bucket}:b:<block id>``: the reverse index, a sorted set (score 0) of the bucket's
  live paths whose plan names the block, kept by the commit and delete scripts (a path's
  hash keeps its block ids in ``blocks``, so an overwrite or delete knows which to drop).
  ``naming_page`` reads one range per (block, bucket).  ``ns:refs`` says every plan is in
  it: a namespace written by a build before the index is indexed at the first open by this
  one (one pass over the plans, each indexed only if unchanged since read).  **Every client
  that commits must be of this build or later**: an older one commits plans repair cannot
  find.
- ``ns:fences`` and ``ns:{bucket}:fences``: gc's fences (block id, scored by the Redis
  server's time when set), globally and copied into every bucket's slot, where the commit
  script checks them.

A listing page is one Lua script call per bucket it spans (``LIST``; the scripts are in
blobsdk/metadata/_redis_lua.py): it reads the index range and the page's hashes at one
instant and answers in one msgpack string, which msgspec decodes straight into BlobInfo.
Hand-written for speed: redis-py parses replies in Python, element by element (~40-190 µs
per entry when every entry was an ``HMGET`` reply, 4.4-18.7 s for 10^5 entries); the script
lists 10^5 entries in ~0.4 s (``python -m benchmarks scale``, ``redis_list_1e5_ms``). The
price is the server's: ~3.3-4 µs of its CPU per entry listed (``INFO cpu``) against ~1.8-2.2
µs for the pipelined reads (``redis.call`` costs more than a command read off the socket),
and ~2.5 ms per 1,000-entry page during which it serves nobody else (a 10,000-entry page,
the largest, ~25 ms). ``get_plans`` stays pipelined ``HMGET``s: a script there cuts its
client time 2.6x but doubles the server's CPU per path, on the hot path.

Commits run as one Lua script (atomic on the server: every precondition is checked against
the state the earlier ops of the same batch leave, before anything is written), and so do
deletes.  On Redis Cluster a script's keys must share one hash slot: the ``{bucket}`` hash tag
puts a bucket's keys in one, so **a commit's paths must share their bucket there**
(BadRequest otherwise; a single server takes any batch).  A listing or gc scan walks the
buckets one after another, so it spans slots and masters.  A bucket is one slot: a
deployment spreads over the cluster by buckets (datasets, checkpoint prefixes, users).

Failures: a connection refused or lost, a timeout (``timeout`` bounds each connect and each
reply; a call is tried once more only when its connection failed, blobsdk/metadata/_redis_connect.py) or a
cluster without a master for a slot is Unavailable; redis-py reconnects on the next call, so
a restarted server serves again.  As with any remote store, a commit whose answer was lost
may or may not have happened.  Durability is the server's: with ``appendfsync always`` an
acknowledged commit survives a crash; Redis's default (``everysec``) may lose the last second.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self

import msgspec

from .._extras import requires_extra
from .._redisurl import check_redis_url
from . import _redis_lua as lua
from . import _redis_rows as rows

with requires_extra("redis", "blobsdk.metadata.RedisMetadataStore"):  # the name users import
    import redis.exceptions as rexc

from ..chunks import bucket_of, validate_hex32, validate_path
from ..errors import BadRequest, BlobError, BlobNotFound, ClientClosed, Unavailable
from ..net import REDIS, unreachable
from ..wire import BlobInfo, CommitOp, ReadPlan, WriteKind
from ._redis_connect import RedisConnection, connect
from .backend import MetadataBackend
from .base import block_collected, check_delete, checked_ops, precondition_failed, prefix_end

REQUEST_TTL_S = 3600  # how long a retryable write's record is kept: a retry later than this applies again
REFS_VERSION = "1"  # the value of ``ns:refs`` once every plan is in the reverse index

_page_decoder = msgspec.msgpack.Decoder(builtins.list[BlobInfo], strict=False)  # the numbers come as strings
_plan_decoder = msgspec.msgpack.Decoder(ReadPlan)
_encoder = msgspec.msgpack.Encoder()


class RedisMetadataStore(MetadataBackend):
    """MetadataStore over Redis at ``url`` (``redis://HOST:PORT/DB``, ``rediss://`` for TLS,
    ``redis://:PASSWORD@HOST:PORT/DB``, or ``redis+sentinel://HOST:PORT,.../SERVICE/DB``);
    see the module docstring.  Connects on first use,
    or at ``open()`` / ``async with``; ``aclose()`` closes, and any later call is ClientClosed."""

    def __init__(self, url: str, *, namespace: str = "blobsdk", timeout: float = 5.0) -> None:
        check_redis_url(url, "a Redis metadata URL")
        if not namespace or "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace must be non-empty and without braces, got {namespace!r}")
        self.url = url
        self.namespace = namespace
        self.timeout = timeout
        self.cluster: bool | None = None  # known once open
        self._keys = rows.Keys(namespace)
        self._redis: Any = None
        self._connection: RedisConnection | None = None
        self._failed = False  # a call's connection failed since the last call began
        self._closed = False
        self._commit_script: Any = None
        self._delete_script: Any = None
        self._fence_script: Any = None
        self._index_script: Any = None
        self._list_script: Any = None

    def __repr__(self) -> str:
        return f"RedisMetadataStore({rows.redacted(self.url)!r})"

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self) -> Self:
        """Connect now (idempotent): Unavailable if the server cannot be reached."""
        await self._client()
        return self

    async def aclose(self) -> None:
        self._closed = True
        connection, self._connection, self._redis = self._connection, None, None
        if connection is not None:
            await connection.aclose()

    async def _client(self) -> Any:
        if self._closed:
            raise ClientClosed("metadata store is closed")
        if self._redis is not None:
            if self._failed and self._connection is not None:
                self._failed = False
                await self._connection.drop_idle()  # after a failure: connect afresh (_redis_connect.py)
            return self._redis
        with self._errors():
            connection = self._connection = await connect(self.url, timeout=self.timeout)
        client, self.cluster = connection.client, connection.cluster
        self._commit_script, self._delete_script = client.register_script(lua.COMMIT), client.register_script(lua.DELETE)
        self._fence_script, self._list_script = client.register_script(lua.FENCE), client.register_script(lua.LIST)
        self._index_script = client.register_script(lua.INDEX)
        self._redis = client  # set first: the pass below reads through it
        try:
            with self._errors():
                if await client.get(self._keys.refs_done) != REFS_VERSION.encode():
                    await self._index_old_plans(client)
                    await client.set(self._keys.refs_done, REFS_VERSION)
        except BaseException:
            self._redis = self._connection = None  # the next call connects and tries the pass again
            await connection.aclose()
            raise
        return client

    async def _index_old_plans(self, client: Any) -> None:
        """Put the plans committed before the reverse index into it (module docstring)."""
        cursor: str | None = None
        while True:
            paths = await self._paths("/", cursor, 1001)
            found = await self._stored(paths[:1000])
            by_bucket: dict[str, builtins.list[ReadPlan]] = {}
            for plan in found:
                if plan is not None:
                    by_bucket.setdefault(bucket_of(plan.path), []).append(plan)
            for bucket, plans in by_bucket.items():
                args: builtins.list[Any] = [self._keys.refs(bucket, "")]
                for plan in plans:
                    args += [plan.path, plan.etag, ",".join(sorted(plan.block_ids()))]
                await self._index_script(keys=[self._keys.path(plan.path) for plan in plans], args=args)
            if len(paths) <= 1000:
                return
            cursor = paths[999]

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterDownError, rexc.TryAgainError, OSError) as exc:
            self._failed = True
            if (error := unreachable(REDIS, self.url, "the metadata store", exc)) is not None:
                raise error from exc
            raise Unavailable(f"metadata store {rows.redacted(self.url)}: {str(exc) or type(exc).__name__}") from exc
        except rexc.RedisError as exc:
            raise BlobError(f"metadata store {rows.redacted(self.url)}: {exc}") from exc

    async def _register(self, client: Any, buckets: builtins.list[str]) -> None:
        """Add ``buckets`` to the bucket list; a bucket new to it first gets a copy of the
        global fences, which gc sets before it reads the bucket list, so no commit into a
        bucket gc did not see can name a fenced block."""
        async with client.pipeline(transaction=False) as pipe:
            for bucket in buckets:
                pipe.zadd(self._keys.buckets, {bucket: 0}, nx=True)
            added = await pipe.execute()
        for bucket, new in zip(buckets, added, strict=True):
            if new:
                fences = await client.zrange(self._keys.fences(None), 0, -1, withscores=True)
                if fences:
                    await client.zadd(self._keys.fences(bucket), dict(fences), nx=True)

    # --- fences (gc's handshake with writers; see base.py) --------------------------------

    async def _fence(self, ids: builtins.list[str]) -> None:
        """The global set first, then every bucket's: a bucket registered after the bucket
        list is read copies the global set (:meth:`_register`)."""
        client = await self._client()
        with self._errors():
            now = await self._now(client)
            await self._fence_script(keys=[self._keys.fences(None)], args=[repr(now), *ids])
            for bucket in await self._buckets_under("/"):
                await self._fence_script(keys=[self._keys.fences(bucket)], args=[repr(now), *ids])

    async def _unfence(self, ids: builtins.list[str]) -> None:
        """The global set first, so a bucket registered meanwhile copies no lifted fence."""
        client = await self._client()
        with self._errors():
            await client.zrem(self._keys.fences(None), *ids)
            for bucket in await self._buckets_under("/"):
                await client.zrem(self._keys.fences(bucket), *ids)

    async def _prune_fences(self, older_than: float) -> int:
        client = await self._client()
        with self._errors():
            cutoff = await self._now(client) - older_than
            pruned = await client.zremrangebyscore(self._keys.fences(None), "-inf", f"({cutoff!r}")
            for bucket in await self._buckets_under("/"):
                await client.zremrangebyscore(self._keys.fences(bucket), "-inf", f"({cutoff!r}")
        return int(pruned)

    async def _now(self, client: Any) -> float:
        """The server's clock (one clock for every fence, whatever the clients' skew)."""
        answer = await client.time()  # on a cluster, one node's (nodes agree to NTP's precision)
        seconds, micros = next(iter(answer.values())) if isinstance(answer, dict) else answer
        return int(seconds) + int(micros) / 1e6

    # --- the backend's work (MetadataBackend has checked the arguments) -------------------

    async def _get_plan(self, path: str) -> ReadPlan | None:
        client = await self._client()
        with self._errors():
            fields = await client.hmget(self._keys.path(path), "plan", "v", "t")
        return rows.plan_of(path, fields)

    async def _get_plans(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        if not paths:
            return []
        client = await self._client()
        with self._errors():
            async with client.pipeline(transaction=False) as pipe:
                for path in paths:
                    pipe.hmget(self._keys.path(path), "plan", "v", "t")
                found = await pipe.execute()
        return [rows.plan_of(path, fields) for path, fields in zip(paths, found, strict=True)]

    async def _commit_many(self, ops: builtins.list[CommitOp]) -> builtins.list[ReadPlan]:
        return await self._commit_ops(ops, None)

    async def commit_once(self, ops: Sequence[CommitOp], request_id: str) -> builtins.list[ReadPlan]:
        """``commit_many``, applied at most once per ``request_id`` (:class:`RetryAwareStore`)."""
        request_id = validate_hex32(request_id, "request_id")
        ops = checked_ops(ops)
        return await self._commit_ops(ops, request_id) if ops else []

    async def _commit_ops(self, ops: builtins.list[CommitOp], request_id: str | None) -> builtins.list[ReadPlan]:
        client = await self._client()
        buckets = sorted({bucket_of(op.path) for op in ops})
        if self.cluster and len(buckets) > 1:
            raise BadRequest(f"on Redis Cluster a commit's paths must share their bucket; these are in {buckets}")
        now = time.time()
        args: list[Any] = [repr(now)]
        for op in ops:
            stored = msgspec.structs.replace(op.plan, version=0, created=0.0)
            if_version = "" if op.if_version is None else str(op.if_version)
            block_ids = ",".join(sorted(op.plan.block_ids()))
            args += [op.path, if_version, _encoder.encode(stored), op.plan.size, op.plan.etag, len(op.plan.chunks), block_ids]
        keys = [self._keys.path(op.path) for op in ops] + [self._keys.index(bucket_of(op.path)) for op in ops]
        keys += [self._keys.fences(bucket_of(op.path)) for op in ops]
        if request_id is not None:
            keys.append(self._keys.request(ops[0].path, request_id))
            args.append(REQUEST_TTL_S)
        with self._errors():
            await self._register(client, buckets)
            answer = await self._commit_script(keys=keys, args=args)
        if answer[0] == -4:
            now, versions = rows.replayed_commit(answer[1], [op.path for op in ops], request_id)
        elif answer[0] == -3:
            raise block_collected(ops[answer[1]].path, answer[2].decode())
        elif answer[0] == -1:
            op = ops[answer[1]]
            raise precondition_failed(op.path, op.if_version, int(answer[2]) or None)
        else:
            versions = [int(v) for v in answer[1:]]
        return [msgspec.structs.replace(op.plan, version=v, created=now) for op, v in zip(ops, versions, strict=True)]

    async def _delete(self, path: str, if_version: int | None, kind: WriteKind) -> BlobInfo:
        return await self._delete_path(path, if_version, None)

    async def delete_once(self, path: str, if_version: int | None, kind: WriteKind, request_id: str) -> BlobInfo:
        """``delete``, applied at most once per ``request_id`` (:class:`RetryAwareStore`)."""
        request_id = validate_hex32(request_id, "request_id")
        check_delete(path, if_version, kind)
        return await self._delete_path(path, if_version, request_id)

    async def _delete_path(self, path: str, if_version: int | None, request_id: str | None) -> BlobInfo:
        await self._client()
        keys, args = [self._keys.path(path), self._keys.index(bucket_of(path))], [path, "" if if_version is None else if_version]
        if request_id is not None:
            keys.append(self._keys.request(path, request_id))
            args.append(REQUEST_TTL_S)
        with self._errors():
            answer = await self._delete_script(keys=keys, args=args)
        if answer[0] == -4:
            recorded = rows.record(answer[1], path)
            if recorded[0] != path:
                raise BadRequest(f"request_id {request_id} was used for another write")
            return rows.info(path, recorded[1:])
        if answer[0] == -2:
            raise BlobNotFound(f"no blob at {path!r}")
        if answer[0] == -1:
            raise precondition_failed(path, if_version, int(answer[1]))
        return rows.info(path, answer[1:])

    async def _list_page(self, prefix: str, start_after: str | None, limit: int) -> tuple[builtins.list[BlobInfo], str | None]:
        """One script call per bucket the page spans (one for a prefix inside a bucket): it
        reads the index and the page's hashes at one instant and answers in one msgpack
        string (see the module docstring for the figures)."""
        await self._client()
        items: builtins.list[BlobInfo] = []
        read, cursor = 0, None
        with self._errors():
            for bucket, low, high in await self._ranges(prefix, start_after):
                args = [self._keys.stem(bucket), low, high, limit + 1 - read, max(limit - read, 0)]
                packed, count, last = await self._list_script(keys=[self._keys.index(bucket)], args=args)
                items += rows.listed(packed)
                cursor = cursor if last is None else last.decode()
                read += count
                if read > limit:
                    break
        return items, (cursor if read > limit else None)

    async def _scan_page(self, start_after: str | None, limit: int) -> tuple[builtins.list[ReadPlan], str | None]:
        paths = await self._paths("/", start_after, limit + 1)
        plans = [plan for plan in await self._stored(paths[:limit]) if plan is not None]
        return plans, (paths[limit - 1] if len(paths) > limit else None)

    async def _naming_page(
        self, ids: builtins.list[str], after: tuple[str, str], limit: int
    ) -> tuple[builtins.list[ReadPlan], str | None]:
        refs: builtins.list[tuple[str, str]] = []
        client = await self._client()
        with self._errors():
            buckets = await self._buckets_under("/")
            for block_id in sorted(b for b in ids if b >= after[0]):
                since = after[1] if block_id == after[0] else ""
                refs += await self._naming_one(client, block_id, buckets, since, limit + 1 - len(refs))
                if len(refs) > limit:
                    break
        paths = builtins.list(dict.fromkeys(path for _, path in refs[:limit]))
        plans = [plan for plan in await self._stored(paths) if plan is not None]  # one gone meanwhile: skipped
        return plans, ("/".join(refs[limit - 1]) if len(refs) > limit else None)

    async def _stored(self, paths: builtins.list[str]) -> builtins.list[ReadPlan | None]:
        """The plans at ``paths`` this store's own index named (valid paths, else InvalidPath)."""
        return await self._get_plans([validate_path(path) for path in paths])

    async def _naming_one(
        self, client: Any, block_id: str, buckets: builtins.list[str], since: str, count: int
    ) -> builtins.list[tuple[str, str]]:
        """Up to ``count`` (block id, path) references after path ``since``, in path order:
        one range per bucket, in one pipeline."""
        wanted = [b for b in buckets if not since or prefix_end(f"/{b}/") > since]
        low = f"({since}" if since else "-"
        async with client.pipeline(transaction=False) as pipe:
            for bucket in wanted:
                pipe.zrangebylex(self._keys.refs(bucket, block_id), low, "+", start=0, num=count)
            found = await pipe.execute()
        paths = [p.decode() for raw in found for p in raw]
        return [(block_id, path) for path in paths[:count]]

    async def _paths(self, prefix: str, start_after: str | None, count: int) -> builtins.list[str]:
        """Up to ``count`` live paths under ``prefix`` after ``start_after``, sorted, from
        one bucket after another."""
        client = await self._client()
        found: builtins.list[str] = []
        with self._errors():
            for bucket, low, high in await self._ranges(prefix, start_after):
                raw = await client.zrangebylex(self._keys.index(bucket), low, high, start=0, num=count - len(found))
                found += [p.decode() for p in raw]
                if len(found) >= count:
                    break
        return found

    async def _ranges(self, prefix: str, start_after: str | None) -> builtins.list[tuple[str, str, str]]:
        """The buckets a listing of ``prefix`` after ``start_after`` walks, in path order,
        each with the ``ZRANGEBYLEX`` bounds of its index to read."""
        low = f"({start_after}" if start_after is not None and start_after >= prefix else f"[{prefix}"
        high = f"({prefix_end(prefix)}"
        return [
            (bucket, low, high)
            for bucket in await self._buckets_under(prefix)
            # a bucket sorting wholly before the cursor is skipped
            if start_after is None or prefix_end(f"/{bucket}/") > start_after
        ]

    async def _buckets_under(self, prefix: str) -> builtins.list[str]:
        """The buckets a prefix can match, in the order their paths sort (by "bucket/")."""
        body = prefix[1:]
        if "/" in body:
            return [body.split("/", 1)[0]]
        client = await self._client()
        if body:
            raw = await client.zrangebylex(self._keys.buckets, f"[{body}", f"({prefix_end(body)}")
        else:
            raw = await client.zrangebylex(self._keys.buckets, "-", "+")
        return sorted((b.decode() for b in raw), key=lambda b: b + "/")
