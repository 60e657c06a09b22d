"""Local ``redis-server`` processes, for tests, benchmarks and ``servers.cluster --metadata
redis``: one server, a primary with its replica and the Sentinels that fail it over, or a
Redis Cluster of N masters, on free loopback ports.

    with start_redis(dir) as server:            # server.url: redis://127.0.0.1:PORT/0
        ...
    with start_redis_failover(dir) as ha:       # ha.url: redis+sentinel://127.0.0.1:P1,.../blobsdk/0
        ha.primary.stop()                       # the Sentinels promote ha.replica in a few seconds
    with start_redis_cluster(dir, masters=3) as cluster:
        cluster.url                             # any master's URL: the client finds the rest
        cluster.servers[1].stop(); cluster.servers[1].start()   # kill and restart one

Each server runs with persistence off (``--save ""``, no AOF) unless ``durable=True`` (AOF,
``appendfsync always``), in its own directory, and dies with the process that started it
(a pipe as lifeline, as servers/cluster.py's servers have: see ``LIFELINE``).  Redis takes
no port 0, so a port is picked free and, if another process takes it first, another one is.
``redis-server`` must be on PATH (``make test`` installs it: ``apt-get install -y redis-server``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ._common.lifeline import LocalService


def redis_server_path() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise FileNotFoundError("redis-server is not on PATH: apt-get install -y redis-server (make test does)")
    return found


@dataclass
class RedisServer(LocalService):
    """One redis-server subprocess in ``dir``; see the module docstring."""

    cluster: bool = False
    durable: bool = False
    replica_of: int | None = None  # the port of a primary this one replicates (--replicaof)
    primary_address: str = "127.0.0.1"  # that primary's address

    name: ClassVar[str] = "redis-server"
    log_name: ClassVar[str] = "redis.log"

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def command(self, port: int) -> list[str]:
        args = [redis_server_path(), "--port", str(port), "--bind", self.address, "--dir", str(self.dir)]
        args += ["--logfile", str(self.dir / self.log_name), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else ["--appendonly", "no"]
        if self.address != "127.0.0.1":  # a testbed host's: protected mode would refuse every other host
            args += ["--protected-mode", "no"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(self.dir / "nodes.conf")]
        if self.replica_of is not None:
            args += ["--replicaof", self.primary_address, str(self.replica_of)]
        return args

    def answers(self, port: int) -> bool:
        return _pongs(self.address, port)


def _pongs(address: str, port: int) -> bool:
    with socket.create_connection((address, port), timeout=1) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(64).startswith(b"+PONG")


@contextlib.contextmanager
def start_redis(dir: str | os.PathLike[str], *, durable: bool = False) -> Iterator[RedisServer]:
    server = RedisServer(Path(dir), durable=durable)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def start_redis_pair(dir: str | os.PathLike[str]) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A durable primary in ``dir/primary`` and its replica (``--replicaof``) in
    ``dir/replica``: the replica is for a failover an operator or Sentinel performs
    (docs/deployment.md); nothing here promotes it."""
    with start_redis(Path(dir) / "primary", durable=True) as primary:
        replica = RedisServer(Path(dir) / "replica", durable=True, replica_of=primary.port)
        replica.start()
        try:
            yield primary, replica
        finally:
            replica.stop()


SERVICE = "blobsdk"  # the name the Sentinels know the primary by (the URL's SERVICE)
DOWN_AFTER_MS = 1000  # how long a primary is silent before a Sentinel calls it down
FAILOVER_TIMEOUT_MS = 10_000  # how long a failover may take before another Sentinel tries


