"""The client of a ``blob://`` filesystem (blobsdk/fsspec.py): how to make it from the
filesystem's arguments, and the slot that opens it on first use on the loop that uses it and
closes it (see blobsdk/fsspec.py's module docstring)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..assembly import LocalStores
from ..client import Client
from ..config import ClientConfig
from ..runtime import Held, running_loop

logger = logging.getLogger("blobsdk.fsspec")


class ClientSlot:
    """A filesystem's one Client: opened on first use on the loop that uses it, closed by
    :meth:`aclose`/:meth:`close_blocking` (the next use opens a new one).  After a fork the
    inherited client is set aside, never used and never closed, and a new one opens."""

    def __init__(self, make: Callable[[], Client]) -> None:
        self._make = make
        self._clients: Held[Client] = Held(per_loop=True)
        self._locks: Held[asyncio.Lock] = Held(per_loop=True)  # one open at a time, on each loop

    async def get(self) -> Client:
        client = self._clients.get()
        if client is not None:
            return client
        return await self._open()

    async def _open(self) -> Client:
        self._check_other_loop()
        lock = self._locks.get_or_make(asyncio.Lock)
        async with lock:
            client = self._clients.get()
            if client is None:
                async with contextlib.AsyncExitStack() as stack:  # closed again if it cannot be held
                    client = await stack.enter_async_context(self._make())
                    self._clients.put(client)  # one open on a closed loop is gone with it
                    stack.pop_all()  # the slot owns it now: aclose, close_blocking, close_soon
            return client

    def _check_other_loop(self) -> None:
        other = self._clients.loop
        if other is not None and not other.is_closed():
            raise RuntimeError(
                "this blob:// filesystem's client is open on another event loop: close it first (fs.close() or await fs.aclose())"
            )

    async def aclose(self) -> None:
        if (taken := self._detach()) is None:
            return
        client, loop = taken
        if loop is asyncio.get_running_loop():
            await client.aclose()
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client.aclose(), loop))

    def close_blocking(self) -> None:
        """Close from a thread that is not running the client's loop."""
        if self._clients.loop is not None and self._clients.loop is running_loop():
            raise RuntimeError("fs.close() on the loop its client runs on would block it: await fs.aclose()")
        if (taken := self._detach()) is not None:
            asyncio.run_coroutine_threadsafe(taken[0].aclose(), taken[1]).result()

    def _detach(self) -> tuple[Client, asyncio.AbstractEventLoop] | None:
        """Take this process's open client off the slot, with the loop to close it on (None:
        nothing to close, or nothing left to close it with: its loop is closed)."""
        loop = self._clients.loop
        if loop is None or loop.is_closed():
            self._clients.take()  # none here (a parent's is set aside), or gone with its loop
            return None
        if loop is not running_loop() and not loop.is_running():
            raise RuntimeError("this blob:// filesystem's client is open on an event loop that is not running: close it there")
        client = self._clients.take()
        assert client is not None
        return client, loop

    def close_soon(self) -> None:
        """The garbage collector's close: start closing on the client's loop; never block,
        never raise (a failure is logged)."""
        loop = self._clients.loop
        client = self._clients.take()
        if client is None or loop is None or loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(client.aclose(), loop).add_done_callback(log_close_failure)


def client_factory(local: object, config: object) -> Callable[[], Client]:
    """How to make the client ``local``/``config`` describe (ValueError/TypeError if bad)."""
    cfg = load_config(config)
    if local is None:
        resolved = cfg if cfg is not None else ClientConfig.from_env()
        return lambda: Client(resolved)
    if not isinstance(local, str | os.PathLike):
        raise TypeError(f"local must be a directory path, not {type(local).__name__}")
    if cfg is not None and cfg.names_stores:
        raise ValueError("local=DIR is the embedded store: its config must not name stores (api_url, metadata_url)")
    tuned = cfg if cfg is not None else ClientConfig()
    stores = LocalStores(Path(local))
    return lambda: Client(tuned, stores=stores)


def load_config(config: object) -> ClientConfig | None:
    if config is None or isinstance(config, ClientConfig):
        return config
    if isinstance(config, str | os.PathLike):
        return ClientConfig.from_toml(config)
    raise TypeError(f"config must be a client.toml path or a ClientConfig, not {type(config).__name__}")


def log_close_failure(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        logger.warning("closing a garbage-collected blob:// filesystem's client failed", exc_info=exc)
