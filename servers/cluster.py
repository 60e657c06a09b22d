"""Start a whole local blobsdk cluster: the metadata API server, N L4 block servers, M L3
flash nodes and the peer tier's trackers, each a real subprocess on a free loopback port.

    python -m servers.cluster --dir DIR [--block-servers 3] [--write-quorum Q]
                              [--latency-ms F] [--bandwidth-mbps F] [--spindles N] [--token T] [--keys FILE]
                              [--l3-nodes M] [--l3-capacity-mb N] [--l3-hold-seconds S] [--trackers N]
                              [--api-faults SPEC] [--block-faults SPEC] [--l3-faults SPEC]
                              [--admin-token T] [--no-restart]
                              [--metadata redis://HOST:PORT/DB] [--source s3://BUCKET/PREFIX [--s3-endpoint URL]
                               [--s3-region R] [--s3-allow-http] | --seaweedfs]
                              [--hosts [--link NAME=UP:DOWN ...]]

The command and :func:`start_cluster` start the same cluster by default (:class:`ClusterOptions`,
:func:`launch_table`): the API server, 3 block servers, 2 L3 nodes and one tracker
(``servers.tracker``), which client.toml names (``tracker_urls``), so every client of the
cluster runs a peer server and reads its peers' chunks before L3 and L4; ``--trackers 0``
(``trackers=0``) turns the peer tier off.

With ``--metadata`` the API server keeps the metadata in Redis; with ``--source`` L4 is that
object store: no block servers start, the L3 nodes read through from it, and client.toml
names it (``source_url``, ``[s3]``, with the credentials of ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` if set, which the servers get through their environment).  With
``--seaweedfs`` the cluster starts a local SeaweedFS (servers/seaweedd.py: ``weed mini``, data
in ``DIR/seaweedfs``, kept across runs) and L4 is its bucket, as if ``--source
s3://blobsdk/cluster`` named it, with its endpoint and keys in client.toml; it stops with the
cluster.

Before it makes anything in DIR the command checks that this environment has what its
options need (``--seaweedfs``: the ``seaweedfs`` extra; ``--source``: ``s3``; ``--metadata``:
``redis``); if not, it says which packages and extra in one line and exits 1, as it does when
a server fails to start.  While the servers start it says on stderr what it starts and each
server once it is ready.  Once every server answers ``/healthz`` it writes
``DIR/cluster.json`` (who runs where) and then ``DIR/client.toml`` (what
:meth:`blobsdk.ClientConfig.from_toml` reads), both atomically, so a waiter that sees a new
``client.toml`` can use the cluster at once.  SIGINT or SIGTERM stops every server and exits
0; ``client.toml`` stays (a waiter removes it first, or waits for the "cluster ready" line).

Started again in the same DIR, each server (and SeaweedFS's S3 gateway) gets its port of the
last run (``DIR/run/NAME.port``) if that port is free, so the same ``client.toml`` works, and
clients that kept running reach the new servers; a port taken meanwhile is replaced by a new
one (said on stderr), and client.toml changes.  A DIR a running cluster holds (``DIR/run/lock``)
is refused, naming its pid, before anything in it is touched: two clusters would share the
metadata, blocks and L3 files, and the second would replace the first one's client.toml.

A server that dies on its own is restarted on the
same port with the same directory and flags after a backoff (0.5 s, doubling to 10 s; back
to 0.5 s once it had run 10 s), for as long as it keeps dying; the others keep running.
With ``--no-restart`` it stays down and the others keep running.  Each death and restart
is logged to stdout and ``DIR/logs/cluster.log`` (with time and level, in the servers' format:
servers/_common/logs.py), and ``cluster.json`` gets the new pid; a clean stop logs ``stopped``.

With ``--keys FILE`` (a keyring: ``blobsdk token keygen FILE``) every server takes signed
tenant tokens (``blobsdk token create --keys FILE ...``) and chunk grants; ``client.toml``
gets the static admin ``--token`` (a random one if none is given), which the servers also
use among themselves.

Every server stops itself once the process that started it is gone, even by SIGKILL, whichever
of its threads started them and whatever it forked meanwhile: it watches that process, and
holds the read end of a pipe whose write end only that process holds (the *lifeline*); see
servers/_common/lifeline.py for why both.

Tests and benchmarks use the same machinery in-process::

    with start_cluster(tmp_path, block_servers=3) as cluster:      # or `async with`
        async with blobsdk.Client(cluster.config) as c: ...

With ``--hosts`` (``hosts=True``) each server runs in a testbed host of its own, with the
link ``--link`` gives its name or kind (servers/clusterhosts.py, servers/testbed.py); so do
its Redis primary and replica (hosts ``redis``, ``redis-replica``), the three Sentinels
that fail the primary over (one on each of those and on ``redis-sentinel``), and SeaweedFS
(``seaweedfs``).

What a cluster starts (its options, kinds of server, launch table, client.toml, and what the
environment needs for the options) is servers/clusterplan.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import urlsplit

from blobsdk.config import ClientConfig, S3Config

from ._common import prog
from ._common.stopsignals import Stopping, stop_signals
from .clustercli import parse_args, parse_cli
from .clusterdir import hold, make_dirs, release
from .clusterhosts import ClientHost, Placement
from .clusterplan import (
    KINDS,
    OWN_REDIS,
    REDIS_HOSTS,
    SEAWEEDFS_HOST,
    ClusterOptions,
    Launch,
    ServerKind,
    client_config,
    common_args,
    lacking,
    launch_table,
    server_name,
    with_service_token,
)
from .redisd import RedisSentinel, RedisServer, sentinel_url
from .seaweedd import SeaweedServer, start_seaweed_l4
from .supervisor import HOST, ClusterError, ClusterLog, ServerProcess, Supervisor, _wait_ready, reusable_port
from .testbed_hosts import Host, Link

__all__ = [  # what tests, benchmarks and the pytest plugin use (clusterplan's names, too)
    "KINDS",
    "Cluster",
    "ClusterError",
    "ClusterOptions",
    "Launch",
    "ServerKind",
    "ServerProcess",
    "Supervisor",
    "launch_table",
    "main",
    "parse_args",
    "parse_cli",
    "start_cluster",
]

ROOT = Path(__file__).resolve().parent.parent
# Every server runs through serve_child (servers/clusterchild.py): argv is the lifeline's fd, the
# starter's pid, the module, its flags.
_CHILD = f"from {__package__}.clusterchild import serve_child; serve_child()"


@dataclass
class Cluster:
    """A running local cluster; ``with``/``async with`` starts it and stops every server.
    ``report`` is told, as it starts, what it starts and each server once it is ready."""

    dir: Path
    options: ClusterOptions = field(default_factory=ClusterOptions)
    kinds: Sequence[ServerKind] = KINDS
    processes: list[ServerProcess] = field(default_factory=list)
    config: ClientConfig | None = None
    seaweed: SeaweedServer | None = None  # with options.seaweedfs: the object store L4 is on
    redis: list[RedisServer] = field(default_factory=list)  # with --metadata redis: its primary, then replica
    sentinels: list[RedisSentinel] = field(default_factory=list)  # and the Sentinels watching them
    report: Callable[[str], None] = field(default=lambda line: None, repr=False)
    _lifeline: tuple[int, int] | None = field(default=None, repr=False)  # (read fd, write fd)
    placement: Placement | None = field(default=None, repr=False)  # with options.hosts: the testbed
    _added: dict[str, int] = field(default_factory=dict, repr=False)  # kind -> servers added since start
    _lock: int | None = field(default=None, repr=False)  # the fd holding DIR/run/lock while it runs

    @property
    def config_path(self) -> Path:
        return self.dir / "client.toml"

    def start(self) -> ClientConfig:
        """Start every server (on its port of the last run in this directory, if free), wait
        for /healthz, write cluster.json and client.toml."""
        self.dir = self.dir.resolve()
        make_dirs(self.dir)
        self._lock = self._lock or hold(self.dir)
        for stale in (self.config_path, self.dir / "cluster.json"):
            stale.unlink(missing_ok=True)
        self._lifeline = self._lifeline or os.pipe()  # both ends non-inheritable
        deadline = time.monotonic() + self.options.startup_timeout
        if self.options.hosts and self.placement is None:
            self.placement = Placement(self.dir, self.options.links)
            self.placement.start()
        if self.options.seaweedfs and self.seaweed is None:
            self._start_seaweed()
        if self.options.metadata == OWN_REDIS:
            self._start_redis()
        names = [name for name, _ in launch_table(self.options, self.kinds)]
        servers = f"{len(names)} server" + ("s" if len(names) != 1 else "")
        self.report(f"starting {servers} in {self.dir}: {', '.join(names)} (logs in {self.dir / 'logs'})")
        urls: dict[str, list[str]] = {}
        for kind in self.kinds:
            started = [self._spawn(kind, i, Launch(self.dir, self.options, urls)) for i in range(kind.count(self.options))]
            urls[kind.name] = [self._ready(p, deadline) for p in started]
        return self._reconfigure()

    def restart(self, proc: ServerProcess) -> None:
        """Start the dead server ``proc`` again on its port, with its directory and flags; it
        is ready once it answers /healthz at ``proc.url`` again."""
        if proc.popen.poll() is None:
            raise ClusterError(f"{proc.name} is still running (pid {proc.pid})")
        if (port := urlsplit(proc.url).port) is None:
            raise ClusterError(f"{proc.name} never served: it has no port to restart on")
        proc.port_file.unlink(missing_ok=True)
        # asyncio's create_server sets SO_REUSEADDR on POSIX: the port binds even while the old
        # server's connections are in TIME_WAIT (the CLI test holds one open across the kill).
        host = None if self.placement is None else self.placement.host_of(proc.name, proc.kind)
        proc.popen, proc.started = self._popen(proc.module, port, proc.port_file, proc.args, proc.log, host), time.monotonic()
        self._write_description()

    def add_server(self, kind_name: str) -> ServerProcess:
        """Start one more server of a kind (an L3 node for a running job) and wait until it
        answers /healthz; ``config``, cluster.json and client.toml then name it.  Its clients
        learn of it when told (``Client.set_l3_urls(cluster.config.l3_urls)``)."""
        kind = next((k for k in self.kinds if k.name == kind_name), None)
        if kind is None:
            raise ClusterError(f"no server kind {kind_name!r}: one of {', '.join(k.name for k in self.kinds)}")
        i = kind.count(self.options) + self._added.get(kind.name, 0)
        self._added[kind.name] = self._added.get(kind.name, 0) + 1
        proc = self._spawn(kind, i, Launch(self.dir, self.options, self._urls()), name=f"{kind.name}-{i}")
        self._ready(proc, time.monotonic() + self.options.startup_timeout)
        self._reconfigure()
        return proc

    def remove_server(self, proc: ServerProcess, timeout: float = 10.0) -> None:
        """Stop ``proc`` (SIGTERM, SIGKILL after ``timeout`` seconds) and forget it: ``config``,
        cluster.json and client.toml no longer name it (its data directory stays)."""
        self.processes.remove(proc)  # first: a supervisor no longer restarts it
        proc.popen.terminate()
        try:
            proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()
        self._reconfigure()

    def _urls(self) -> dict[str, list[str]]:
        return {kind.name: [p.url for p in self.processes if p.kind == kind.name] for kind in self.kinds}

    def _reconfigure(self) -> ClientConfig:
        """``config`` for the servers running now; cluster.json, then client.toml, say so."""
        self.config = client_config(self.kinds, self._urls(), self.options)
        if self.placement is not None:
            self.config = self.placement.root_config(self.config)
        self._write_description()
        _write_atomic(self.config_path, self.config.to_toml())
        return self.config

    def _start_seaweed(self) -> None:
        port_file = self.dir / "run" / "seaweedfs.port"
        port = self._port(port_file, "SeaweedFS")
        self.report(f"starting SeaweedFS (L4) in {self.dir / 'seaweedfs'}")
        address, namespace = self._service_host(*SEAWEEDFS_HOST)
        try:
            self.seaweed, source, s3 = start_seaweed_l4(self.dir / "seaweedfs", port, address, namespace)
        except (OSError, RuntimeError) as exc:  # weed missing or not answering; its log says why
            raise ClusterError(f"SeaweedFS did not start: {exc}") from exc
        port_file.write_text(str(self.seaweed.port))
        self.options = dataclasses.replace(self.options, source=source, s3=s3)
        self.report(f"SeaweedFS ready at {self.seaweed.endpoint}: L4 is {source} (log {self.seaweed.dir / 'weed.log'})")

    def _start_redis(self) -> None:
        self.report(f"starting Redis (metadata), its replica and 3 Sentinels in {self.dir / 'redis'}")
        on, replica_on, third_on = (self._service_host(*host) for host in REDIS_HOSTS)
        try:
            primary = RedisServer(self.dir / "redis" / "primary", durable=True, address=on[0], namespace=on[1])
            self._started_redis(primary)
            replica = self._started_redis(
                RedisServer(
                    self.dir / "redis" / "replica",
                    durable=True,
                    replica_of=primary.port,
                    primary_address=primary.address,
                    address=replica_on[0],
                    namespace=replica_on[1],
                )
            )
            for i, (address, namespace) in enumerate((on, replica_on, third_on)):
                sentinel = RedisSentinel(
                    self.dir / "redis" / f"sentinel{i}",
                    primary_port=primary.port,
                    primary_address=primary.address,
                    address=address,
                    namespace=namespace,
                )
                self.sentinels.append(sentinel)  # first: stop() stops it whatever happens next
                sentinel.start()
        except (OSError, RuntimeError) as exc:  # redis-server missing or not answering; its log says why
            raise ClusterError(f"Redis did not start: {exc}") from exc
        self.options = dataclasses.replace(self.options, metadata=sentinel_url(self.sentinels))
        self.report(f"Redis ready at {primary.url}, its replica at {replica.url}, failed over by {self.options.metadata}")

    def _service_host(self, name: str, kind: str) -> tuple[str, str | None]:
        """(address, namespace) a third-party server binds: its own testbed host's, with
        ``hosts`` (made the first time), else loopback in this namespace."""
        if self.placement is None:
            return HOST, None
        host = self.placement.host_of(name, kind)
        return host.address, host.namespace

    def _started_redis(self, server: RedisServer) -> RedisServer:
        self.redis.append(server)  # first: stop() stops it whatever happens next
        server.start()
        return server

    def _port(self, port_file: Path, name: str) -> int:
        """The port ``name`` gets: its last one, if free (else 0: a new one, said)."""
        port, last = reusable_port(port_file)
        if last is not None and port == 0:
            self.report(f"{name}: port {last} of the last run is taken; it gets a new one (client.toml changes)")
        return port

    def _ready(self, proc: ServerProcess, deadline: float) -> str:
        url = _wait_ready(proc, deadline, self.options.startup_timeout)
        self.report(f"{proc.name} ready at {url} (pid {proc.pid}, {time.monotonic() - proc.started:.1f}s)")
        return url

    def _spawn(self, kind: ServerKind, i: int, launch: Launch, name: str | None = None) -> ServerProcess:
        name = name or server_name(kind, i, self.options)
        port_file, log = self.dir / "run" / f"{name}.port", self.dir / "logs" / f"{name}.log"
        port = self._port(port_file, name)
        port_file.unlink(missing_ok=True)
        args = [*common_args(self.options, kind), *kind.args(launch, i)]
        host = None if self.placement is None else self.placement.host_of(name, kind.name)
        popen = self._popen(kind.module, port, port_file, args, log, host)
        address = HOST if host is None else host.address
        proc = ServerProcess(
            kind=kind.name, name=name, module=kind.module, args=args, popen=popen, port_file=port_file, log=log, host=address
        )
        self.processes.append(proc)
        return proc

    def _popen(
        self, module: str, port: int, port_file: Path, args: list[str], log: Path, host: Host | None
    ) -> subprocess.Popen[bytes]:
        assert self._lifeline is not None, "start() opens the lifeline"
        fd = self._lifeline[0]
        serving = ["--host", HOST if host is None else host.address, "--port", str(port), "--port-file", str(port_file)]
        argv = [sys.executable, "-c", _CHILD, str(fd), str(os.getpid()), module, *serving, *args]
        if host is not None and self.placement is not None:
            argv = self.placement.argv(host, argv)
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_child_env(self.options.s3),
                pass_fds=(fd,),
            )

    def _write_description(self) -> None:
        _write_atomic(self.dir / "cluster.json", json.dumps(self.describe(), indent=2) + "\n")

    def describe(self) -> list[dict[str, Any]]:
        return [{"kind": p.kind, "name": p.name, "url": p.url, "pid": p.pid, "log": str(p.log)} for p in self.processes]

    def exited(self) -> list[ServerProcess]:
        """Servers that are no longer running."""
        return [p for p in self.processes if p.popen.poll() is not None]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every server, SIGKILL those still running after ``timeout`` seconds."""
        running = [p.popen for p in self.processes if p.popen.poll() is None]
        for popen in running:
            popen.terminate()
        deadline = time.monotonic() + timeout
        for popen in running:
            try:
                popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        lifeline, self._lifeline = self._lifeline, None
        for fd in lifeline or ():
            os.close(fd)
        seaweed, self.seaweed = self.seaweed, None
        if seaweed is not None:
            seaweed.stop()
        while self.sentinels:
            self.sentinels.pop().stop()
        while self.redis:
            self.redis.pop().stop()
        placement, self.placement = self.placement, None
        if placement is not None:
            placement.stop()
        lock, self._lock = self._lock, None
        if lock is not None:
            release(lock)

    def add_client_host(self, name: str, link: Link | None = None) -> ClientHost:
        """With ``hosts``: a client host ``name`` (servers/clusterhosts.py) of the running cluster."""
        if self.placement is None or self.config is None:
            raise ClusterError("client hosts need a started cluster on hosts (hosts=True)")
        return self.placement.client_host(self.dir, self.config, name, link)

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Cluster:
        start = asyncio.ensure_future(asyncio.to_thread(self.__enter__))
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            # The starting thread cannot be interrupted: let it finish, then stop what it started.
            await asyncio.wait([start])
            if not start.cancelled() and start.exception() is None:
                await asyncio.to_thread(self.stop)
            raise

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)


