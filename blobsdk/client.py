"""Client (async) and SyncClient (blocking, on a background loop thread).

A client is a MetadataStore plus a BlockStore plus the read and write paths over them.
``Client.local(dir)`` is the embedded default (SQLite + a local block directory, no
servers); ``Client(config)`` talks to a cluster (API server + replicated block servers).
Every resource is opened in ``__aenter__`` and closed, with every task it started, in
``__aexit__``/``aclose``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Self, TypeVar

from . import gc as gc_module
from ._http import new_session
from .config import ClientConfig, ReadConfig, WriteConfig
from .errors import ClientClosed
from .metadata.base import MetadataStore
from .paths import validate_path, validate_prefix
from .reader import Reader
from .sources.base import BlockStore, Buffer
from .stats import TierStats
from .wire import BlobInfo
from .writer import Progress, Writer

T = TypeVar("T")
Item = tuple[str, Buffer]
Opener = Callable[[AsyncExitStack], Awaitable[tuple[MetadataStore, BlockStore]]]


class Client:
    """The async blobsdk client.  Use as ``async with Client(config) as c:``."""

    def __init__(self, config: ClientConfig) -> None:
        self.config: ClientConfig | None = config
        self._setup(self._open_cluster, config.write, config.read)

    def _setup(self, opener: Opener, write: WriteConfig, read: ReadConfig) -> None:
        self._opener = opener
        self._write = write
        self._read = read
        self._stack: AsyncExitStack | None = None
        self._state: _Open | None = None

    @classmethod
    def local(cls, root: str | Path, *, write: WriteConfig = WriteConfig(), read: ReadConfig = ReadConfig()) -> Client:
        """Embedded client: SQLite metadata in ``root/meta.sqlite``, blocks in ``root/blocks``."""
        root = Path(root)

        async def open_local(stack: AsyncExitStack) -> tuple[MetadataStore, BlockStore]:
            from .metadata.sqlite import SqliteMetadataStore
            from .sources.local import LocalBlockStore

            await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
            metadata = await stack.enter_async_context(SqliteMetadataStore(root / "meta.sqlite"))
            blocks = await stack.enter_async_context(LocalBlockStore(root / "blocks"))
            return metadata, blocks

        return cls._with_opener(open_local, write, read)

    @classmethod
    def from_stores(
        cls, metadata: MetadataStore, blocks: BlockStore, *, write: WriteConfig = WriteConfig(), read: ReadConfig = ReadConfig()
    ) -> Client:
        """A client over stores the caller built (and closes)."""

        async def given(stack: AsyncExitStack) -> tuple[MetadataStore, BlockStore]:
            return metadata, blocks

        return cls._with_opener(given, write, read)

    @classmethod
    def _with_opener(cls, opener: Opener, write: WriteConfig, read: ReadConfig) -> Client:
        client = cls.__new__(cls)
        client.config = None
        client._setup(opener, write, read)
        return client

    async def _open_cluster(self, stack: AsyncExitStack) -> tuple[MetadataStore, BlockStore]:
        from .metadata.http import HttpMetadataStore
        from .sources.http import HttpBlockStore
        from .sources.replicated import ReplicatedBlockStore

        cfg = self.config
        assert cfg is not None
        session = await stack.enter_async_context(new_session(cfg.timeouts))
        metadata = HttpMetadataStore(session, cfg.api_url, cfg.token)
        replicas = [HttpBlockStore(session, url, cfg.token) for url in cfg.block_urls]
        blocks = ReplicatedBlockStore(replicas, write_quorum=cfg.write.write_quorum)
        stack.push_async_callback(blocks.aclose)
        return metadata, blocks

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise ClientClosed("client is already open")
        stack = AsyncExitStack()
        try:
            executor = stack.enter_context(ThreadPoolExecutor(max_workers=4, thread_name_prefix="blobsdk"))
            metadata, blocks = await self._opener(stack)
            self._state = _Open(metadata, blocks, executor, self._write, self._read)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stack, self._stack, self._state = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @property
    def _open(self) -> _Open:
        if self._state is None:
            raise ClientClosed("client is not open: use `async with client:`")
        return self._state

    # --- public API ------------------------------------------------------------------

    async def put(self, path: str, data: Buffer, *, if_version: int | None = None) -> BlobInfo:
        """Write ``data`` as a new version of ``path``; returns once durable and committed.
        ``if_version``: None unconditional, 0 create-only, N only if the live version is N."""
        plan = await self._open.writer.put(path, data, if_version)
        return plan.info()

    async def put_many(self, items: Iterable[Item] | AsyncIterable[Item], *, progress: Progress | None = None) -> list[BlobInfo]:
        """Write many (usually small) blobs packed into shared blocks.  Each blob is atomic;
        blobs are committed in batches, so a failure part-way leaves earlier ones written.
        ``progress(blobs_done, bytes_done)`` is called after each batch commits."""
        plans = await self._open.writer.put_many(items, progress)
        return [p.info() for p in plans]

    async def get(self, path: str, offset: int = 0, length: int | None = None) -> bytearray:
        """The bytes of ``path`` (or of ``[offset, offset+length)``, clamped to the blob)."""
        state = self._open
        plan = await state.metadata.get_plan(validate_path(path))
        return await state.reader.read(plan, offset, length)

    async def stat(self, path: str) -> BlobInfo:
        plan = await self._open.metadata.get_plan(validate_path(path))
        return plan.info()

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[BlobInfo]:
        """Every blob whose path starts with ``prefix``, sorted by path."""
        async for info in self._open.metadata.list(validate_prefix(prefix), start_after):
            yield info

    async def delete(self, path: str, *, if_version: int | None = None) -> BlobInfo:
        """Remove the live version; its blocks are reclaimed by :meth:`gc`."""
        return await self._open.metadata.delete(validate_path(path), if_version)

    async def gc(self, grace: float = 3600.0, *, dry_run: bool = False) -> gc_module.GcReport:
        """Delete L4 blocks no committed blob references and older than ``grace`` seconds."""
        state = self._open
        return await gc_module.collect(state.metadata, state.blocks, grace, self._write.max_write_seconds, dry_run=dry_run)

    def stats(self) -> dict[str, dict[str, int | float]]:
        """Per-tier counters: hits, misses, bytes, corrupt, errors, latency percentiles."""
        return {"l4": self._open.l4_stats.as_dict()}


class _Open:
    """What an open client holds."""

    def __init__(
        self, metadata: MetadataStore, blocks: BlockStore, executor: ThreadPoolExecutor, write: WriteConfig, read: ReadConfig
    ) -> None:
        self.metadata = metadata
        self.blocks = blocks
        self.l4_stats = TierStats()
        self.writer = Writer(metadata, blocks, write, executor)
        self.reader = Reader(blocks, executor, read.parallel_chunks, self.l4_stats)


class SyncClient:
    """The same API, blocking: an event loop runs on a background thread owned by this
    object.  Use as ``with SyncClient.local(dir) as c:``."""

    def __init__(self, config: ClientConfig | Client) -> None:
        self._client = config if isinstance(config, Client) else Client(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def local(cls, root: str | Path, *, write: WriteConfig = WriteConfig(), read: ReadConfig = ReadConfig()) -> SyncClient:
        return cls(Client.local(root, write=write, read=read))

    def __enter__(self) -> Self:
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="blobsdk-sync", daemon=True)
        self._thread.start()
        self._loop = loop
        try:
            self._run(self._client.__aenter__())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            self._run(self._client.aclose())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        assert loop is not None and thread is not None
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise ClientClosed("SyncClient is not open: use `with client:`")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def put(self, path: str, data: Buffer, *, if_version: int | None = None) -> BlobInfo:
        return self._run(self._client.put(path, data, if_version=if_version))

    def put_many(self, items: Iterable[Item], *, progress: Progress | None = None) -> list[BlobInfo]:
        return self._run(self._client.put_many(items, progress=progress))

    def get(self, path: str, offset: int = 0, length: int | None = None) -> bytearray:
        return self._run(self._client.get(path, offset, length))

    def stat(self, path: str) -> BlobInfo:
        return self._run(self._client.stat(path))

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """Pages are fetched lazily as the iterator advances."""
        pages = self._client.list(prefix, start_after=start_after)
        try:
            while True:
                try:
                    yield self._run(_next(pages))
                except StopAsyncIteration:
                    return
        finally:
            if self._loop is not None:
                self._run(pages.aclose())

    def delete(self, path: str, *, if_version: int | None = None) -> BlobInfo:
        return self._run(self._client.delete(path, if_version=if_version))

    def gc(self, grace: float = 3600.0, *, dry_run: bool = False) -> gc_module.GcReport:
        return self._run(self._client.gc(grace, dry_run=dry_run))

    def stats(self) -> dict[str, dict[str, int | float]]:
        return self._client.stats()


async def _next(pages: AsyncIterator[T]) -> T:
    return await anext(pages)
