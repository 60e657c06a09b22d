"""benchmarks/_cpu.py: the servers' CPU a benchmark reads from /proc."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks._cpu import Row, processes_cpu_s, with_servers_cpu


def test_a_process_cpu_from_proc_agrees_with_process_time() -> None:
    """utime + stime of /proc/PID/stat is the process's CPU in clock ticks: within two ticks of
    ``time.process_time`` (both count every thread of the process)."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    sum(range(2_000_000))  # some CPU, so neither is zero
    assert processes_cpu_s([os.getpid()]) == pytest.approx(time.process_time(), abs=2 * tick)
    assert processes_cpu_s([os.getpid(), os.getpid()]) == pytest.approx(2 * time.process_time(), abs=4 * tick)


async def test_with_servers_cpu_records_the_bytes_and_the_servers_cpu_of_each_run() -> None:
    row = Row()

    async def run() -> int:
        sum(range(2_000_000))
        return 1234

    measured = with_servers_cpu(run, [os.getpid()], row)
    assert [await measured(), await measured()] == [1234, 1234]
    assert row.nbytes == [1234, 1234] and len(row.cpu_s) == 2 and all(cpu >= 0 for cpu in row.cpu_s)


def test_a_process_that_is_gone_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        processes_cpu_s([2**22 + 12345])  # above pid_max's default, so never a live process