def start_cluster(dir: str | os.PathLike[str], **options: Any) -> Cluster:
    """A :class:`Cluster` in ``dir`` (``options`` are :class:`ClusterOptions` fields), to use
    as ``with start_cluster(...) as cluster`` or ``async with``; ``cluster.config`` is the
    ClientConfig, ``cluster.processes`` the servers."""
    return Cluster(Path(dir), with_service_token(ClusterOptions(**options)))


def _child_env(s3: S3Config) -> dict[str, str]:
    """The servers' environment: this one's, with the S3 credentials of ``--source`` (kept out
    of their command lines, which ``ps`` shows)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    if s3.access_key_id and s3.secret_access_key:
        env.update(AWS_ACCESS_KEY_ID=s3.access_key_id, AWS_SECRET_ACCESS_KEY=s3.secret_access_key)
    return env


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- command line ---------------------------------------------------------------------


class _Shutdown(Exception):
    """Raised by the SIGINT/SIGTERM handler to unwind to main."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _supervise(cluster: Cluster, restart: bool, log: ClusterLog) -> NoReturn:
    """Watch the servers until a signal interrupts this with _Shutdown."""
    supervisor = Supervisor(cluster.processes, cluster.restart if restart else None, log.info, log.warning)
    while True:
        supervisor.poll(time.monotonic())
        time.sleep(0.2)


