"""L4 on an S3-compatible object store (extra ``s3``): AWS S3, MinIO, Ceph RGW, and
GCS or Azure through the same API, over obstore (async, a Rust core: its own connection pool,
retries with backoff, timeouts and the standard AWS credential chain).

Layout: one object per block, ``<prefix>/<shard>/<block_id>``, the shard being the first two
hex digits of xxh3_64 of the id, as in the local store: S3 scales request rates per key
prefix, and block ids begin with their time, so unsharded they would all share one.

- Reads are ranged GETs (SigV4-signed, over the SDK's own HTTP GET path: sources/_s3get.py;
  through obstore only without static credentials), each try through ``limiter`` (the
  endpoint's adaptive concurrency limit, the one the HTTP block servers' reads go through,
  made ``by_latency=False``: an object store's latency is no load signal, see
  blobsdk/net/limiter.py), marking the hedged attempt queued while it waits for a permit.
  Every throttle (429, 503 SlowDown) tells the limiter the store is overloaded, and a body that stops arriving for
  ``stall_s`` mid-transfer fails its try (ReplyStalled).  The L4 tier verifies them like
  any replica's.
- Writes: one PUT, or a multipart upload past ``multipart_bytes`` (parts of that size, up
  to ``max_concurrency`` at a time); a block is visible only once the store acknowledged it
  whole (an aborted multipart upload leaves nothing visible; a bucket lifecycle rule should
  expire such uploads).  An existing id is a no-op if its size matches, else
  PreconditionFailed (a HEAD first: a conditional PUT would rule out multipart).
- Retries: a request that failed for a reason another try may not meet (a throttle, a 5xx
  such as S3's 500 InternalError, a connection error, a stalled body) is tried again after
  a full-jitter exponential pause (``backoff``: blobsdk/net/retry.py) while the pause ends
  within ``timeout_s`` of the first try: the read's budget, not a count, as AWS's SDKs
  back off.  A try after a stall goes on a new connection; each try is bounded by
  ``timeout_s`` too.  obstore retries its requests (writes, listings, reads without static
  credentials) with the same pauses within a ``retry_timeout`` of ``timeout_s``.
- Missing objects are BlockNotFound; a range past an object's end is CorruptData; refused
  credentials are Unauthorized or Forbidden; a throttle that outlasted the budget is
  Overloaded, its message saying how many tries over how long; anything else, a connection
  refused or a timeout once retries are spent included, is Unavailable (the one error map:
  sources/_s3errors.py).
- **fork()**: obstore runs every request on one Rust (tokio) runtime per process, started
  by its first request, whose threads do not survive a fork: a forked child's obstore
  requests would hang for ever, a new store's too (measured: obstore 0.12.1).  Reads (of
  blocks, link blocks and the objects they point at) do not use obstore when the
  credentials are static (sources/_s3get.py), so they work in any process, a DataLoader
  worker forked after its parent read S3, listed or indexed included.  What needs obstore
  (writes, listings, HEADs, deletes, an index pass; reads without static credentials)
  raises NotForkSafe, saying what to do, in a process forked after the first
  obstore request (:func:`_forked_after_obstore`).  Every read, listing and link also gives up
  after ``2 * timeout_s + 5`` seconds whatever obstore does (TimedOut), for a runtime some
  other code in the parent started.

Link blocks (indexing in place, blobsdk/ops/index.py): a block id that begins with
:data:`~blobsdk.sources.base.LINK_TAG` names a small object of this store, under
``PREFIX/links/<shard>/<id>`` (listed on their own by :meth:`S3BlockStore.links`), holding an
:class:`S3Object` (bucket, key, ETag, size) in any bucket the credentials reach.  Its bytes
are that object's, read with ``If-Match`` its ETag, so a changed or deleted object is
SourceChanged, never other bytes; the link's own id carries a digest of what it points at,
checked when the link is read.  gc deletes links like blocks; the object is never touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, TypeVar, cast

import msgspec
import xxhash
from cachetools import LRUCache

from .._extras import requires_extra
from ..runtime import AsyncResource

with requires_extra("s3", "blobsdk.sources.S3BlockStore"):  # the name users import
    import obstore
    from obstore.store import S3Store

from ..chunks import Call, is_hex32, validate_block_id
from ..config import Timeouts
from ..errors import (
    BadRequest,
    BlobNotFound,
    BlockNotFound,
    CorruptData,
    Overloaded,
    PreconditionFailed,
    RangeNotSatisfiable,
    SourceChanged,
    TimedOut,
)
from ..net import AdaptiveLimiter, Backoff, Permit
from ..runtime import SingleFlight
from ..wire import BlockInfo
from ._s3errors import S3Errors
from ._s3get import Admit, S3Getter, S3Target, target_of
from ._s3obstore import _copied, _obstore_retries, _pieces
from .base import Buffer, block_time, is_link, links_to, new_link_id

if TYPE_CHECKING:
    from obstore.store import ClientConfig
    from obstore.store import S3Config as ObstoreS3Config

T = TypeVar("T")
MULTIPART_BYTES = 16 << 20
LINKS = "links"  # link blocks live under PREFIX/links/<shard>/<id>, so they can be listed alone
LINKS_KEPT = 1 << 16  # link blocks whose object a store remembers (about 200 bytes each)
LINK_MAX_BYTES = 64 << 10  # a link block's body is under 2 KiB (an S3 key is at most 1 KiB)
STALL_S = Timeouts().stall  # a read's body silent this long mid-transfer fails that try


class S3Object(msgspec.Struct, frozen=True, kw_only=True):
    """One version of an object, as listed: what a link block points at (its body, as JSON)."""

    bucket: str
    key: str
    etag: str
    size: int

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def identity(self) -> str:
        """Names this version: the link block ids made for it carry its digest."""
        return msgspec.json.encode((self.bucket, self.key, self.etag)).decode()


class S3BlockStore(AsyncResource):
    """A :class:`~blobsdk.sources.base.BlockStore` in ``bucket`` under ``prefix``; see the
    module docstring.  ``config``: obstore's S3 options (``endpoint``, ``region``,
    ``access_key_id``, ``secret_access_key``...; absent ones come from the standard AWS
    environment and files); ``allow_http`` for an endpoint without TLS (MinIO, moto).
    ``timeout_s``: each request's bound and a read's retry budget; ``stall_s``: the longest
    silence of a read's body mid-transfer (None: ``timeout_s``); ``backoff``: the pauses
    between tries (its clock, sleep and draws are a test's to inject)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        config: Mapping[str, str] | None = None,
        allow_http: bool = False,
        timeout_s: float = 30.0,
        stall_s: float | None = STALL_S,
        backoff: Backoff | None = None,
        limiter: AdaptiveLimiter | None = None,
        multipart_bytes: int = MULTIPART_BYTES,
        max_concurrency: int = 8,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"an S3 bucket name has no '/', got {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.limiter = limiter if limiter is not None else AdaptiveLimiter(f"s3://{bucket}", by_latency=False)
        self.multipart_bytes = multipart_bytes
        self.max_concurrency = max_concurrency
        options: ClientConfig = {
            "allow_http": allow_http,
            "timeout": timedelta(seconds=timeout_s),
            "connect_timeout": timedelta(seconds=min(timeout_s, 5.0)),
        }
        backoff = backoff if backoff is not None else Backoff()
        s3 = cast("ObstoreS3Config", dict(config or {}))
        self._open_store = partial(S3Store, config=s3, client_options=options, retry_config=_obstore_retries(backoff, timeout_s))
        target = target_of(dict(config or {}), allow_http)
        getter = partial(S3Getter, timeout_s=timeout_s, stall_s=stall_s, backoff=backoff)
        self._getter = getter(target) if isinstance(target, S3Target) else None
        self._store = self._open_store(bucket, prefix=self.prefix or None)
        self._buckets: dict[str, S3Store] = {}  # whole buckets that link blocks point into
        self._links: LRUCache[str, S3Object] = LRUCache(maxsize=LINKS_KEPT)
        self._link_reads: SingleFlight[S3Object] = SingleFlight()
        self._deadline_s = 2 * timeout_s + 5  # a read's bound, whatever obstore does (see the module docstring)
        self._endpoint = (config or {}).get("endpoint", "")
        self._name = f"s3://{bucket}/{self.prefix}" + (f" at {self._endpoint}" if self._endpoint else "")
        why_obstore_reads = target if isinstance(target, str) else ""
        self._errors = S3Errors(self._name, signs_reads=self._getter is not None, why_obstore_reads=why_obstore_reads).mapped

    @property
    def name(self) -> str:
        return self._name

    @property
    def replicas(self) -> tuple[S3BlockStore]:
        return (self,)

    async def aclose(self) -> None:
        """Stop link reads in flight and close this process's GET connections (obstore's
        pools go with the store objects)."""
        await self._link_reads.aclose()
        if self._getter is not None:
            await self._getter.aclose()

    def _key(self, block_id: str) -> str:
        key = f"{xxhash.xxh3_64_hexdigest(block_id.encode())[:2]}/{block_id}"
        return f"{LINKS}/{key}" if is_link(block_id) else key

    def _full_key(self, block_id: str) -> str:
        """A block's key in the bucket (the prefix included), for the signed GETs."""
        return f"{self.prefix}/{self._key(block_id)}" if self.prefix else self._key(block_id)

    def _bucket(self, bucket: str) -> S3Store:
        """A store over the whole of ``bucket``, for link blocks' objects."""
        store = self._buckets.get(bucket)
        if store is None:
            store = self._buckets[bucket] = self._open_store(bucket)
        return store

    @asynccontextmanager
    async def _bounded(self, what: str) -> AsyncIterator[None]:
        """At most ``2 * timeout_s + 5`` seconds, whatever obstore does (module docstring)."""
        try:
            async with asyncio.timeout(self._deadline_s):
                yield
        except TimeoutError as exc:
            at = f" at {self._endpoint}" if self._endpoint else ""
            raise TimedOut(f"{what}: no answer in {self._deadline_s:.0f}s{at}") from exc

    async def _each(self, items: AsyncIterable[T], what: str) -> AsyncIterator[T]:
        """``items``, each one awaited within the deadline of :meth:`_bounded`."""
        iterator = aiter(items)
        while True:
            try:
                async with self._bounded(what):
                    item = await anext(iterator)
            except StopAsyncIteration:
                return
            yield item

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        validate_block_id(block_id)
        if is_link(block_id):
            raise BadRequest(f"block id {block_id} is a link block's: links are made by link(), not written")
        size = sum(memoryview(p).nbytes for p in parts)
        key = self._key(block_id)
        try:
            with self._errors(block_id):
                existing = await obstore.head_async(self._store, key)
        except BlockNotFound:
            pass
        else:
            if existing["size"] != size:
                raise PreconditionFailed(
                    f"block {block_id} exists with {existing['size']} bytes, not {size}: blocks are immutable"
                )
            return
        with self._errors(block_id):
            await obstore.put_async(
                self._store,
                key,
                list(_pieces(parts, self.multipart_bytes)) if size > self.multipart_bytes else b"".join(parts),
                use_multipart=size > self.multipart_bytes,
                chunk_size=self.multipart_bytes,
                max_concurrency=self.max_concurrency,
            )

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        view = memoryview(out).cast("B")
        validate_block_id(block_id)
        if offset < 0:
            raise BadRequest(f"offset and length must not be negative, got {offset} and {view.nbytes}")
        if view.nbytes == 0:
            return
        try:
            got = await self._range_into(block_id, offset, view, partial(self._admitted, call, view.nbytes))
        except RangeNotSatisfiable as exc:  # the range starts past the end
            raise CorruptData(f"{self._what(block_id)}: no {view.nbytes} bytes at {offset}: past its end") from exc
        if got != view.nbytes:
            raise CorruptData(f"{self._what(block_id)}: {got} bytes at {offset}, not {view.nbytes}: past its end")

    @asynccontextmanager
    async def _admitted(self, call: Call | None, size: int) -> AsyncIterator[Permit]:
        """A permit of the endpoint's limiter for one try of a read, ``call`` marked
        queued while it waits; a SlowDown that reaches it through obstore's retries backs
        the limit off (the signed GETs tell the permit themselves)."""
        async with self.limiter.acquire(call, size=size) as permit:
            try:
                yield permit
            except Overloaded:
                permit.overloaded()
                raise

    async def _range_into(self, block_id: str, offset: int, out: memoryview, admit: Admit) -> int:
        """Bytes from ``offset`` into ``out``: how many there were (fewer past the end)."""
        if is_link(block_id):
            obj = await self.linked(block_id)
            async with self._bounded(obj.url):
                return await self._object_range_into(obj, offset, out, admit)
        async with self._bounded(f"block {block_id}"):
            return await self._block_range_into(block_id, offset, out, admit)

    def _what(self, block_id: str) -> str:
        """What a block's bytes are, for messages: a link block's object, or the block."""
        obj = self._links.get(block_id)
        return obj.url if obj is not None else f"block {block_id}"

    async def _block_range_into(self, block_id: str, offset: int, out: memoryview, admit: Admit) -> int:
        if self._getter is not None:
            with self._errors(block_id, signed=True):
                return await self._getter.get_into(self.bucket, self._full_key(block_id), out, start=offset, admit=admit)
        async with admit():
            with self._errors(block_id):
                key, length = self._key(block_id), out.nbytes
                return _copied(memoryview(await obstore.get_range_async(self._store, key, start=offset, length=length)), out)

    async def _object_range_into(self, obj: S3Object, offset: int, out: memoryview, admit: Admit) -> int:
        """Bytes of an indexed object, only while it is the version that was indexed."""
        if self._getter is not None:
            with self._errors(obj=obj, signed=True):
                return await self._getter.get_into(obj.bucket, obj.key, out, start=offset, if_match=obj.etag, admit=admit)
        async with admit():
            with self._errors(obj=obj):
                got = await obstore.get_async(
                    self._bucket(obj.bucket), obj.key, options={"if_match": obj.etag, "range": (offset, offset + out.nbytes)}
                )
                return _copied(memoryview(await got.bytes_async()), out)

    # --- link blocks: objects indexed in place ------------------------------------------------

    async def link(self, obj: S3Object) -> str:
        """A new link block for ``obj`` (durable on return): its id, whose bytes are the
        object's for as long as its ETag is ``obj.etag``."""
        block_id = new_link_id(obj.identity)
        with self._errors(block_id):
            async with self._bounded(f"link block {block_id}"):
                await obstore.put_async(self._store, self._key(block_id), msgspec.json.encode(obj))
        self._links[block_id] = obj
        return block_id

    async def linked(self, block_id: str) -> S3Object:
        """The object link block ``block_id`` points at (read once, then kept: links never change)."""
        obj = self._links.get(block_id)
        if obj is None:
            obj, _ = await self._link_reads.run(block_id, partial(self._read_link, block_id))
            self._links[block_id] = obj
        return obj

    async def _read_link(self, block_id: str) -> S3Object:
        async with self._bounded(f"link block {block_id}"):
            if self._getter is not None:
                buf = bytearray(LINK_MAX_BYTES)
                with self._errors(block_id, signed=True):
                    body = bytes(buf[: await self._getter.get_into(self.bucket, self._full_key(block_id), memoryview(buf))])
            else:
                with self._errors(block_id):
                    body = bytes(await (await obstore.get_async(self._store, self._key(block_id))).bytes_async())
        try:
            obj = msgspec.json.decode(body, type=S3Object)
        except msgspec.DecodeError as exc:
            raise CorruptData(f"link block {block_id} in {self.name} is not a link: {exc}") from exc
        if not links_to(block_id, obj.identity):
            raise CorruptData(
                f"link block {block_id} in {self.name} points at {obj.url} (ETag {obj.etag}): not what its id names"
            )
        return obj

    async def objects(self, bucket: str, prefix: str = "") -> AsyncIterator[S3Object]:
        """Every object of ``bucket`` under the directory ``prefix`` ("" for all), in key order;
        BlobNotFound if there is no such bucket, BadRequest if a key there has an empty or a
        ".." segment (obstore lists none)."""
        where = f"s3://{bucket}/{prefix}"
        with self._errors(where=where, listing=True):
            listing = obstore.list(self._bucket(bucket), prefix=prefix or None, chunk_size=1000)
            async for batch in self._each(listing, where):
                for meta in batch:
                    yield S3Object(bucket=bucket, key=str(meta["path"]), etag=meta["e_tag"] or "", size=int(meta["size"]))

    async def read_object(self, obj: S3Object, piece_bytes: int = 8 << 20) -> AsyncIterator[memoryview]:
        """The bytes of ``obj`` in pieces of about ``piece_bytes``, each within the deadline;
        SourceChanged if the object is not (any more) the version ``obj`` names."""
        try:
            with self._errors(obj=obj):
                async with self._bounded(obj.url):
                    got = await obstore.get_async(self._bucket(obj.bucket), obj.key, options={"if_match": obj.etag})
                async for piece in self._each(got.stream(min_chunk_size=piece_bytes), obj.url):
                    yield memoryview(piece)
        except SourceChanged as exc:
            raise SourceChanged(f"{obj.url} changed or was deleted since it was listed: not indexed") from exc

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        validate_block_id(block_id)
        if offset < 0 or length < 0:
            raise BadRequest(f"offset and length must not be negative, got {offset} and {length}")
        buf = bytearray(length)
        await self.read_into(block_id, offset, memoryview(buf))
        return bytes(buf)

    async def delete_block(self, block_id: str) -> None:
        validate_block_id(block_id)
        with self._errors(block_id):
            await obstore.delete_async(self._store, self._key(block_id))

    async def list_blocks(self) -> AsyncIterator[BlockInfo]:
        """Every block, sorted by id: the whole listing is read first (gc's use), since the
        shards interleave the ids."""
        for block_id, size in sorted([found async for found in self._listed()]):
            yield BlockInfo(block_id=block_id, size=size, created=block_time(block_id))

    async def links(self) -> set[str]:
        """The ids of every link block in the store (one listing of their own prefix)."""
        return {block_id async for block_id, _ in self._listed(LINKS)}

    async def _listed(self, under: str | None = None) -> AsyncIterator[tuple[str, int]]:
        """(id, size) of the blocks under ``under`` (all if None): only keys of the block
        layout, so an object of anything else that is there is never taken for a block."""
        with self._errors():
            async for batch in self._each(obstore.list(self._store, prefix=under, chunk_size=1000), self.name):
                for meta in batch:
                    key = str(meta["path"])
                    block_id = key.rsplit("/", 1)[-1]
                    if is_hex32(block_id) and key == self._key(block_id):
                        yield block_id, int(meta["size"])

    async def exists(self, bucket: str, key: str) -> bool:
        """Whether ``bucket`` holds an object ``key`` now."""
        where = f"s3://{bucket}/{key}"
        try:
            with self._errors(where=where):
                async with self._bounded(where):
                    await obstore.head_async(self._bucket(bucket), key)
        except BlobNotFound:
            return False
        return True