@dataclass
class RedisSentinel(LocalService):
    """One Sentinel (``redis-server CONF --sentinel``) watching the primary at
    ``primary_address:primary_port`` as :data:`SERVICE`; ``quorum`` Sentinels must agree it
    is down.  It rewrites its config file as it learns (replicas, other Sentinels, a new
    primary), so a restart on the same ``dir`` resumes what it knew."""

    primary_port: int = 0
    primary_address: str = "127.0.0.1"
    quorum: int = 2

    name: ClassVar[str] = "redis-sentinel"
    log_name: ClassVar[str] = "sentinel.log"

    def command(self, port: int) -> list[str]:
        conf = self.dir / "sentinel.conf"
        if not conf.exists():
            lines = [
                f"sentinel monitor {SERVICE} {self.primary_address} {self.primary_port} {self.quorum}",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 1",
            ]
            conf.write_text("\n".join(lines) + "\n")
        args = [redis_server_path(), str(conf), "--sentinel", "--port", str(port), "--bind", self.address]
        args += ["--dir", str(self.dir), "--logfile", str(self.dir / self.log_name)]
        return args + (["--protected-mode", "no"] if self.address != "127.0.0.1" else [])

    def answers(self, port: int) -> bool:
        return _pongs(self.address, port)

    def primary(self) -> tuple[str, int]:
        """The primary's address as this Sentinel knows it now."""
        argv = [shutil.which("redis-cli") or "redis-cli", "-h", self.address, "-p", str(self.port)]
        argv += ["sentinel", "get-master-addr-by-name", SERVICE]
        host, port = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout.split()
        return host, int(port)


def sentinel_url(sentinels: list[RedisSentinel], db: int = 0) -> str:
    """The ``redis+sentinel://`` URL of the primary ``sentinels`` watch."""
    return f"redis+sentinel://{','.join(f'{s.address}:{s.port}' for s in sentinels)}/{SERVICE}/{db}"


@dataclass
class RedisFailover:
    """A durable primary, its replica and the Sentinels that promote the replica when the
    primary is down; :attr:`url` is what a client connects with."""

    primary: RedisServer
    replica: RedisServer
    sentinels: list[RedisSentinel]

    @property
    def url(self) -> str:
        return sentinel_url(self.sentinels)


@contextlib.contextmanager
def start_redis_failover(dir: str | os.PathLike[str], *, sentinels: int = 3) -> Iterator[RedisFailover]:
    """A primary and replica (:func:`start_redis_pair`) and ``sentinels`` Sentinels (quorum: a
    majority), in ``dir``."""
    with start_redis_pair(dir) as (primary, replica):
        watching = [
            RedisSentinel(Path(dir) / f"sentinel{i}", primary_port=primary.port, quorum=sentinels // 2 + 1)
            for i in range(sentinels)
        ]
        try:
            for sentinel in watching:
                sentinel.start()
            yield RedisFailover(primary, replica, watching)
        finally:
            for sentinel in watching:
                sentinel.stop()


@dataclass
class RedisCluster:
    servers: list[RedisServer]

    @property
    def url(self) -> str:
        return self.servers[0].url


@contextlib.contextmanager
def start_redis_cluster(dir: str | os.PathLike[str], *, masters: int = 3) -> Iterator[RedisCluster]:
    """``masters`` cluster-enabled servers joined with ``redis-cli --cluster create`` (no
    replicas), once ``cluster_state:ok``."""
    servers = [RedisServer(Path(dir) / f"node{i}", cluster=True) for i in range(masters)]
    try:
        for server in servers:
            server.start()
        cli = shutil.which("redis-cli") or "redis-cli"
        nodes = [f"127.0.0.1:{server.port}" for server in servers]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        _wait_cluster_ok(cli, servers)
        yield RedisCluster(servers)
    finally:
        for server in servers:
            server.stop()


def _wait_cluster_ok(cli: str, servers: list[RedisServer]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = [
            subprocess.run([cli, "-p", str(s.port), "cluster", "info"], capture_output=True, text=True, timeout=10).stdout
            for s in servers
        ]
        if all("cluster_state:ok" in state for state in states):
            return
        time.sleep(0.1)
    raise RuntimeError("the Redis cluster did not reach cluster_state:ok in 30 s")
