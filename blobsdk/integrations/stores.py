"""How the torch integrations (blobsdk/torch.py, blobsdk/dcp.py) find and open their store,
in each process: shared by both, so neither imports the other's module to get them."""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
from dataclasses import dataclass
from typing import Self

from .._arguments import wrong
from ..config import ClientConfig
from ..runtime import Held
from ..sync import SyncClient

ConfigLike = ClientConfig | str | os.PathLike[str]
PREFETCH_TIERS = ("l3", "l2", "l1")  # "auto" takes the first the store has


@dataclass(frozen=True)
class Store:
    """How to open a client: the servers ``config`` names, or the embedded store in ``local``
    tuned by ``config``.  Pickles as that, never as an open client."""

    config: ClientConfig
    local: str | None = None

    @classmethod
    def of(cls, config: ConfigLike, local: str | os.PathLike[str] | None) -> Store:
        cfg = load_config(config)
        if local is None and not cfg.names_stores:
            raise ValueError("config names no stores (api_url or metadata_url): use .local(DIR, ...) for an embedded store")
        if local is not None and cfg.names_stores:
            raise ValueError("local= is the embedded store: its config must name no servers")
        if local is not None and not isinstance(local, str | os.PathLike):
            raise wrong("local", "a directory path (the embedded store's root)", local)
        return cls(cfg, None if local is None else os.fspath(local))

    def client(self) -> SyncClient:
        """A new, unopened client (``with store.client() as c:``)."""
        cfg = self.config
        if self.local is None:
            return SyncClient(cfg)
        return SyncClient.local(self.local, write=cfg.write, read=cfg.read, l1=cfg.l1, l2=cfg.l2)

    def cache_tiers(self) -> list[str]:
        """The cache tiers a client of this store has, best prefetch target first."""
        cfg = self.config
        has = {"l3": bool(cfg.l3_urls) and self.local is None, "l2": cfg.l2 is not None, "l1": cfg.l1.capacity_bytes > 0}
        return [tier for tier in PREFETCH_TIERS if has[tier]]


def load_config(config: object) -> ClientConfig:
    if isinstance(config, ClientConfig):
        return config
    if isinstance(config, str | os.PathLike):
        return ClientConfig.from_toml(config)
    raise TypeError(f"config must be a ClientConfig or a client.toml path, not {type(config).__name__}")


class ClosedOnExit:
    """``with x:`` calls ``x.close()`` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ProcessClient:
    """The map-style dataset's client in this process: opened on first use, closed by
    :meth:`close`, when this object is collected, or at process exit (``multiprocessing``'s
    finalizers run in DataLoader workers too, where ``atexit`` does not).  A copy made by
    ``fork`` sets the parent's client aside (the parent's to close) and opens its own; a
    pickled copy carries only the store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._opened: Held[tuple[SyncClient, multiprocessing.util.Finalize[None]]] = Held()

    def get(self) -> SyncClient:
        return self._opened.get_or_make(self._open)[0]

    def opened(self) -> SyncClient | None:
        """This process's client if it has opened one, else None (never opens one)."""
        held = self._opened.get()
        return None if held is None else held[0]

    def _open(self) -> tuple[SyncClient, multiprocessing.util.Finalize[None]]:
        """The client, opened on an exit stack whose ownership passes to the finalizer once
        both exist (an error between the two closes the client)."""
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(self._store.client())
            owner = stack.pop_all()
        return client, multiprocessing.util.Finalize(self, owner.close, exitpriority=0)

    def close(self) -> None:
        held = self._opened.take()
        if held is not None:
            held[1]()  # closes the client, once


# --- the map-style sampler ------------------------------------------------------------------------
