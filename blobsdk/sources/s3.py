"""L4 on an S3-compatible object store (issue 13; extra ``s3``): AWS S3, MinIO, Ceph RGW, and
GCS or Azure through the same API, over obstore (async, a Rust core: its own connection pool,
retries with backoff, timeouts and the standard AWS credential chain).

Layout: one object per block, ``<prefix>/<shard>/<block_id>``, the shard being the first two
hex digits of xxh3_64 of the id, as in the local store: S3 scales request rates per key
prefix, and block ids begin with their time, so unsharded they would all share one.

- Reads are ranged GETs through ``limiter`` (the endpoint's adaptive concurrency limit, the
  one the HTTP block servers' reads go through), marking the hedged attempt queued while
  they wait for a permit.  A 503 SlowDown tells the limiter the store is overloaded.  The L4
  tier hedges and verifies them like any replica's.
- Writes: one PUT, or a multipart upload past ``multipart_bytes`` (parts of that size, up
  to ``max_concurrency`` at a time); a block is visible only once the store acknowledged it
  whole (an aborted multipart upload leaves nothing visible; a bucket lifecycle rule should
  expire such uploads).  An existing id is a no-op if its size matches, else
  PreconditionFailed (a HEAD first: a conditional PUT would rule out multipart).
- Retries: obstore retries a failed request with backoff, at most ``max_retries`` times and
  for at most ``timeout_s`` in all (its defaults, 10 times over 3 minutes, would stall a
  read far past the tiers' hang deadlines); each request is bounded by ``timeout_s`` too.
- Missing objects are BlockNotFound; a range past an object's end is CorruptData; refused
  credentials are Unauthorized or Forbidden; anything else, a connection refused or a
  timeout once retries are spent included, is Unavailable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self, cast

import obstore
import xxhash
from obstore.exceptions import BaseError, PermissionDeniedError, UnauthenticatedError

from ..errors import BadRequest, BlockNotFound, CorruptData, Forbidden, PreconditionFailed, Unauthorized, Unavailable
from ..hedge import Attempt
from ..limiter import AdaptiveLimiter
from ..wire import BlockInfo
from .base import Buffer, block_time, validate_block_id

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig
    from obstore.store import S3Config as ObstoreS3Config

MULTIPART_BYTES = 16 << 20


class S3BlockStore:
    """A :class:`~blobsdk.sources.base.BlockStore` in ``bucket`` under ``prefix``; see the
    module docstring.  ``config``: obstore's S3 options (``endpoint``, ``region``,
    ``access_key_id``, ``secret_access_key``...; absent ones come from the standard AWS
    environment and files); ``allow_http`` for an endpoint without TLS (MinIO, moto)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        config: Mapping[str, str] | None = None,
        allow_http: bool = False,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        limiter: AdaptiveLimiter | None = None,
        multipart_bytes: int = MULTIPART_BYTES,
        max_concurrency: int = 8,
    ) -> None:
        from obstore.store import S3Store

        if not bucket or "/" in bucket:
            raise ValueError(f"an S3 bucket name has no '/', got {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.limiter = limiter if limiter is not None else AdaptiveLimiter(f"s3://{bucket}")
        self.multipart_bytes = multipart_bytes
        self.max_concurrency = max_concurrency
        options: ClientConfig = {
            "allow_http": allow_http,
            "timeout": timedelta(seconds=timeout_s),
            "connect_timeout": timedelta(seconds=min(timeout_s, 5.0)),
        }
        retry: RetryConfig = {"max_retries": max_retries, "retry_timeout": timedelta(seconds=timeout_s)}
        s3 = cast("ObstoreS3Config", dict(config or {}))
        self._store = S3Store(bucket, prefix=self.prefix or None, config=s3, client_options=options, retry_config=retry)
        endpoint = (config or {}).get("endpoint", "")
        self._name = f"s3://{bucket}/{self.prefix}" + (f" at {endpoint}" if endpoint else "")

    @property
    def name(self) -> str:
        return self._name

    @property
    def replicas(self) -> tuple[S3BlockStore]:
        return (self,)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to close: obstore's pool goes with the store object."""

    def _key(self, block_id: str) -> str:
        return f"{xxhash.xxh3_64_hexdigest(block_id.encode())[:2]}/{block_id}"

    @contextmanager
    def _errors(self, block_id: str = "") -> Iterator[None]:
        try:
            yield
        except FileNotFoundError as exc:  # obstore's "not found"
            raise BlockNotFound(f"block {block_id} is not in {self.name}") from exc
        except UnauthenticatedError as exc:
            raise Unauthorized(f"{self.name}: {_first_line(exc)}") from exc
        except PermissionDeniedError as exc:
            raise Forbidden(f"{self.name}: {_first_line(exc)}") from exc
        except (BaseError, OSError) as exc:
            raise Unavailable(f"{self.name}: {_first_line(exc)}") from exc

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        validate_block_id(block_id)
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

    async def read_into(
        self, block_id: str, offset: int, out: memoryview, *, attempt: Attempt | None = None, grant: str = ""
    ) -> None:
        view = memoryview(out).cast("B")
        validate_block_id(block_id)
        if offset < 0:
            raise BadRequest(f"offset and length must not be negative, got {offset} and {view.nbytes}")
        if view.nbytes == 0:
            return
        if attempt is not None:
            attempt.queued()
        async with self.limiter.acquire(size=view.nbytes) as permit:
            if attempt is not None:
                attempt.in_service()
            try:
                with self._errors(block_id):
                    got = await obstore.get_range_async(self._store, self._key(block_id), start=offset, length=view.nbytes)
            except Unavailable as exc:
                cause = str(exc.__cause__)
                if "416" in cause:  # the range starts past the end
                    raise CorruptData(f"block {block_id}: no {view.nbytes} bytes at {offset}: past its end") from exc
                if "503" in cause:  # SlowDown, still, after obstore's retries
                    permit.overloaded()
                raise
        data = memoryview(got)
        if data.nbytes != view.nbytes:
            raise CorruptData(f"block {block_id}: {data.nbytes} bytes at {offset}, not {view.nbytes}: past its end")
        view[:] = data

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
        found: list[tuple[str, int]] = []
        with self._errors():
            async for batch in obstore.list(self._store, chunk_size=1000):
                for meta in batch:
                    block_id = str(meta["path"]).rsplit("/", 1)[-1]
                    if len(block_id) == 32:
                        found.append((block_id, int(meta["size"])))
        for block_id, size in sorted(found):
            yield BlockInfo(block_id=block_id, size=size, created=block_time(block_id))


def _first_line(exc: BaseException) -> str:
    """obstore's messages end in a multi-line debug dump: the first line says it."""
    return str(exc).split("\n", 1)[0] or type(exc).__name__


def _pieces(parts: Sequence[Buffer], size: int) -> Iterator[Any]:
    """The parts as buffers of at most ``size`` bytes (obstore uploads an iterator of them)."""
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, view.nbytes, size):
            yield view[start : start + size]
