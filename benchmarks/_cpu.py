"""Client CPU per GB delivered against its floor, and baselines interleaved with the paths
they judge: the helpers ``tiers`` and ``put_get`` share.

**CPU per GB.** Each path's ``process_time`` (this process, every thread: the executor's
hashing and the local store's reads included; separate server processes not) over the bytes
it delivered, ``*_cpu_s_per_GB``.  Its floor, ``floor_cpu_s_per_GB``, measured in the same
run: what any reader that lands the bytes in its memory and checks them must spend, a
``memcpy`` (into a reused buffer: no page faults) and an xxh3-64 of every byte.
``*_cpu_vs_floor`` is the ratio (goal <= 1.5).  A path whose bytes were never hashed (an L1
hit is a copy of bytes verified when they were filled) can come in under 1.

**Interleaved rounds.** A baseline measured a minute apart from the path it judges saw a
different machine: on the shared 2-core host ``l3_vs_http`` swung 0.53-1.0 and
``get_vs_file`` 0.39-0.62 between runs of the same code.  :func:`interleave` measures every
path once per round, in turn, reversing the order every other round (A B, B A: a drift
over the run falls on both alike), for as many rounds as asked; a ratio is the median of
the per-round ratios (each from one round: the pair measured moments apart), reported with
its quartiles (``*_p25`` / ``*_p75``; each round's ratio in the JSON's details), so a 10%
change shows above the spread.
``--quick`` runs fewer rounds of the same measurement, not a different one.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from blobsdk.runtime.buffers import uninitialized

from ._report import Report

GB = 1e9
FLOOR_SECONDS = 0.3  # the floor is measured over passes lasting at least this long
CPU_GOAL = "<= 1.5"


@dataclass
class Row:
    """One path's rounds: bytes delivered, wall and CPU seconds, per round."""

    nbytes: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)

    def mbps(self) -> list[float]:
        return [n / w / 1e6 for n, w in zip(self.nbytes, self.wall_s, strict=True)]

    def cpu_s_per_gb(self) -> float:
        return sum(self.cpu_s) / (sum(self.nbytes) / GB)


async def measured(row: Row, run: Callable[[], Awaitable[int]]) -> None:
    """Run ``run`` (it returns the bytes it delivered) once, into ``row``."""
    wall, cpu = time.perf_counter(), time.process_time()
    nbytes = await run()
    row.wall_s.append(time.perf_counter() - wall)
    row.cpu_s.append(time.process_time() - cpu)
    row.nbytes.append(nbytes)


async def interleave(rounds: int, runs: dict[str, Callable[[], Awaitable[int]]]) -> dict[str, Row]:
    """Every run once per round, in turn, the order reversed every other round."""
    rows = {name: Row() for name in runs}
    for i in range(rounds):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for name in order:
            await measured(rows[name], runs[name])
    return rows


def floor_cpu_s_per_gb(sample: bytes | bytearray | memoryview, min_seconds: float = FLOOR_SECONDS) -> float:
    """CPU seconds per GB of a memcpy of ``sample`` into a reused buffer plus its xxh3-64."""
    src = np.frombuffer(sample, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the target in before the clock starts
    done, begun, cpu = 0, time.perf_counter(), time.process_time()
    while not done or time.perf_counter() - begun < min_seconds:
        np.copyto(dst, src)
        xxhash.xxh3_64_intdigest(dst)
        done += src.nbytes
    return (time.process_time() - cpu) / (done / GB)


def fresh_floor_cpu_s_per_gb(sample: bytes | bytearray | memoryview, out_bytes: int, min_seconds: float = FLOOR_SECONDS) -> float:
    """The floor of a read that returns new memory: CPU seconds per GB of copying ``sample``
    over a new, unzeroed ``out_bytes`` buffer (the kernel zeroes each page at its first
    touch) and hashing it, the buffer freed after each pass."""
    src = np.frombuffer(sample, dtype=np.uint8)
    done, begun, cpu = 0, time.perf_counter(), time.process_time()
    while not done or time.perf_counter() - begun < min_seconds:
        # malloc'd as a get's result is (numpy would advise huge pages: see runtime/buffers.py)
        out = np.frombuffer(uninitialized(max(out_bytes, src.nbytes)), dtype=np.uint8)
        for at in range(0, out.nbytes - src.nbytes + 1, src.nbytes):
            np.copyto(out[at : at + src.nbytes], src)
            xxhash.xxh3_64_intdigest(out[at : at + src.nbytes])
            done += src.nbytes
        del out
    return (time.process_time() - cpu) / (done / GB)


def record_rows(report: Report, rows: dict[str, Row]) -> None:
    """Each path's median MB/s and its CPU seconds per GB."""
    for name, row in rows.items():
        report.metrics[f"{name}_MBps"] = statistics.median(row.mbps())
        report.metrics[f"{name}_cpu_s_per_GB"] = row.cpu_s_per_gb()


def record_ratio(report: Report, key: str, ours: Row, base: Row, goal: str) -> list[float]:
    """``key``: the median of ours / base over the rounds (each round's pair), with its
    quartiles; returns the per-round ratios (also in the report's details)."""
    ratios = [o / b for o, b in zip(ours.mbps(), base.mbps(), strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    report.ratios[key] = median
    report.ratios[f"{key}_p25"] = q1
    report.ratios[f"{key}_p75"] = q3
    report.goals[key] = goal
    report.details.setdefault("rounds", {})[key] = [round(r, 3) for r in ratios]
    return ratios


def record_cpu(report: Report, floor: float, rows: dict[str, Row], names: list[str]) -> None:
    """The floor, and ``NAME_cpu_vs_floor`` for each of ``names``."""
    report.metrics["floor_cpu_s_per_GB"] = floor
    for name in names:
        key = f"{name}_cpu_vs_floor"
        report.ratios[key] = rows[name].cpu_s_per_gb() / floor
        report.goals[key] = CPU_GOAL


def record_cpu_vs(report: Report, rows: dict[str, Row], pairs: list[tuple[str, str]]) -> None:
    """``OURS_cpu_vs_BASE``: a path's CPU per GB over its plain baseline's (lower is better)."""
    for ours, base in pairs:
        report.ratios[f"{ours}_cpu_vs_{base}"] = rows[ours].cpu_s_per_gb() / rows[base].cpu_s_per_gb()


def processes_cpu_s(pids: Sequence[int]) -> float:
    """The CPU seconds (user + system) the processes ``pids`` have used so far, from
    /proc/PID/stat (clock ticks: 10 ms each; sum over many runs)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        total += int(fields[11]) + int(fields[12])  # utime, stime: the stat file's 14th and 15th
    return total / os.sysconf("SC_CLK_TCK")


def with_servers_cpu(run: Callable[[], Awaitable[int]], pids: Sequence[int], into: Row) -> Callable[[], Awaitable[int]]:
    """``run``, also recording into ``into`` the CPU its servers (``pids``) used meanwhile."""

    async def measured_run() -> int:
        begun = processes_cpu_s(pids)
        nbytes = await run()
        into.cpu_s.append(processes_cpu_s(pids) - begun)
        into.nbytes.append(nbytes)
        return nbytes

    return measured_run
