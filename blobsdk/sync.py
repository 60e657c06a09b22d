"""SyncClient: the blobsdk API, blocking, on an event loop of its own (a background thread).

The blocking API is the async one (blobsdk/client.py) method by method, so its methods are
not written out here but made from the ``Client`` methods they mirror, by one of three
helpers chosen by how that method must run:

- :func:`awaited`: an ``async def``, awaited on the loop thread while the caller blocks;
- :func:`on_loop`: a plain method that starts tasks (``prefetch``, ``checkpoints``), called on
  the loop thread, where a task can start (``prefetch``'s paths are read into a list first,
  in the caller's thread, so that they may come from this same client: ``c.list(...)``);
- :func:`here`: a plain method that needs no loop (``stats``; ``list`` and ``readahead``, which
  only make an async generator), called in the caller's thread.

Each can hand the result on (``then``): an async generator becomes a blocking iterator, a
handle (Prefetch, Checkpoints, Pending) its blocking twin, made by the same helpers over the
handle's own methods.  A made method keeps its original's name, docstring and parameters
(``inspect.signature``), and tests/test_sync_api.py fails when a public ``Client`` method has
no blocking twin: the hand-written copy this replaces had drifted (no ``scrub``,
``node_stats``, ``from_stores``).

Fork-safety (SyncClient's docstring) lives in ``SyncClient._here``, ``_run`` and ``_iterate``:
a method made over the client asks ``_here`` for the client of this process before it makes
its coroutine; a handle wraps what the client started on its loop thread and never asks, so
in a forked child it raises NotForkSafe instead of waiting for a thread that is not there.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Generator, Iterator
from functools import partial
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from ._arguments import check_paths, wrong
from .client import Client
from .config import ClientConfig
from .errors import BlobError, ClientClosed, NotForkSafe
from .read import Prefetch, PrefetchProgress
from .runtime import Held, LoopThread
from .write import Checkpoints, Pending

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")
T = TypeVar("T")
W = TypeVar("W")
STARTED_BEFORE_FORK = (
    "this was started by a SyncClient in the process this one was forked from (a readahead, prefetch, listing, "
    "checkpoint save or Checkpoints handle), on that process's loop thread, which fork() does not copy: start it "
    "again in this process (the SyncClient's own methods open a client here)"
)

# --- the helpers that make a blocking method from an async object's method ---------------------


class _Blocking:
    """What a made method needs of the object it is on: the SyncClient whose loop thread runs
    it, and the async object whose namesake method it calls (asked at each call)."""

    def _runner(self) -> SyncClient:
        raise NotImplementedError

    def _target(self) -> Any:
        raise NotImplementedError


Then = Callable[["SyncClient", Any], Any]
NAMED = ("__name__", "__doc__")  # what a made method takes of its original: not its module nor qualname


def _made(
    method: Callable[..., Any], call: Callable[[SyncClient, Callable[[], Any]], Any], then: Then | None, listed: str | None = None
) -> Any:
    """A method that calls ``method``'s namesake on ``self._target()`` by ``call`` and hands
    the result to ``then``, with ``method``'s name, docstring and parameters.  By name, not
    ``method`` itself: a subclass's override is the one called, as it would be in async code.
    The argument named ``listed`` (an iterable, unless a str) is read here, into a list."""
    name, signature = method.__name__, inspect.signature(method)

    def blocking(self: _Blocking, /, *args: Any, **kwargs: Any) -> Any:
        if listed is not None:
            args, kwargs = _listed(name, signature, listed, args, kwargs)
        bound = getattr(self._target(), name)  # before the call is made: a forked child's client opens here
        runner = self._runner()
        result = call(runner, partial(bound, *args, **kwargs))
        return result if then is None else then(runner, result)

    functools.update_wrapper(blocking, method, assigned=NAMED)
    blocking.__dict__["__signature__"] = signature.replace(return_annotation=inspect.Signature.empty)
    return blocking


def _listed(
    method: str, signature: inspect.Signature, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with the argument ``name``, an iterable unless a str, read into a
    list in the caller's thread: a generator over this same client (``c.list(...)``) would
    otherwise be read on its loop thread, where the client refuses to be called."""
    arguments = signature.bind(None, *args, **kwargs)  # None: ``self``
    if not isinstance(value := arguments.arguments[name], str):
        check_paths(f"{method}: {name}", value)  # as the client method would, before list() trips on it
        arguments.arguments[name] = list(value)
    return arguments.args[1:], arguments.kwargs


