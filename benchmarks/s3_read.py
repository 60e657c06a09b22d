"""s3_read: the S3 L4's reads against the plain S3 clients, on the same ranges of the same
objects in a local SeaweedFS (servers/seaweedd.py, started and stopped by the run), in one
run (the goal: S3 reads at the store's speed).

Rows, each reading every range once, ``CONCURRENCY`` at a time, every byte checked against
what was written (the same way in every row: one ``==`` on a ``bytes``, a memcmp):
- ``obstore``: ``obstore.get_range_async`` (the baseline);
- ``boto3``: ``get_object(Range=...)`` then ``Body.read()``, in a pool of ``CONCURRENCY``
  threads (boto3 is synchronous), one client, as many pooled connections;
- ``getter``: blobsdk.sources._s3get.S3Getter, SigV4-signed GETs over the SDK's own HTTP
  path, the body received into the caller's buffer;
- ``store``: S3BlockStore.read_into, the whole L4 read (limiter, deadline, error mapping);
- ``client``: Client.get of blobs holding the same bytes (one chunk each), over an S3 L4
  with its metadata in Redis, L1 off, plans cached: the whole SDK read path.

Two range sizes: 4 MiB (a chunk) and 256 KiB (a dataloader's small sample), then whole
~323 KB objects (MLPerf Storage's retinanet-like samples) in objects/s, against obstore,
boto3 and s3torchconnector (benchmarks/_s3_objects.py).  The rows run in ``rounds`` rounds,
each in a random order (the machine is small and shared, and a row may leave the server
busier or idler for the next); each round gives each row's rate / obstore's rate in that
round (for the objects, / the best peer's in that round).  Reported: the median of those
ratios (``store_vs_obstore_4MiB``, ``store_vs_best_323KB``...) and their min and max
(``..._min``, ``..._max``); each row's median MB/s (objects/s), and its CPU seconds per GB
read (``process_time`` of this process, all threads: obstore's Rust runtime, boto3's and
s3torchconnector's pools included) and SeaweedFS's (``seaweed_cpu_s_per_GB_*``: the
server's CPU over the whole size, every row).  Goals: ``store_vs_obstore_*`` >= 0.9,
``store_vs_best_323KB`` and ``client_vs_best_323KB`` >= 1.0.  ``floor_cpu_s_per_GB``: a
memcpy + xxh3 per GB, measured in the same run (benchmarks/_cpu.py), and
``client_cpu_vs_floor_*`` the whole client's read against it (goal <= 1.5).
``--quick`` (5 rounds, fewer bytes and objects) measures the same rows.

Measured on the 2-core dev machine, shared with other jobs, SeaweedFS on the same cores;
``python -m benchmarks s3_read`` (21 rounds, ~70 s), two runs with the S3 L4's limiter cut
by drops only (run 1 at load 2.0-4.6, run 2 at 2.9-4.9); median [min-max] of row / obstore
(objects: row / best peer), and CPU s/GB (run 2):

    4 MiB ranges       run 1               run 2               CPU s/GB
    boto3          0.96 [0.78-1.73]    0.94 [0.79-1.12]    1.01  (obstore 0.78)
    getter         1.17 [0.86-1.79]    1.08 [0.91-1.24]    0.58
    store          1.14 [0.76-1.32]    1.09 [0.82-1.36]    0.60
    client         1.53 [1.04-2.01]    1.38 [1.10-1.59]    0.58  (SeaweedFS 2.4)
    256 KiB ranges
    boto3          0.57 [0.38-0.77]    0.40 [0.30-0.58]    8.07  (obstore 1.82)
    getter         0.76 [0.45-1.44]    1.16 [0.85-1.41]    1.09
    store          0.82 [0.48-1.37]    1.05 [0.87-1.43]    1.27
    client         0.83 [0.45-1.70]    1.03 [0.79-1.44]    1.65  (SeaweedFS 7.4)
    323 KB objects     objects/s, run 1 / run 2   vs best, run 1 / run 2
    obstore        833 / 1027                                   1.77
    boto3          433 / 423                                    6.08
    s3torch        744 / 861                                    2.43
    store          823 / 1322       1.02 [0.66-1.51]    1.23 [0.64-1.87]    0.94
    client         739 / 1226       0.98 [0.54-1.56]    1.04 [0.47-1.44]    1.24
    client_put     238 / 446        0.29 [0.18-0.52]    0.43 [0.18-0.57]    1.88  (SeaweedFS 5.5)

``client_put`` / ``obstore_put`` (obstore's GETs of the same ranges of the packed blocks):
1.09 [0.80-1.77] in run 2: SeaweedFS serves those ranges at under half its rate of small
objects whole, and the client reads at that rate.  The same code's two runs before the
limiter change (main): store at 256 KiB 0.79 [0.50-1.34] (load 1.2-4.8) and 1.06
[0.53-1.34] (2.3-2.9), at 4 MiB 1.05 and 0.99.  The spread between runs is the machine's:
the same code gives 0.8 or 1.05 at 256 KiB as the neighbours' load comes and goes.

What the figures say: SeaweedFS is the bottleneck on a quiet machine (2.4-7.4 CPU s per GB
served against the clients' 0.6-1.9), and every blobsdk row then reads at or above obstore's
rate, with 23-47% less client CPU per GB.  Profiled (py-spy, 500 Hz, the store row at 256
KiB, 8 in flight, quiet): of the loop thread's busy samples, the HTTP head and protocol
code 20%, the kernel's copy of the body (``recv_into``) 15%, signing 9%, sending 8%, the
store's glue (permit, deadline, error mapping) 12%, the limiter 5%, the timers 6%, the rest
the event loop; ~300 us of CPU per GET against obstore's ~430 (its Rust threads included),
two loop wake-ups per GET.  No one step dominates; what did was admission: the limiter's
latency gradient settled at 5 of the 8 GETs in flight (RTT 2x the 1 ms floor), which with
both cores contended (4 busy loops, the same run) read 0.87x of obstore's rate against
1.00x for the same store cut by drops only (blobsdk/net/limiter.py, ``by_latency``).
With the neighbours' load (run 1), every Python row, the signed GETs without a limiter
included, falls to 0.76-0.83 at 256 KiB: the one event-loop thread does each GET's ~250-300
us of work in turn, where obstore spreads its ~430 us over its runtime's threads, which the
scheduler gives more of two shared cores.  That is the floor this design has at small
reads on a contended host.  boto3 spends 5-8 CPU s per GB on 256 KiB ranges, 4x obstore.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import obstore
from obstore.store import S3Store

import blobsdk
from blobsdk.sources import S3BlockStore
from blobsdk.sources._s3get import S3Getter, S3Target, target_of
from blobsdk.sources.base import new_block_id

from ._cpu import CPU_GOAL, floor_cpu_s_per_gb
from ._report import Report, median
from ._s3_rows import BUCKET, CONCURRENCY, Boto3, Read, Row, check, rounds_of, s3_client

KiB, MiB = 1 << 10, 1 << 20
GOAL = ">= 0.9"


@dataclass(frozen=True)
class Shape:
    objects: int
    object_bytes: int
    rounds: int
    pass_bytes: dict[int, int]  # range size -> bytes each row reads per round
    small_objects: int  # whole ~323 KB objects each row reads per round (benchmarks/_s3_objects.py)


# Many short rounds: a neighbour's burst spoils a round or two, not a row.
FULL = Shape(objects=4, object_bytes=64 * MiB, rounds=21, pass_bytes={4 * MiB: 96 * MiB, 256 * KiB: 16 * MiB}, small_objects=128)
QUICK = Shape(objects=2, object_bytes=32 * MiB, rounds=5, pass_bytes={4 * MiB: 48 * MiB, 256 * KiB: 8 * MiB}, small_objects=64)


async def run(quick: bool = False) -> Report:
    return await measure(QUICK if quick else FULL)


async def measure(shape: Shape) -> Report:
    """Start SeaweedFS and Redis, run every range size, stop them."""
    from servers.redisd import start_redis
    from servers.seaweedd import start_seaweed

    from ._s3_objects import measure_objects, record_objects

    report = Report("s3_read")
    with (
        tempfile.TemporaryDirectory(prefix="bench-s3-read-") as tmp,
        start_seaweed(Path(tmp) / "seaweed") as s3,
        start_redis(Path(tmp) / "redis") as redis,
    ):
        s3.make_bucket(BUCKET)
        assert s3.process is not None
        for range_bytes in shape.pass_bytes:
            cpu = _ServerCpu(s3.process.pid)
            rows = await _size(s3.config, redis.url, shape, range_bytes)
            _record(report, _label(range_bytes), rows, cpu.seconds())
        cpu = _ServerCpu(s3.process.pid)
        rows = await measure_objects(s3.config, redis.url, shape.small_objects, shape.rounds)
        record_objects(report, rows, cpu.seconds())
    _record_floor(report, list(shape.pass_bytes))
    report.details.update(
        concurrency=CONCURRENCY,
        objects=shape.objects,
        object_bytes=shape.object_bytes,
        rounds=shape.rounds,
        small_objects=shape.small_objects,
    )
    return report


def _label(range_bytes: int) -> str:
    return f"{range_bytes // MiB}MiB" if range_bytes >= MiB else f"{range_bytes // KiB}KiB"


def _record(report: Report, label: str, rows: dict[str, Row], server_cpu_s: float) -> None:
    base = rows["obstore"].rates
    for name, row in rows.items():
        report.metrics[f"{name}_MBps_{label}"] = median(row.rates)
        report.metrics[f"{name}_cpu_s_per_GB_{label}"] = row.cpu_s / (row.bytes_read / 1e9)
        if name == "obstore":
            continue
        ratios = [ours / theirs for ours, theirs in zip(row.rates, base, strict=True)]
        key = f"{name}_vs_obstore_{label}"
        report.ratios[key] = median(ratios)
        report.ratios[f"{key}_min"] = min(ratios)
        report.ratios[f"{key}_max"] = max(ratios)
        if name == "store":
            report.goals[key] = GOAL
    total = sum(row.bytes_read for row in rows.values())
    report.metrics[f"seaweed_cpu_s_per_GB_{label}"] = server_cpu_s / (total / 1e9)


def _record_floor(report: Report, sizes: list[int]) -> None:
    """The client CPU floor (memcpy + xxh3, benchmarks/_cpu.py), measured now, and each
    size's whole-client read against it (``client_cpu_vs_floor_*``; goal <= 1.5)."""
    floor = report.metrics["floor_cpu_s_per_GB"] = floor_cpu_s_per_gb(os.urandom(max(sizes)))
    for label in map(_label, sizes):
        key = f"client_cpu_vs_floor_{label}"
        report.ratios[key] = report.metrics[f"client_cpu_s_per_GB_{label}"] / floor
        report.goals[key] = CPU_GOAL


