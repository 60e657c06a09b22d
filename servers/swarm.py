"""A swarm of reader processes reading the same blobs at the same moment: the peer tier's
demo (``make demo``) and benchmark (``python -m benchmarks p2p``).

    python -m servers.swarm [--clients 4] [--size-mb 128] [--dir DIR]

starts a local cluster with a tracker (``servers.cluster``), writes a dataset, then starts
``--clients`` reader processes, each a blobsdk client with its own peer server, lets them
read the whole dataset together, checks every byte, and prints how much the origin (the L4
block servers) served compared with what the readers read: the egress the peer tier saved.

Each reader is ``python -m servers.swarm --reader CLIENT_TOML PATHS_JSON`` (``PATHS_JSON``
maps each path to the xxh3-64 hex digest of its bytes): it opens a client, prints
``ready``, waits for a line on stdin, reads every path in order (``readahead``, as a
dataloader would), checks every digest, prints one JSON line (its seconds, bytes, wrong
paths, per-tier chunk hits, its peer tier's stats, its CPU seconds) and keeps its client
open, still serving its peers, until stdin says ``exit`` or closes.  :class:`Readers` drives a set of them,
in the root namespace, or each in a client host of a cluster on hosts (servers/clusterhosts.py:
its own address, link, L2 directory and peer server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import xxhash

import blobsdk
from blobsdk.cli import ArgumentParser
from blobsdk.config import ClientConfig, L2Config

from ._common import netns, prog
from ._common.metrics import sample_sum
from .cluster import ROOT, start_cluster
from .clusterhosts import ClientHost

DEPTH = 8  # a reader's reads in flight ahead of its consumer
BLOB_MB = 8


@dataclass(frozen=True)
class Read:
    """What one reader reported."""

    seconds: float
    bytes: int
    wrong: list[str]
    hits: dict[str, int]
    peer: dict[str, float]  # its peer tier's stats
    cpu_s: float  # CPU time (every thread, user and system) the reader spent meanwhile
    l4_hedges: int  # hedged L4 reads it sent (each moves origin bytes too)
    minor_faults: int = 0  # page faults it took meanwhile (first touches of fresh memory)
    l4: dict[str, float] = field(default_factory=dict)  # its L4 tier's hedge and health counters
    l3: dict[str, float] = field(default_factory=dict)  # its L3 tier's stats (misses, errors, nodes down, hedges)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6


@dataclass(frozen=True)
class ReaderJob:
    """One reader process: the paths it reads (path -> xxh3-64 hex digest), its client config,
    and the testbed host it runs in (servers/clusterhosts.py; None: this process's own)."""

    digests: dict[str, str]
    config: ClientConfig
    host: ClientHost | None = None


class Readers:
    """A reader process per job (``async with``: started and ready on entry, told to exit and
    reaped on exit); reader ``i`` keeps its client.toml and paths in ``dir/reader-i``."""

    def __init__(self, jobs: Sequence[ReaderJob], dir: Path) -> None:
        self._jobs, self._dir = list(jobs), dir
        self._procs: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> Readers:
        try:
            for i, job in enumerate(self._jobs):
                self._procs.append(await _start_reader(job, self._dir / f"reader-{i}"))
            for proc in self._procs:
                if await _line(proc, 60) != "ready":
                    raise RuntimeError("a reader process did not start: see its stderr above")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def read(self) -> list[Read]:
        """Every reader reads its paths, all starting together; what each reported."""
        for proc in self._procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        await asyncio.gather(*(proc.stdin.drain() for proc in self._procs if proc.stdin is not None))
        return [Read(**json.loads(await _line(proc, 3600))) for proc in self._procs]

    async def __aexit__(self, *exc_info: object) -> None:
        for proc in self._procs:
            if proc.stdin is not None and proc.returncode is None:
                proc.stdin.write(b"exit\n")
                proc.stdin.close()
        for proc in self._procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._procs.clear()


def _write_job(job: ReaderJob, dir: Path) -> tuple[Path, Path]:
    """The reader's client.toml and PATHS_JSON, written in ``dir``."""
    dir.mkdir(parents=True, exist_ok=True)
    config, paths = dir / "client.toml", dir / "paths.json"
    config.write_text(job.config.to_toml())
    paths.write_text(json.dumps(job.digests))
    return config, paths


async def _start_reader(job: ReaderJob, dir: Path) -> asyncio.subprocess.Process:
    config, paths = _write_job(job, dir)
    # `ip netns exec` runs the reader in the host's namespace (it keeps the process's pid).
    within = () if job.host is None else (netns.IP, "netns", "exec", job.host.host.namespace)
    return await asyncio.create_subprocess_exec(
        *within,
        sys.executable,
        "-m",
        f"{__package__}.swarm",
        "--reader",
        str(config),
        str(paths),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _line(proc: asyncio.subprocess.Process, wait_s: float) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), wait_s)
    if not line:
        raise RuntimeError(f"reader process {proc.pid} exited (code {await proc.wait()}) before answering")
    return line.decode().strip()