@overload
def awaited(method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> Callable[Concatenate[Any, P], R]: ...
@overload
def awaited(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], then: Callable[[SyncClient, R], S]
) -> Callable[Concatenate[Any, P], S]: ...
def awaited(method: Callable[..., Any], then: Then | None = None) -> Any:
    """``method`` (an ``async def``), blocking: awaited on the loop thread."""
    return _made(method, _await, then)


@overload
def on_loop(method: Callable[Concatenate[Any, P], R], *, listed: str | None = None) -> Callable[Concatenate[Any, P], R]: ...
@overload
def on_loop(
    method: Callable[Concatenate[Any, P], R], then: Callable[[SyncClient, R], S], *, listed: str | None = None
) -> Callable[Concatenate[Any, P], S]: ...
def on_loop(method: Callable[..., Any], then: Then | None = None, *, listed: str | None = None) -> Any:
    """``method`` (plain, but it starts tasks), called on the loop thread; its argument named
    ``listed`` (an iterable of paths) is read into a list first, in the caller's thread."""
    return _made(method, _call_on_loop, then, listed)


@overload
def here(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]: ...
@overload
def here(method: Callable[Concatenate[Any, P], R], then: Callable[[SyncClient, R], S]) -> Callable[Concatenate[Any, P], S]: ...
def here(method: Callable[..., Any], then: Then | None = None) -> Any:
    """``method`` (plain, needing no loop), called in the caller's thread."""
    return _made(method, _call_here, then)


def _await(runner: SyncClient, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return runner._run(call())


def _call_on_loop(runner: SyncClient, call: Callable[[], T]) -> T:
    return runner._run(_called(call))


async def _called(call: Callable[[], T]) -> T:
    return call()


def _call_here(runner: SyncClient, call: Callable[[], T]) -> T:
    return call()


def constructor(make: Callable[P, Client]) -> classmethod[SyncClient, P, SyncClient]:
    """A classmethod that makes a SyncClient of the client ``make`` (a Client classmethod) makes."""

    def sync_make(cls: type[SyncClient], /, *args: P.args, **kwargs: P.kwargs) -> SyncClient:
        return cls(make(*args, **kwargs))

    functools.update_wrapper(sync_make, make, assigned=NAMED)
    signature = inspect.signature(make)  # of the bound classmethod: without ``cls``, which is put back
    cls = inspect.Parameter("cls", inspect.Parameter.POSITIONAL_ONLY)
    parameters = [cls, *signature.parameters.values()]
    sync_make.__dict__["__signature__"] = signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)
    return classmethod(sync_make)


class _Handle(_Blocking, Generic[W]):
    """The blocking twin of a handle the client's loop thread made (``wrapped``)."""

    def __init__(self, client: SyncClient, wrapped: W) -> None:
        self._client = client
        self._wrapped = wrapped

    def _runner(self) -> SyncClient:
        return self._client

    def _target(self) -> W:
        return self._wrapped


# --- the handles ---------------------------------------------------------------------------------