class _ServerCpu:
    """CPU seconds a process and its children (the lifeline's ``weed``) used since this
    object was made (/proc/PID/stat: utime + stime of the live processes)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._start = self._now()

    def _now(self) -> float:
        total = 0
        for pid in _tree(self._pid):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def seconds(self) -> float:
        return self._now() - self._start


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return [pid, *(p for c in children for p in _tree(c))]


async def _size(config: dict[str, str], redis_url: str, shape: Shape, range_bytes: int) -> dict[str, Row]:
    """Write the objects, then time every row on the same ranges, ``shape.rounds`` times."""
    store = S3BlockStore(BUCKET, "blocks", config=config, allow_http=True)
    target = target_of(config, True)
    assert isinstance(target, S3Target), target
    getter = S3Getter(target, timeout_s=30)
    async with store, Boto3(config) as boto, s3_client(config, redis_url, _label(range_bytes), range_bytes) as client:
        data = {new_block_id(): os.urandom(shape.object_bytes) for _ in range(shape.objects)}
        await asyncio.gather(*(store.write_block(block, [body]) for block, body in data.items()))
        rng = random.Random(range_bytes)
        blocks = list(data)
        count = shape.pass_bytes[range_bytes] // range_bytes
        ranges = [(rng.choice(blocks), rng.randrange(0, shape.object_bytes - range_bytes + 1)) for _ in range(count)]
        want = [data[b][at : at + range_bytes] for b, at in ranges]
        paths = [f"/bench/{range_bytes}/{i:05d}" for i in range(len(ranges))]
        await client.put_many(zip(paths, want, strict=True))
        try:
            reads = _reads(store, getter, boto, client, config, ranges, want, paths)
            return await rounds_of(reads, len(ranges), range_bytes, shape.rounds)
        finally:
            await getter.aclose()


def _reads(
    store: S3BlockStore,
    getter: S3Getter,
    boto: Boto3,
    client: blobsdk.Client,
    config: dict[str, str],
    ranges: list[tuple[str, int]],
    want: list[bytes],
    paths: list[str],
) -> dict[str, Read]:
    """Each row's read of range ``i``, checked."""
    size = len(want[0])
    raw = S3Store(BUCKET, config=config, client_options={"allow_http": True})  # type: ignore[arg-type]
    keys = [store._full_key(block) for block, _ in ranges]

    async def via_obstore(i: int) -> None:
        got = await obstore.get_range_async(raw, keys[i], start=ranges[i][1], length=size)
        check(got == want[i], "obstore", i)

    async def via_boto3(i: int) -> None:
        got = await boto.get(keys[i], ranges[i][1], size)
        check(got == want[i], "boto3", i)

    async def via_getter(i: int) -> None:
        out = bytearray(size)
        await getter.get_into(BUCKET, keys[i], memoryview(out), start=ranges[i][1])
        check(out == want[i], "getter", i)

    async def via_store(i: int) -> None:
        out = bytearray(size)
        await store.read_into(ranges[i][0], ranges[i][1], memoryview(out))
        check(out == want[i], "store", i)

    async def via_client(i: int) -> None:
        check(await client.get(paths[i]) == want[i], "client", i)

    return {"obstore": via_obstore, "boto3": via_boto3, "getter": via_getter, "store": via_store, "client": via_client}
