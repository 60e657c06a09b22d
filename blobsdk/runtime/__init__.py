"""Process and loop plumbing every role uses: the one ``async with`` of long-lived objects
(``AsyncResource``), structured concurrency, one task per key in flight (``SingleFlight``),
loop threads and executors that survive a fork, a value per process, buffers and their pool,
one root directory's rules (``RootDir``: nothing followed through a symlink nor named out of
it), DataLoader workers' counters and the progress line of long ingests."""

from __future__ import annotations

from .buffers import BufferPool, fresh_buffer, kept_buffer, uninitialized
from .forksafe import Executor, LoopThread
from .here import Held, running_loop
from .progress import ProgressLine
from .resource import AsyncResource
from .rootdir import (
    FORMAT_FILE,
    TMP_SUFFIX,
    RootDir,
    UnsafeEntry,
    create_temp,
    kind_of,
    marker_text,
    misnamed,
    open_regular,
    read_root_file,
    refusal,
    remove_if_dead,
    unlink_at,
    unlink_if_same,
    write_root_file,
)
from .singleflight import SingleFlight
from .tasks import task_group
from .workerstats import WorkerStats, counters_of, total

__all__ = [
    "FORMAT_FILE",
    "TMP_SUFFIX",
    "AsyncResource",
    "BufferPool",
    "Executor",
    "Held",
    "LoopThread",
    "ProgressLine",
    "RootDir",
    "SingleFlight",
    "UnsafeEntry",
    "WorkerStats",
    "counters_of",
    "create_temp",
    "fresh_buffer",
    "kept_buffer",
    "kind_of",
    "marker_text",
    "misnamed",
    "open_regular",
    "read_root_file",
    "refusal",
    "remove_if_dead",
    "running_loop",
    "task_group",
    "total",
    "uninitialized",
    "unlink_at",
    "unlink_if_same",
    "write_root_file",
]
