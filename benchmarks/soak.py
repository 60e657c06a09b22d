"""soak: client processes doing everything at once against a local cluster under chaos, with
every read checked against a model of what was acknowledged.

    python -m benchmarks soak [--duration S] [--quick] [--clients N] [--seed N]
                              [--redis-s3 | --api-servers N] [--clock-skew S] [--hosts N] [--json FILE]

The cluster (servers.cluster, every server a process on loopback): the metadata API server
(SQLite), 3 block servers, 2 L3 flash nodes, 1 tracker.  With ``--api-servers N`` (N > 1) the
metadata is N API servers over one Redis (AOF, fsync always; never a chaos target: the
metadata's single point left, see docs/deployment.md), which the clients fail over between
(``api_urls``), and the chaos kills and stops them like the other servers.  With ``--redis-s3`` the metadata is
in Redis (AOF, fsync always) and L4 in S3 (moto), which the clients talk to directly; the L3
nodes read through from S3.  The clients share one L2 directory and run peer servers.

With ``--hosts N`` the cluster runs on a testbed (servers/testbed.py: each server in a network
namespace of its own, and with ``--api-servers N`` over the cluster's own Redis primary and
replica, each in its host), the client processes spread over N client hosts (at most one per
process), each with its own L2 directory, and the chaos also partitions (both directions, in
or out), flaps and slows the chaos targets' links (benchmarks/_soak_links.py).  Needs root.

``--clients`` processes (default 4; benchmarks/_soak_worker.py), each with 2 tasks, run a
seeded random mix of put, get, ranged get, delete, list, put_many, checkpoint save and load,
reads of a shared read-only dataset and now and then gc (grace 30 s, max_write_seconds
20 s), on their own keys, so each one's model is exact (benchmarks/_soak_model.py).  Every
read is checked as it returns: it may show the last write acknowledged before it started or
a later one whose outcome is unknown (it failed, it may have landed); an older one is
**stale** (read-your-writes broken), bytes of no write **wrong**.

Meanwhile the chaos driver (benchmarks/_soak_chaos.py) SIGKILLs (and restarts), SIGSTOPs (and
continues) and fills the disk of one server at a time, every 2–5 s, and steps the wall clock
of every other client process by up to ``--clock-skew`` seconds (default 4: two clients then
disagree by at most 8 s, inside the 10 s that gc's rule tolerates, ``grace -
max_write_seconds``; more, e.g. 3600, probes a put held up for an hour).  Moto is never killed (it keeps
objects in memory only), only stopped.

Clock steps use libfaketime (``LD_PRELOAD``, ``FAKETIME_TIMESTAMP_FILE`` rewritten by the
driver), not a patched ``time.time``: every wall-clock read of the process steps, in C
extensions and obstore's Rust too, as under a real NTP step.  The monotonic clock is left
alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as a real step leaves it: asyncio's timers keep
their meaning.  (With it, libfaketime breaks ``time.sleep``, EINVAL, which the client
processes never call.)  Without libfaketime the soak runs without clock steps and says so.

When the time is up the chaos stops, every server is made to answer again, the clients
finish, and a fresh client reads every key, checkpoint and shared blob: an acknowledged write
that is missing or older is **lost**.

Reports ops/s, wrong bytes, stale reads, lost acknowledged writes, errors by class, the
longest op (stall), the put success rate and what the chaos did.  Exits 1 if any byte was
wrong or any acknowledged write lost.  ``--quick``: 30 s.  Default: 300 s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import glob
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import msgspec

import blobsdk
from blobsdk.config import ClientConfig, L2Config, S3Config, Timeouts, WriteConfig
from blobsdk.errors import BlobError, BlobNotFound, BlockNotFound, Unavailable
from servers._common.netns import IP
from servers.cluster import Cluster, start_cluster
from servers.clusterhosts import ClientHost
from servers.redisd import RedisServer, start_redis
from servers.s3d import S3Server, start_s3

from ._report import Report
from ._soak_chaos import Chaos, SupervisorThread, cluster_targets, set_clock, third_party_targets
from ._soak_links import LinkFaults
from ._soak_model import KeyModel, Verdict, judge_full, value
from ._soak_worker import judge_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TASKS = 2
SHARED_BLOBS = 12
GC_GRACE_S = 30.0
MAX_WRITE_S = 20.0
OP_TIMEOUT_S = 60.0  # the soak's own bound on one op (the client's timeouts come first)
START_TIMEOUT_S = 120.0  # a client process must be ready in this
FINAL_PATIENCE_S = 60.0  # the final check retries Unavailable this long before an unreadable write counts as lost
FAKETIME_LIBS = "/usr/lib/*/faketime/libfaketimeMT.so.1"
WRITE = WriteConfig(chunk_size=256 << 10, block_size=4 << 20, max_write_seconds=MAX_WRITE_S)
L2_BYTES = 256 << 20
TIMEOUTS = Timeouts(connect=2.0, sock_read=10.0, total=30.0)


def options(args: argparse.Namespace) -> dict[str, Any]:
    """This benchmark's keyword arguments of :func:`run`, from ``python -m benchmarks``'s flags."""
    return {
        "duration": args.duration,
        "clients": args.clients,
        "seed": args.seed,
        "redis_s3": args.redis_s3,
        "api_servers": args.api_servers,
        "clock_skew": args.clock_skew,
        "targets": None if args.targets is None else tuple(args.targets.split(",")),
        "hosts": args.hosts,
    }


async def run(
    quick: bool = False,
    duration: float | None = None,
    clients: int = 4,
    seed: int = 0,
    redis_s3: bool = False,
    clock_skew: int = 4,
    targets: tuple[str, ...] | None = None,
    log: Callable[[str], None] | None = None,
    api_servers: int = 1,
    hosts: int | None = None,
) -> Report:
    seconds = duration if duration is not None else (30.0 if quick else 300.0)
    began = time.monotonic()
    say = log or (lambda message: print(f"soak: {time.monotonic() - began:6.1f}s {message}", file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        soak = Soak(Path(tmp), seconds=seconds, clients=clients, seed=seed, redis_s3=redis_s3, skew=clock_skew, log=say)
        soak.kinds, soak.api_servers, soak.hosts = targets, api_servers, hosts
        return await soak.run()


class Soak:
    def __init__(
        self, dir: Path, *, seconds: float, clients: int, seed: int, redis_s3: bool, skew: int, log: Callable[[str], None]
    ) -> None:
        self.dir, self.seconds, self.clients, self.seed = dir, seconds, clients, seed
        self.redis_s3, self.skew, self.log = redis_s3, skew, log
        self.admin = secrets.token_urlsafe(16)
        self.faketime = _faketime_lib() if skew > 0 else None
        self.report = Report("soak")
        self.kinds: tuple[str, ...] | None = None  # the kinds of server the chaos hits (None: all)
        self.api_servers = 1  # more: over a Redis of their own (never a chaos target)
        self.hosts: int | None = None  # on a testbed: this many client hosts (None: every process on loopback)

    async def run(self) -> Report:
        if self.hosts is not None and self.redis_s3:
            raise ValueError("the soak on hosts has no --redis-s3 form: its Redis and moto listen on loopback")
        async with AsyncExitStack() as stack:
            third_party = stack.enter_context(ExitStack())
            redis = third_party.enter_context(start_redis(self.dir / "redis", durable=True)) if self.redis_s3 else None
            s3 = third_party.enter_context(start_s3(self.dir / "s3")) if self.redis_s3 else None
            options = self._cluster_options(redis, s3)
            if self.api_servers > 1 and self.hosts is not None:  # the cluster's own Redis and replica, on hosts
                options.update(metadata="redis", api_servers=self.api_servers, hosts=True)
            elif self.hosts is not None:
                options.update(hosts=True)
            elif self.api_servers > 1:
                behind = third_party.enter_context(start_redis(self.dir / "redis-behind", durable=True))
                options.update(metadata=behind.url, api_servers=self.api_servers)
            cluster = await stack.enter_async_context(start_cluster(self.dir / "cluster", **options))
            config = self._client_config(cluster, redis)
            self.log(f"cluster up ({', '.join(p.name for p in cluster.processes)}); writing the shared dataset")
            shared = await write_shared(config, self.seed)
            supervisor = SupervisorThread(cluster, self.log)
            stack.enter_context(supervisor.running())
            targets = cluster_targets(cluster, self.admin, supervisor, api=not self.redis_s3) + third_party_targets(redis, s3)
            if self.kinds is not None:
                targets = [t for t in targets if t.name.split("-")[0] in self.kinds]
            on = [cluster.add_client_host(f"client-{k}") for k in range(min(self.hosts or 0, self.clients))]
            clients = Clients(self, config, shared, on)
            await stack.enter_async_context(clients)
            links = None if cluster.placement is None else LinkFaults(cluster.placement.testbed)
            chaos = Chaos(targets, clients.clock_files, self.skew, self.seed, self.log, links=links)
            self.log(f"{self.clients} clients ready; {self.seconds:g}s of chaos on {', '.join(t.name for t in targets)}")
            began = time.monotonic()
            await clients.go()
            await chaos.run(self.seconds)
            results = await clients.results()
            elapsed = time.monotonic() - began
            self.log("chaos over, every server up; the final check reads every acknowledged write with a fresh client")
            final = await final_check(config, self.seed, results, shared)
            self.log(f"final check done: {final.checked} keys; stopping the servers")
        summarize(self.report, results, final, chaos, elapsed, self._mode())
        for kind in ("wrong", "lost", "stale"):
            for line in self.report.details[kind][:10]:
                self.log(f"{kind}: {line}")
        return self.report

    def _mode(self) -> dict[str, object]:
        return {
            "metadata": "redis" if self.redis_s3 else self._metadata(),
            "l4": "s3 (moto)" if self.redis_s3 else "3 block servers",
            "clients": self.clients,
            "seconds": self.seconds,
            "seed": self.seed,
            "clock_skew_s": self.skew if self.faketime else 0,
            "chaos_targets": "all" if self.kinds is None else ",".join(self.kinds),
            "clock": "libfaketime (FAKETIME_TIMESTAMP_FILE, monotonic not faked)" if self.faketime else "off",
            "hosts": "loopback" if self.hosts is None else f"testbed: a host per server, {self.hosts} client hosts",
            "disk_full": "fault-injected 503 on block PUTs (a block server's answer to ENOSPC); Redis: maxmemory 1",
        }

    def _metadata(self) -> str:
        if self.api_servers > 1 and self.hosts is not None:
            return f"{self.api_servers} api-servers (the cluster's redis and its replica, on hosts; not chaos targets)"
        if self.api_servers > 1:
            return f"{self.api_servers} api-servers (redis, not a chaos target)"
        return "api-server (sqlite)"

    def _cluster_options(self, redis: RedisServer | None, s3: S3Server | None) -> dict[str, Any]:
        common = {"l3_nodes": 2, "trackers": 1, "admin_token": self.admin, "l3_capacity_mb": 256, "startup_timeout": 120.0}
        if redis is None or s3 is None:
            return {**common, "block_servers": 3}
        s3.make_bucket("soak")
        s3_config = S3Config(
            endpoint=s3.endpoint, region="us-east-1", allow_http=True, access_key_id="test", secret_access_key="test"
        )
        return {**common, "metadata": redis.url, "source": "s3://soak/blocks", "s3": s3_config}

    def _client_config(self, cluster: Cluster, redis: RedisServer | None) -> ClientConfig:
        assert cluster.config is not None
        l2 = L2Config(dir=str(self.dir / "l2"), capacity_bytes=L2_BYTES)
        config = msgspec.structs.replace(cluster.config, write=WRITE, timeouts=TIMEOUTS, l2=l2)
        if redis is not None:  # the clients talk to Redis themselves, not through the API server
            config = msgspec.structs.replace(config, api_url=None, metadata_url=redis.url)
        return config


def _faketime_lib() -> str | None:
    found = sorted(glob.glob(FAKETIME_LIBS))
    return found[0] if found else None


# --- the client processes -------------------------------------------------------------------


class Clients:
    """The client processes: started and ready on entry, killed (if still running) on exit."""

    def __init__(self, soak: Soak, config: ClientConfig, shared: list[tuple[str, int, int]], hosts: list[ClientHost]) -> None:
        self.soak, self.config, self.shared, self.hosts = soak, config, shared, hosts
        self.dir = soak.dir / "clients"
        self.procs: list[asyncio.subprocess.Process] = []
        self.clock_files: list[Path] = []

    async def __aenter__(self) -> Clients:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "client.toml").write_text(self.config.to_toml())
        for host in self.hosts:  # its own peer address and L2 directory, the soak's writes and timeouts
            l2 = L2Config(dir=str(host.dir / "l2"), capacity_bytes=L2_BYTES)
            own = msgspec.structs.replace(self.config, peer=host.config.peer, l2=l2)
            (self.dir / f"{host.host.name}.toml").write_text(own.to_toml())
        try:
            for i in range(self.soak.clients):
                self.procs.append(await self._start(i))
            for i, proc in enumerate(self.procs):
                assert proc.stdout is not None
                line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
                if line.strip() != b"ready":
                    raise RuntimeError(f"client {i} did not start: {self._log(i)}")
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _start(self, i: int) -> asyncio.subprocess.Process:
        host = self.hosts[i % len(self.hosts)] if self.hosts else None
        spec = {
            "config": str(self.dir / ("client.toml" if host is None else f"{host.host.name}.toml")),
            "index": i,
            "tasks": TASKS,
            "seed": self.soak.seed,
            "duration_s": self.soak.seconds,
            "out": str(self.dir / f"client-{i}.json"),
            "shared": self.shared,
            "gc_grace_s": GC_GRACE_S,
            "op_timeout_s": OP_TIMEOUT_S,
        }
        (self.dir / f"spec-{i}.json").write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        if self.soak.faketime and i % 2 == 1:  # every other client's wall clock steps
            clock = self.dir / f"clock-{i}"
            set_clock(clock, 0)
            self.clock_files.append(clock)
            env.update(
                LD_PRELOAD=self.soak.faketime,
                FAKETIME_TIMESTAMP_FILE=str(clock),
                FAKETIME_CACHE_DURATION="1",
                FAKETIME_DONT_FAKE_MONOTONIC="1",
            )
        with open(self.dir / f"client-{i}.log", "wb") as log:  # noqa: ASYNC230 - a tiny local file, once per client
            netns = [] if host is None else [IP, "netns", "exec", host.host.namespace]
            return await asyncio.create_subprocess_exec(
                *netns,
                sys.executable,
                "-m",
                "benchmarks._soak_worker",
                str(self.dir / f"spec-{i}.json"),
                cwd=ROOT,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )

    async def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()

    async def results(self) -> list[dict[str, Any]]:
        """Each client's report, once it has finished (its deadline, then its last op)."""
        out = []
        for i, proc in enumerate(self.procs):
            try:
                code = await asyncio.wait_for(proc.wait(), OP_TIMEOUT_S + 60)
            except TimeoutError:
                raise RuntimeError(f"client {i} did not finish; its log: {self._log(i)}") from None
            if code != 0:
                raise RuntimeError(f"client {i} exited with code {code}; its log: {self._log(i)}")
            out.append(json.loads((self.dir / f"client-{i}.json").read_text()))
        return out

    def _log(self, i: int) -> str:
        try:
            return (self.dir / f"client-{i}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    async def __aexit__(self, *exc_info: object) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
        for proc in self.procs:
            await proc.wait()


# --- the shared dataset and the final check -------------------------------------------------


async def write_shared(config: ClientConfig, seed: int) -> list[tuple[str, int, int]]:
    """The read-only dataset every client reads: (path, seq, size) of each blob."""
    shared = [(f"/soak/shared/{i:02d}", 0, (32 << 10) * (1 + i * 3)) for i in range(SHARED_BLOBS)]
    async with blobsdk.Client(msgspec.structs.replace(config, l2=None)) as client:
        await client.put_many((path, value(seed, path, seq, size)) for path, seq, size in shared)
    return shared


class Final(msgspec.Struct):
    checked: int = 0
    lost: list[str] = msgspec.field(default_factory=list)
    wrong: list[str] = msgspec.field(default_factory=list)


async def final_check(
    config: ClientConfig, seed: int, results: list[dict[str, Any]], shared: list[tuple[str, int, int]]
) -> Final:
    """A fresh client (no L2, an empty L1) reads every key, checkpoint and shared blob."""
    final = Final()
    keys = [KeyModel.from_json(raw) for result in results for raw in result["keys"]]
    for path, seq, size in shared:
        key = KeyModel(path)
        key.begin(seq, size).status = "acked"
        keys.append(key)
    slots = asyncio.Semaphore(8)
    deadline = time.monotonic() + FINAL_PATIENCE_S  # for all the reads together
    async with blobsdk.Client(msgspec.structs.replace(config, l2=None, tracker_urls=())) as client:

        async def check(key: KeyModel) -> None:
            async with slots:
                verdict = await _final_read(client, seed, key, deadline)
            final.checked += 1
            if verdict.kind == "wrong":
                final.wrong.append(verdict.detail)
            elif verdict.kind != "ok":
                final.lost.append(verdict.detail)

        await asyncio.gather(*(check(key) for key in keys))
    return final


async def _final_read(client: blobsdk.Client, seed: int, key: KeyModel, deadline: float | None = None) -> Verdict:
    """Read ``key`` as the final check does; Unavailable is retried until ``deadline``
    (default: FINAL_PATIENCE_S from now)."""
    allowed = key.allowed()
    deadline = time.monotonic() + FINAL_PATIENCE_S if deadline is None else deadline
    while True:
        try:
            if key.path.startswith("/soak/ckpt/"):
                verdict = judge_checkpoint(seed, key, allowed, await client.checkpoints(key.path).load())
            else:
                verdict = judge_full(seed, key, allowed, await client.get(key.path))
            return Verdict("lost", verdict.detail) if verdict.kind == "stale" else verdict
        except BlockNotFound as exc:
            return Verdict("lost", f"{key.path}: {type(exc).__name__}: {exc}, allowed {allowed}")
        except BlobNotFound:
            return Verdict("ok") if None in allowed else Verdict("lost", f"{key.path}: not found, allowed {allowed}")
        except Unavailable as exc:
            if time.monotonic() > deadline:
                return Verdict("lost", f"{key.path}: unreadable after every server was up again: {type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)
        except BlobError as exc:
            return Verdict("lost", f"{key.path}: {type(exc).__name__}: {exc}, allowed {allowed}")


# --- the report -----------------------------------------------------------------------------


def summarize(
    report: Report, results: list[dict[str, Any]], final: Final, chaos: Chaos, seconds: float, mode: dict[str, object]
) -> None:
    ops, ok, errors, by_op = Counter[str](), Counter[str](), Counter[str](), Counter[str]()
    samples: dict[str, str] = {}
    wrong, stale, lost = [], [], []
    longest, longest_op = 0.0, ""
    for r in results:
        ops.update(r["ops"])
        ok.update(r["ok"])
        errors.update(r["errors"])
        by_op.update(r["errors_by_op"])
        for name, text in r["samples"].items():
            samples.setdefault(name, text)
        wrong += [f"client {r['index']}: {line}" for line in r["violations"]["wrong"]]
        stale += [f"client {r['index']}: {line}" for line in r["violations"]["stale"]]
        lost += [f"client {r['index']}: {line}" for line in r["violations"]["lost"]]
        if r["longest_s"] > longest:
            longest, longest_op = r["longest_s"], r["longest_op"]
    m = report.metrics
    m["seconds"] = seconds
    m["ops"] = sum(ops.values())
    m["ops_per_s"] = m["ops"] / seconds
    m["wrong_bytes"] = len(wrong) + len(final.wrong)
    m["lost_acked_writes"] = len(final.lost) + len(lost)  # at the end, or a read of one that found its blocks gone
    m["stale_reads"] = len(stale)
    m["keys_checked_at_end"] = final.checked
    m["longest_stall_s"] = longest
    m["put_success_rate"] = ok["put"] / max(1, ops["put"])
    m["write_success_rate"] = sum(ok[o] for o in ("put", "put_many", "ckpt_save")) / max(
        1, sum(ops[o] for o in ("put", "put_many", "ckpt_save"))
    )
    for name, count in sorted(errors.items()):
        m[f"errors_{name}"] = count
    links = ("partition_both", "partition_in", "partition_out", "flap", "slow") if chaos.links is not None else ()
    for action in ("kill", "stop", "disk_full", "clock_step", *links):
        m[f"chaos_{action}"] = chaos.counts[action]
    report.goals.update({"wrong_bytes": "must be 0", "lost_acked_writes": "must be 0", "stale_reads": "should be 0"})
    report.goals["longest_stall_s"] = f"({longest_op})"
    report.failed = bool(m["wrong_bytes"] or m["lost_acked_writes"])
    report.details = {
        "mode": mode,
        "ops": dict(ops),
        "ok": dict(ok),
        "errors": dict(errors),
        "errors_by_op": dict(by_op),
        "error_samples": samples,
        "wrong": (wrong + final.wrong)[:50],
        "stale": stale[:50],
        "lost": (lost + final.lost)[:50],
        "longest_op": longest_op,
        "chaos": [dataclasses.asdict(e) for e in chaos.events],
    }
