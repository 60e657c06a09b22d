"""Structured concurrency that raises plain blobsdk errors, not ExceptionGroups."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """An asyncio.TaskGroup whose failure re-raises the first real error on its own, so
    callers of the public API see e.g. ``Unavailable`` rather than an ExceptionGroup."""
    try:
        async with asyncio.TaskGroup() as tasks:
            yield tasks
    except BaseExceptionGroup as group:
        raise first_error(group) from None


def first_error(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]