async def write_dataset(config: ClientConfig, size_mb: int, prefix: str = "/swarm/") -> dict[str, str]:
    """``size_mb`` of random blobs of ``BLOB_MB`` each; their paths and xxh3-64 digests."""
    digests = {}
    async with blobsdk.Client(config) as client:
        for i in range(max(1, size_mb // BLOB_MB)):
            data = os.urandom(BLOB_MB << 20)
            path = f"{prefix}{i:05d}.bin"
            await client.put(path, data)
            digests[path] = xxhash.xxh3_64_hexdigest(data)
    return digests


def origin_bytes(block_urls: Sequence[str]) -> int:
    """Bytes the block servers have moved so far (their ``bandwidth_bytes_total`` counters)."""
    total = 0
    for url in block_urls:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/metrics", timeout=10) as resp:
            total += int(sample_sum(resp.read().decode(), "blobsdk_blockstore_bandwidth_bytes_total"))
    return total


def in_host(config: ClientConfig, digests: dict[str, str], host: ClientHost, dir: Path) -> ReaderJob:
    """A reader in ``host``: ``config`` with the host's peer server and an L2 directory of its
    own under ``dir``."""
    l2 = dir / host.host.name / "l2"
    l2.mkdir(parents=True, exist_ok=True)
    own = msgspec.structs.replace(config, peer=host.config.peer, l2=L2Config(dir=str(l2)))
    return ReaderJob(digests, own, host)


async def read_together(
    config: ClientConfig, digests: dict[str, str], count: int, dir: Path, hosts: Sequence[ClientHost] = ()
) -> tuple[list[Read], int]:
    """``count`` readers read the dataset together (with ``hosts``, at least ``count`` of them:
    reader ``i`` in ``hosts[i]``, with ``config`` but that host's peer server, on its address,
    and an L2 directory of its own under ``dir``): what each reported, and the bytes the
    origin served meanwhile.  RuntimeError if any reader got a wrong byte."""
    if hosts and len(hosts) < count:
        raise ValueError(f"{count} readers need {count} client hosts, got {len(hosts)}")
    jobs = [ReaderJob(digests, config)] * count if not hosts else [in_host(config, digests, h, dir) for h in hosts[:count]]
    async with Readers(jobs, dir) as readers:
        before = origin_bytes(config.block_urls)
        reads = await readers.read()
        served = origin_bytes(config.block_urls) - before
    return check_reads(reads), served


def check_reads(reads: list[Read]) -> list[Read]:
    """``reads``, or RuntimeError if any reader got a wrong byte."""
    wrong = [path for read in reads for path in read.wrong]
    if wrong:
        raise RuntimeError(f"readers got wrong bytes for {len(wrong)} blobs, e.g. {wrong[0]}")
    return reads


# --- the reader process -------------------------------------------------------------------------


async def reader(config: ClientConfig, digests: dict[str, str]) -> None:
    async with blobsdk.Client(config) as client:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        begun, cpu, faults = time.perf_counter(), time.process_time(), _minor_faults()
        total, wrong = 0, []
        async for path, data in client.readahead(digests, depth=DEPTH):
            total += len(data)
            if xxhash.xxh3_64_hexdigest(data) != digests[path]:
                wrong.append(path)
        seconds, cpu_s = time.perf_counter() - begun, time.process_time() - cpu
        stats = client.stats()
        hits = {name: int(stats[name]["hits"]) for name in ("l1", "l2", "peer", "l3", "l4")}
        result = {"seconds": seconds, "bytes": total, "wrong": wrong, "hits": hits, "peer": stats["peer"], "cpu_s": cpu_s}
        result["l4_hedges"] = int(stats["l4"].get("hedge_hedges_sent", 0))
        result["minor_faults"] = _minor_faults() - faults
        l4 = stats["l4"].items()
        result["l4"] = {k: v for k, v in l4 if k.startswith(("hedge_", "targets_")) and isinstance(v, int | float)}
        result["l3"] = stats["l3"]
        print(json.dumps(result), flush=True)
        while (await asyncio.to_thread(sys.stdin.readline)).strip() not in ("exit", ""):
            pass


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# --- the demo -----------------------------------------------------------------------------------


async def demo(dir: Path, clients: int, size_mb: int) -> dict[str, Any]:
    async with start_cluster(dir / "cluster", block_servers=2, l3_nodes=0, trackers=1) as cluster:
        assert cluster.config is not None
        print(f"writing {size_mb} MB of blobs to a local cluster (2 block servers, 1 tracker) ...", flush=True)
        digests = await write_dataset(cluster.config, size_mb)
        dataset = len(digests) * (BLOB_MB << 20)
        print(f"{clients} client processes, each with its own peer server, read all of it at once ...", flush=True)
        reads, served = await read_together(cluster.config, digests, clients, dir / "readers")
    read = sum(r.bytes for r in reads)
    peer = sum(r.hits["peer"] for r in reads)
    chunks = sum(sum(r.hits.values()) for r in reads)
    for i, r in enumerate(reads):
        print(f"  client {i}: {r.bytes / 1e6:7.1f} MB in {r.seconds:5.2f} s ({r.mb_per_s:6.1f} MB/s), chunks {r.hits}")
    print(f"every byte verified; {peer} of {chunks} chunks came from peers")
    print(
        f"origin (L4) egress: {served / 1e6:.1f} MB for {read / 1e6:.1f} MB read = {served / dataset:.2f}x the dataset"
        f" (without peers: {clients}x); {1 - served / read:.0%} of the origin egress saved"
    )
    return {"served": served, "read": read, "dataset": dataset}


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog=prog(f"{__package__}.swarm"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--size-mb", type=int, default=128, help=f"dataset size, in {BLOB_MB} MB blobs (default 128)")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--reader", nargs=2, metavar=("CLIENT_TOML", "PATHS_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reader:
        config, paths = args.reader
        asyncio.run(reader(ClientConfig.from_toml(config), json.loads(Path(paths).read_text())))
        return 0
    if args.clients < 1 or args.size_mb < BLOB_MB:
        parser.error(f"--clients must be >= 1 and --size-mb >= {BLOB_MB}")
    if args.dir is not None:
        asyncio.run(demo(args.dir, args.clients, args.size_mb))
        return 0
    with tempfile.TemporaryDirectory(prefix="blobsdk-swarm-") as tmp:
        asyncio.run(demo(Path(tmp), args.clients, args.size_mb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
