"""benchmarks/walk.py: the profiler's walk counts blobsdk's code only, and only inside a walk;
the three operations are walked against a local cluster and reported."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

from benchmarks import walk
from benchmarks.walk import Count, Walker
from blobsdk.chunks import names
from blobsdk.runtime import tasks


def _split() -> str:
    return names.bucket_of("/bucket/a/b")


def test_a_walk_counts_the_packages_functions_and_their_calls_only_inside_the_walk() -> None:
    walker = Walker()
    counts: list[Count] = []
    with walker.hooked():
        _split()  # outside the walk: not counted
        with walker.walk(counts):
            _split()
            _split()
            sorted([3, 1, 2])  # not the package's code
        _split()
    assert sys.getprofile() is None
    (count,) = counts
    assert count.files == {str(Path(names.__file__).resolve())}
    assert count.calls[(str(Path(names.__file__).resolve()), names.bucket_of.__code__.co_firstlineno, "bucket_of")] == 2


def test_a_thread_started_inside_the_hook_is_walked_too() -> None:
    walker = Walker()
    counts: list[Count] = []
    with walker.hooked(), walker.walk(counts):
        thread = threading.Thread(target=_split)
        thread.start()
        thread.join()
    (count,) = counts
    assert sum(count.calls.values()) == 1


def test_a_generators_every_resumption_is_a_call() -> None:
    walker = Walker()
    counts: list[Count] = []

    async def main() -> None:
        with walker.walk(counts):  # task_group's generator: entered, then resumed to exit
            async with tasks.task_group() as group:
                group.create_task(asyncio.sleep(0))

    with walker.hooked():
        asyncio.run(main())
    (count,) = counts
    assert sum(count.calls.values()) > len(count.calls) >= 1


async def test_every_operation_is_walked_against_a_cluster_and_reported() -> None:
    report = await walk.run(quick=True)
    for name in walk.WALKS:
        files, functions, calls = (report.metrics[f"{name}_{f}"] for f in ("files", "functions", "calls"))
        assert 0 < files < functions < calls
        assert len(report.details[f"{name}_calls"]) == walk.QUICK_REPEATS
        walked = report.details[f"{name}_first_walk_calls_per_file"]
        assert all(path.startswith("blobsdk/") for path in walked)
    cold = report.details["cold_read_first_walk_calls_per_file"]
    assert {"blobsdk/tiers/_l4.py", "blobsdk/tail/hedge.py", "blobsdk/net/rawget.py"} <= cold.keys()
    assert "blobsdk/assembly.py" not in cold  # the client was opened before the walk
    # One API server is called without the failover's wrapper; a plan's grant margin is the
    # plan cache's; a checked ref's key is not checked again, and an L1 fill that fits asks
    # no eviction policy.
    skipped = {"metadata/_apiservers.py", "auth.py", "cache/base.py", "cache/policy.py"}
    assert not {f"blobsdk/{path}" for path in skipped} & cold.keys()
    assert "blobsdk/write/checkpoint.py" in report.details["save_first_walk_calls_per_file"]
    assert "blobsdk/read/readahead.py" in report.details["epoch_first_walk_calls_per_file"]