def run(dir: Path, options: ClusterOptions, restart: bool = True, stopping: Stopping | None = None) -> int:
    """The cluster until a signal (or ``_Shutdown``) stops it; ``stopping``: the signals'
    handlers (servers/_common/stopsignals.py), ignored while it stops."""
    if (missing := lacking(options)) is not None:
        _say(f"{prog(f'{__package__}.cluster')}: error: {missing}")
        return 1
    cluster = Cluster(dir, options, report=_say)
    try:
        make_dirs(dir.resolve())  # where the log goes, before the cluster's start makes them
    except ClusterError as exc:
        _say(f"{prog(f'{__package__}.cluster')}: error: {exc}")
        return 1
    log = ClusterLog(dir)
    stopped_by = None
    try:
        cluster.start()
        _say(f"client config: {cluster.config_path}\ncluster ready; Ctrl-C or SIGTERM stops it")
        log.info(f"ready: {len(cluster.processes)} servers; client config {cluster.config_path}")
        _supervise(cluster, restart, log)
    except _Shutdown as exc:
        stopped_by = str(exc)
        return 0
    except ClusterError as exc:
        _say(f"{prog(f'{__package__}.cluster')}: error: {exc}")
        return 1
    finally:
        if stopping is not None:
            stopping.ignore()  # a second signal must not interrupt the stop
        cluster.stop()
        if stopped_by is not None:
            log.info(f"stopped ({stopped_by}): every server is down")
        log.close()


def main(argv: Sequence[str] | None = None) -> int:
    dir, options, restart = parse_cli(argv)
    with stop_signals(_Shutdown) as stopping:
        return run(dir, options, restart, stopping)


if __name__ == "__main__":
    sys.exit(main())