class SyncReadahead(Iterator[tuple[str, bytearray]]):
    """:meth:`SyncClient.readahead`'s iterator: the reads run ahead on the loop thread while
    the caller works on the last item.  They start when it is made, not at the first
    ``next()``, so an iterator made early (the next epoch's, while this one ends) has its first
    blobs ready; ``close()`` it (or use ``with``) if you stop early."""

    def __init__(self, client: SyncClient, items: AsyncGenerator[tuple[str, bytearray], None]) -> None:
        self._client = client
        self._items: AsyncGenerator[tuple[str, bytearray], None] | None = items
        self._first: asyncio.Task[tuple[str, bytearray]] | None = client._run(_started(items))

    def __next__(self) -> tuple[str, bytearray]:
        if self._items is None:
            raise StopIteration
        first, self._first = self._first, None
        try:
            return self._client._run(_next(self._items) if first is None else _result(first))
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Cancel the reads in flight; the iterator then ends."""
        items, first, self._items, self._first = self._items, self._first, None, None
        if items is not None and self._client._loop is not None:  # open in this process
            self._client._run(_closed(items, first))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _next(pages: AsyncIterator[T]) -> T:
    return await anext(pages)


async def _started(items: AsyncIterator[T]) -> asyncio.Task[T]:
    return asyncio.create_task(_next(items))


async def _result(task: asyncio.Task[T]) -> T:
    return await task


async def _closed(items: AsyncGenerator[T, None], first: asyncio.Task[T] | None) -> None:
    """Close ``items``, once its ``first`` step (still running, or never awaited) is over."""
    if first is not None:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
    await items.aclose()


class SyncPending(_Handle[Pending]):
    """A checkpoint save's :class:`~blobsdk.write.checkpoint.Pending`, from a SyncClient's thread."""

    @property
    def done(self) -> bool:
        return self._wrapped.done

    @property
    def error(self) -> BaseException | None:
        return self._wrapped.error

    wait = awaited(Pending.wait)


class SyncCheckpoints(_Handle[Checkpoints]):
    """:class:`~blobsdk.write.checkpoint.Checkpoints` from the thread of a :class:`SyncClient`;
    ``save`` blocks while the state is staged (the training pause), the upload goes on."""

    save = awaited(Checkpoints.save, SyncPending)
    load = awaited(Checkpoints.load)
    write_part = awaited(Checkpoints.write_part)
    commit = awaited(Checkpoints.commit)
    manifest = awaited(Checkpoints.manifest)
    remove = awaited(Checkpoints.remove)
    list = awaited(Checkpoints.list)

    @property
    def hashed_bytes(self) -> int:
        """How many bytes its saves and parts have hashed (``Checkpoints.hashed_bytes``)."""
        return self._wrapped.hashed_bytes

    @property
    def index_entries_refused(self) -> int:
        """Chunk index entries its saves did not reuse (``Checkpoints.index_entries_refused``)."""
        return self._wrapped.index_entries_refused


class SyncPrefetch(_Handle[Prefetch]):
    """A :class:`~blobsdk.read.prefetch.Prefetch` seen from the thread of a :class:`SyncClient`:
    ``wait()`` blocks until it ended."""

    @property
    def done(self) -> bool:
        return self._wrapped.done

    @property
    def progress(self) -> PrefetchProgress:
        return self._wrapped.progress

    @property
    def failed(self) -> dict[str, BlobError]:
        return self._wrapped.failed

    wait = awaited(Prefetch.wait)

    def cancel(self) -> PrefetchProgress:
        """Stop it and block until nothing of it runs; its final progress."""
        return self._client._run(_cancelled(self._wrapped))

    def __repr__(self) -> str:
        return repr(self._wrapped)


async def _cancelled(handle: Prefetch) -> PrefetchProgress:
    handle.cancel()
    return await handle.wait()


# --- the client ----------------------------------------------------------------------------------


class SyncClient(_Blocking):
    """The same API, blocking: an event loop runs on a background thread owned by this
    object.  Use as ``with SyncClient.local(dir) as c:``.

    Fork-safe: a process forked from one where this client is open (a DataLoader worker)
    inherits neither its thread nor its loop, so the first call there opens a fresh client
    of the same config and stores in the child (the parent's loop, sockets and files are set
    aside, not closed: they still serve the parent), instead of waiting forever on a loop
    that is not running there."""

    def __init__(self, config: ClientConfig | Client) -> None:
        if not isinstance(config, ClientConfig | Client):
            raise wrong("SyncClient: config", "a ClientConfig or a Client", config)
        self._client = config if isinstance(config, Client) else Client(config)
        self._opened: Held[tuple[LoopThread, Client]] = Held()  # the loop thread and the client it runs

    @property
    def _loop(self) -> LoopThread | None:
        """The loop thread of this client in this process (None: not open here)."""
        held = self._opened.get()
        return None if held is None else held[0]

    def __enter__(self) -> Self:
        self._opened.put((LoopThread("blobsdk-sync").start(), self._client))
        try:
            self._run(self._client.__aenter__())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """:meth:`Client.aclose`, blocking; then the loop thread stops."""
        if self._loop is None:  # not open, or open in the parent only (a forked child that never used it)
            self._opened.take()  # sets the parent's aside
            return
        try:
            self._run(self._client.aclose())
        finally:
            self._stop_loop()

    def copy(self) -> SyncClient:
        """A new, unopened client of the same config and stores."""
        return SyncClient(self._client.copy())

    def _stop_loop(self) -> None:
        held = self._opened.take()
        assert held is not None
        held[0].stop()

    def _runner(self) -> SyncClient:
        return self

    def _target(self) -> Client:
        return self._here()

    def _here(self) -> Client:
        """The client to call in this process (a fresh one in a forked child): every method
        asks for it before it makes its coroutine, which is bound to one client."""
        if self._opened.inherited:
            self._reopen_after_fork()
        return self._client

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        thread = self._loop
        if thread is None:
            coro.close()
            if self._opened.inherited:  # called by what a parent started: see STARTED_BEFORE_FORK
                raise NotForkSafe(STARTED_BEFORE_FORK)
            raise ClientClosed("SyncClient is not open: use `with client:`")
        if threading.current_thread() is thread.thread:  # it would wait for itself forever
            coro.close()
            raise RuntimeError("a SyncClient cannot be used from its own loop thread: use the async Client there")
        return asyncio.run_coroutine_threadsafe(coro, thread.loop).result()

    def _reopen_after_fork(self) -> None:
        """In a forked child: open a fresh client here (the parent's loop thread and client
        are set aside, not closed: they are the parent's)."""
        self._client = self._client.copy()
        self.__enter__()

    def _iterate(self, items: AsyncGenerator[T, None]) -> Generator[T, None, None]:
        """A blocking iterator over an async generator running on the loop thread; pages are
        fetched lazily as it advances: ``close()`` it if you stop early."""
        try:
            while True:
                try:
                    yield self._run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            if self._loop is not None:
                self._run(items.aclose())

    # --- the API: Client's, method by method (see the module docstring) ------------------------

    local = constructor(Client.local)
    from_stores = constructor(Client.from_stores)
    put = awaited(Client.put)
    put_many = awaited(Client.put_many)
    get = awaited(Client.get)
    get_into = awaited(Client.get_into)
    get_many_into = awaited(Client.get_many_into)
    plan = awaited(Client.plan)
    stat = awaited(Client.stat)
    delete = awaited(Client.delete)
    index_s3 = awaited(Client.index_s3)
    gc = awaited(Client.gc)
    scrub = awaited(Client.scrub)
    node_stats = awaited(Client.node_stats)
    set_l3_urls = awaited(Client.set_l3_urls)
    flush = awaited(Client.flush)
    stats = here(Client.stats)
    latency_histograms = here(Client.latency_histograms)
    readahead = here(Client.readahead, SyncReadahead)  # its reads start at once, on the loop thread
    prefetch = on_loop(Client.prefetch, SyncPrefetch, listed="paths_or_prefixes")
    checkpoints = on_loop(Client.checkpoints, SyncCheckpoints)
    list = here(Client.list, _iterate)
