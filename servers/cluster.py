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
one (said on stderr), and client.toml changes.

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
link ``--link`` gives its name or kind (servers/clusterhosts.py, servers/testbed.py).

What a cluster starts (its options, kinds of server, launch table, client.toml, and what the
environment needs for the options) is servers/clusterplan.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, NoReturn
from urllib.parse import urlsplit

import msgspec

from blobsdk.cli.parser import ArgumentParser
from blobsdk.config import ClientConfig, S3Config, s3_location

from ._common import prog
from ._common.lifeline import wait_orphaned
from ._common.stores import add_s3_args, s3_config_of_args
from .clusterhosts import ClientHost, Placement, add_hosts_args, check_links, links_of_args
from .clusterplan import (
    KINDS,
    METADATA_FOR_SEVERAL,
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
    service_hosts,
    with_service_token,
)
from .redisd import RedisServer
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
ORPHAN_GRACE_SECONDS = 5.0  # an orphaned server that has not stopped on SIGTERM by then exits hard
# Every server runs through serve_child: argv is the lifeline's fd, the starter's pid, the module, its flags.
_CHILD = f"from {__package__}.cluster import serve_child; serve_child()"


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
    report: Callable[[str], None] = field(default=lambda line: None, repr=False)
    _lifeline: tuple[int, int] | None = field(default=None, repr=False)  # (read fd, write fd)
    placement: Placement | None = field(default=None, repr=False)  # with options.hosts: the testbed
    _added: dict[str, int] = field(default_factory=dict, repr=False)  # kind -> servers added since start

    @property
    def config_path(self) -> Path:
        return self.dir / "client.toml"

    def start(self) -> ClientConfig:
        """Start every server (on its port of the last run in this directory, if free), wait
        for /healthz, write cluster.json and client.toml."""
        self.dir = self.dir.resolve()
        for sub in ("run", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
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
        self.report(f"starting Redis (metadata) and its replica in {self.dir / 'redis'}")
        on, replica_on = (self._service_host(*host) for host in REDIS_HOSTS)
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
        except (OSError, RuntimeError) as exc:  # redis-server missing or not answering; its log says why
            raise ClusterError(f"Redis did not start: {exc}") from exc
        self.options = dataclasses.replace(self.options, metadata=primary.url)
        self.report(f"Redis ready at {primary.url}, its replica at {replica.url}")

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
        while self.redis:
            self.redis.pop().stop()
        placement, self.placement = self.placement, None
        if placement is not None:
            placement.stop()

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


# --- inside each server process -------------------------------------------------------


def serve_child() -> None:
    """Run ``python -m MODULE FLAGS`` in this process (``sys.argv[1:]`` is the lifeline's
    fd, the starter's pid, MODULE, FLAGS) and stop it once it is orphaned."""
    fd, starter, module, *flags = sys.argv[1:]
    threading.Thread(target=_stop_when_orphaned, args=(int(fd), int(starter)), name="lifeline", daemon=True).start()
    sys.argv = [module, *flags]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _stop_when_orphaned(fd: int, starter: int) -> NoReturn:
    """Once the starter is gone (already gone, if it died before we got here) or the lifeline
    reached EOF, stop the server gracefully, and for good after ORPHAN_GRACE_SECONDS."""
    with contextlib.suppress(OSError):  # a bad fd: stopping is the safe side
        wait_orphaned(fd, starter)
    os.kill(os.getpid(), signal.SIGTERM)  # the server's own graceful stop
    time.sleep(ORPHAN_GRACE_SECONDS)
    os._exit(1)


# --- command line ---------------------------------------------------------------------


class _Shutdown(Exception):
    """Raised by the SIGINT/SIGTERM handler to unwind to main."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Shutdown(signal.Signals(signum).name)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Path, ClusterOptions]:
    dir, options, _ = parse_cli(argv)
    return dir, options


def parse_cli(argv: Sequence[str] | None = None) -> tuple[Path, ClusterOptions, bool]:
    """The cluster's directory, options, and whether dead servers are restarted."""
    parser = ArgumentParser(prog=prog(f"{__package__}.cluster"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="data, logs and client.toml go here")
    parser.add_argument("--block-servers", type=int, default=3, metavar="N", help="L4 block servers (default 3)")
    parser.add_argument("--write-quorum", type=int, metavar="Q", help="block replicas a write needs (default: a majority)")
    parser.add_argument("--latency-ms", type=float, metavar="F", help="emulated HDD seek latency per block request")
    parser.add_argument("--bandwidth-mbps", type=float, metavar="F", help="emulated HDD bandwidth of each block server, MB/s")
    parser.add_argument("--spindles", type=int, metavar="N", help="concurrent data requests each block server serves")
    parser.add_argument("--token", help="static admin bearer token every server requires (written to client.toml)")
    parser.add_argument(
        "--keys",
        type=Path,
        metavar="FILE",
        help="keyring every server takes: tenants with tokens from 'blobsdk token create' (default: no tenants)",
    )
    parser.add_argument("--l3-nodes", type=int, default=2, metavar="M", help="L3 flash nodes (default 2)")
    parser.add_argument(
        "--l3-capacity-mb", type=float, default=1024, metavar="N", help="capacity of each L3 node, MiB (default 1024)"
    )
    parser.add_argument("--l3-hold-seconds", type=float, default=0.0, metavar="S", help="hold period of the L3 nodes (default 0)")
    parser.add_argument("--trackers", type=int, default=1, metavar="N", help="peer-tier trackers (default 1; 0: no peer tier)")
    parser.add_argument("--startup-timeout", type=float, default=30.0, metavar="S", help="seconds (default 30)")
    for kind in KINDS:
        parser.add_argument(
            f"--{kind.name}-faults",
            action="append",
            default=[],
            metavar="SPEC",
            help=f"a --fault SPEC for every {kind.name} server (repeatable)",
        )
    parser.add_argument("--admin-token", help="every server mounts /admin/faults behind this bearer token")
    parser.add_argument(
        "--metadata",
        metavar="URL",
        help="redis://HOST:PORT/DB: the API servers' metadata in Redis; 'redis': in a Redis and its replica the cluster starts",
    )
    parser.add_argument(
        "--api-servers", type=int, default=1, metavar="N", help="metadata API servers (default 1; more need --metadata)"
    )
    parser.add_argument("--source", metavar="S3_URL", help="s3://BUCKET/PREFIX: L4 in an object store, no block servers")
    add_s3_args(parser)
    parser.add_argument(
        "--seaweedfs", action="store_true", help="L4 on a local SeaweedFS this starts and stops (no block servers)"
    )
    parser.add_argument(
        "--no-restart", action="store_true", help="leave a server that dies down (default: restart it, with backoff)"
    )
    add_hosts_args(parser)
    args = parser.parse_args(argv)
    if args.block_servers < 1:
        parser.error("--block-servers must be at least 1")
    if args.write_quorum is not None and not 1 <= args.write_quorum <= args.block_servers:
        parser.error(f"--write-quorum must be between 1 and --block-servers ({args.block_servers})")
    if args.l3_nodes < 0 or args.l3_capacity_mb <= 0 or args.l3_hold_seconds < 0:
        parser.error("--l3-nodes and --l3-hold-seconds must be >= 0, --l3-capacity-mb positive")
    if args.trackers < 0:
        parser.error("--trackers must be >= 0")
    names = (
        "block_servers",
        "write_quorum",
        "latency_ms",
        "bandwidth_mbps",
        "spindles",
        "token",
        "keys",
        "l3_nodes",
        "l3_capacity_mb",
        "l3_hold_seconds",
        "trackers",
        "startup_timeout",
        "admin_token",
        "api_servers",
    )
    faults = {kind.name: tuple(specs) for kind in KINDS if (specs := getattr(args, f"{kind.name}_faults"))}
    if args.keys is not None and not args.keys.is_file():
        parser.error(f"--keys {args.keys}: no such file (make one with 'blobsdk token keygen FILE')")
    try:
        if args.source is not None:
            s3_location(args.source)
    except ValueError as exc:
        parser.error(f"--source: {exc}")
    if args.metadata is not None and args.metadata != OWN_REDIS and not args.metadata.startswith(("redis://", "rediss://")):
        parser.error(f"--metadata must be redis://HOST:PORT/DB or redis, got {args.metadata!r}")
    if args.api_servers < 1:
        parser.error("--api-servers must be at least 1")
    if args.api_servers > 1 and args.metadata is None:
        parser.error(METADATA_FOR_SEVERAL)
    if args.seaweedfs and (args.source is not None or args.s3_endpoint is not None):
        parser.error("--seaweedfs and --source (or --s3-endpoint) both name L4: give one")
    links = links_of_args(parser, args)
    s3 = msgspec.structs.replace(s3_config_of_args(args), **_aws_credentials())
    options = ClusterOptions(
        **{n: getattr(args, n) for n in names},
        faults=faults,
        metadata=args.metadata,
        source=args.source,
        s3=s3,
        seaweedfs=args.seaweedfs,
        hosts=args.hosts,
        links=links,
    )
    table = [*launch_table(options), *service_hosts(options)]
    check_links(parser, options, table, [*(kind.name for kind in KINDS), *(kind for _, kind in service_hosts(options))])
    return args.dir, with_service_token(options), not args.no_restart


def _aws_credentials() -> dict[str, str]:
    """The AWS credentials of this environment, for client.toml's [s3] (the servers get them
    through theirs)."""
    keys = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY"}
    return {field: os.environ[var] for field, var in keys.items() if os.environ.get(var)}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _supervise(cluster: Cluster, restart: bool, log: ClusterLog) -> NoReturn:
    """Watch the servers until a signal interrupts this with _Shutdown."""
    supervisor = Supervisor(cluster.processes, cluster.restart if restart else None, log.info, log.warning)
    while True:
        supervisor.poll(time.monotonic())
        time.sleep(0.2)


def run(dir: Path, options: ClusterOptions, restart: bool = True) -> int:
    if (missing := lacking(options)) is not None:
        _say(f"{prog(f'{__package__}.cluster')}: error: {missing}")
        return 1
    cluster = Cluster(dir, options, report=_say)
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
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not interrupt the stop
        cluster.stop()
        if stopped_by is not None:
            log.info(f"stopped ({stopped_by}): every server is down")
        log.close()


def main(argv: Sequence[str] | None = None) -> int:
    dir, options, restart = parse_cli(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    return run(dir, options, restart)


if __name__ == "__main__":
    sys.exit(main())
