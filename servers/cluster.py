"""Start a whole local blobsdk cluster: the metadata API server, N L4 block servers, M L3
flash nodes and the peer tier's trackers, each a real subprocess on a free loopback port.

    python -m servers.cluster --dir DIR [--block-servers 3] [--write-quorum Q]
                              [--latency-ms F] [--bandwidth-mbps F] [--spindles N] [--token T] [--keys FILE]
                              [--l3-nodes M] [--l3-capacity-mb N] [--l3-hold-seconds S] [--trackers N]
                              [--api-faults SPEC] [--block-faults SPEC] [--l3-faults SPEC]
                              [--admin-token T] [--no-restart]
                              [--metadata redis://HOST:PORT/DB] [--source s3://BUCKET/PREFIX [--s3-endpoint URL]
                               [--s3-region R] [--s3-allow-http] | --seaweedfs]

The command starts one tracker (``servers.tracker``) unless ``--trackers`` says otherwise:
client.toml names it (``tracker_urls``), so every client of the cluster runs a peer server
and reads its peers' chunks before L3 and L4; ``--trackers 0`` turns the peer tier off.
:func:`start_cluster` (tests, benchmarks) starts none unless given ``trackers=``: each of
them chooses the tiers it measures.

With ``--metadata`` the API server keeps the metadata in Redis; with ``--source`` L4 is that
object store: no block servers start, the L3 nodes read through from it, and client.toml
names it (``source_url``, ``[s3]``, with the credentials of ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` if set, which the servers get through their environment).  With
``--seaweedfs`` the cluster starts a local SeaweedFS (servers/seaweedd.py: ``weed mini``, data
in ``DIR/seaweedfs``, kept across runs) and L4 is its bucket, as if ``--source
s3://blobsdk/cluster`` named it, with its endpoint and keys in client.toml; it stops with the
cluster.

Once every server answers ``/healthz`` it writes ``DIR/cluster.json`` (who runs where) and
then ``DIR/client.toml`` (what :meth:`blobsdk.ClientConfig.from_toml` reads), both
atomically, so a waiter that sees ``client.toml`` can use the cluster at once.  SIGINT or
SIGTERM stops every server and exits 0.  A server that dies on its own is restarted on the
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

A kind of server is one :class:`ServerKind` entry in :data:`KINDS`; kinds start in order,
so a later kind's arguments may name the URLs of earlier ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import runpy
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, NoReturn
from urllib.parse import urlsplit

import msgspec

from blobsdk.config import ClientConfig, S3Config, WriteConfig, s3_location

from ._common import prog
from ._common.lifeline import wait_orphaned
from ._common.stores import add_s3_args, s3_args_of, s3_config_of_args
from .seaweedd import SeaweedServer, start_seaweed_l4
from .supervisor import HOST, ClusterError, ClusterLog, ServerProcess, Supervisor, _wait_ready

ROOT = Path(__file__).resolve().parent.parent
ORPHAN_GRACE_SECONDS = 5.0  # an orphaned server that has not stopped on SIGTERM by then exits hard
# Every server runs through serve_child: argv is the lifeline's fd, the starter's pid, the module, its flags.
_CHILD = f"from {__package__}.cluster import serve_child; serve_child()"


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    block_servers: int = 3
    write_quorum: int | None = None  # None: a majority of the block replicas must acknowledge a write
    latency_ms: float | None = None  # HDD emulation on the block servers; None: their default
    bandwidth_mbps: float | None = None
    spindles: int | None = None
    token: str | None = None  # a static admin token every server takes (written to client.toml)
    keys: Path | None = None  # a keyring every server takes: tenants with signed tokens
    l3_nodes: int = 2  # L3 flash nodes, each reading through every block server
    l3_capacity_mb: float = 1024
    l3_hold_seconds: float = 0.0
    trackers: int = 0  # peer-tier trackers (servers.tracker); their URLs go in tracker_urls (the command's default: 1)
    startup_timeout: float = 30.0
    # kind name ("api", "block", "l3", "tracker") -> its servers' --fault specs (servers/_common/faults.py)
    faults: Mapping[str, Sequence[str]] = field(default_factory=dict)
    admin_token: str | None = None  # every server mounts /admin/faults behind it
    metadata: str | None = None  # redis://HOST:PORT/DB: the API server keeps the metadata there (default SQLite)
    source: str | None = None  # s3://BUCKET/PREFIX: L4 is that object store (no block servers)
    s3: S3Config = field(default_factory=S3Config)  # for source; its credentials reach the servers as AWS_* variables
    seaweedfs: bool = False  # L4 on a local SeaweedFS the cluster starts (its source and s3 replace those above)


@dataclass(frozen=True)
class Launch:
    """What a kind's argument builder may look at: the cluster directory, the options, and
    the URLs of the kinds started before it."""

    dir: Path
    options: ClusterOptions
    urls: dict[str, list[str]]


@dataclass(frozen=True, kw_only=True)
class ServerKind:
    name: str  # instances are "<name>" when there is one, else "<name>-<i>"
    module: str  # run as `python -m module`
    count: Callable[[ClusterOptions], int]
    args: Callable[[Launch, int], list[str]]  # instance i's own flags (data dir, ...)
    to_config: Callable[[list[str]], dict[str, Any]]  # where its URLs go in ClientConfig


def _block_args(launch: Launch, i: int) -> list[str]:
    o = launch.options
    flags = [("--latency-ms", o.latency_ms), ("--bandwidth-mbps", o.bandwidth_mbps), ("--spindles", o.spindles)]
    return ["--dir", str(launch.dir / f"blocks-{i}"), *[a for k, v in flags if v is not None for a in (k, str(v))]]


def _api_args(launch: Launch) -> list[str]:
    metadata = launch.options.metadata
    return ["--metadata", metadata] if metadata else ["--db", str(launch.dir / "meta.sqlite")]


def _flash_args(launch: Launch, i: int) -> list[str]:
    o = launch.options
    if o.source is not None:
        blocks = ["--source", o.source, *s3_args_of(o.s3)]
    else:
        blocks = [a for url in launch.urls["block"] for a in ("--block-url", url)]
    sizes = ["--capacity-mb", str(o.l3_capacity_mb), "--hold-seconds", str(o.l3_hold_seconds)]
    return ["--dir", str(launch.dir / f"l3-{i}"), *blocks, *sizes]


KINDS: tuple[ServerKind, ...] = (
    ServerKind(
        name="api",
        module=f"{__package__}.api",
        count=lambda o: 1,
        args=lambda launch, i: (
            ["--metadata", o.metadata] if (o := launch.options).metadata else ["--db", str(launch.dir / "meta.sqlite")]
        ),
        to_config=lambda urls: {"api_url": urls[0]},
    ),
    ServerKind(
        name="block",
        module=f"{__package__}.blockstore",
        count=lambda o: 0 if o.source is not None else o.block_servers,
        args=_block_args,
        to_config=lambda urls: {"block_urls": tuple(urls)} if urls else {},
    ),
    ServerKind(
        name="l3",
        module=f"{__package__}.flash",
        count=lambda o: o.l3_nodes,
        args=_flash_args,
        to_config=lambda urls: {"l3_urls": tuple(urls)},
    ),
    ServerKind(
        name="tracker",
        module=f"{__package__}.tracker",
        count=lambda o: o.trackers,
        args=lambda launch, i: [],
        to_config=lambda urls: {"tracker_urls": tuple(urls)},
    ),
)


@dataclass
class Cluster:
    """A running local cluster; ``with``/``async with`` starts it and stops every server."""

    dir: Path
    options: ClusterOptions = ClusterOptions()
    kinds: Sequence[ServerKind] = KINDS
    processes: list[ServerProcess] = field(default_factory=list)
    config: ClientConfig | None = None
    seaweed: SeaweedServer | None = None  # with options.seaweedfs: the object store L4 is on
    _lifeline: tuple[int, int] | None = field(default=None, repr=False)  # (read fd, write fd)

    @property
    def config_path(self) -> Path:
        return self.dir / "client.toml"

    def start(self) -> ClientConfig:
        """Start every server, wait for /healthz, write cluster.json and client.toml."""
        self.dir = self.dir.resolve()
        for sub in ("run", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for stale in (self.config_path, self.dir / "cluster.json"):
            stale.unlink(missing_ok=True)
        self._lifeline = self._lifeline or os.pipe()  # both ends non-inheritable
        deadline = time.monotonic() + self.options.startup_timeout
        if self.options.seaweedfs and self.seaweed is None:
            self.seaweed, source, s3 = start_seaweed_l4(self.dir / "seaweedfs")
            self.options = dataclasses.replace(self.options, source=source, s3=s3)
        urls: dict[str, list[str]] = {}
        for kind in self.kinds:
            started = [self._spawn(kind, i, Launch(self.dir, self.options, urls)) for i in range(kind.count(self.options))]
            urls[kind.name] = [_wait_ready(p, deadline, self.options.startup_timeout) for p in started]
        self.config = client_config(self.kinds, urls, self.options)
        self._write_description()
        _write_atomic(self.config_path, self.config.to_toml())
        return self.config

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
        proc.popen, proc.started = self._popen(proc.module, port, proc.port_file, proc.args, proc.log), time.monotonic()
        self._write_description()

    def _spawn(self, kind: ServerKind, i: int, launch: Launch) -> ServerProcess:
        name = kind.name if kind.count(self.options) == 1 else f"{kind.name}-{i}"
        port_file, log = self.dir / "run" / f"{name}.port", self.dir / "logs" / f"{name}.log"
        port_file.unlink(missing_ok=True)
        args = [*_common_args(self.options, kind), *kind.args(launch, i)]
        popen = self._popen(kind.module, 0, port_file, args, log)
        proc = ServerProcess(kind=kind.name, name=name, module=kind.module, args=args, popen=popen, port_file=port_file, log=log)
        self.processes.append(proc)
        return proc

    def _popen(self, module: str, port: int, port_file: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        assert self._lifeline is not None, "start() opens the lifeline"
        fd = self._lifeline[0]
        serving = ["--host", HOST, "--port", str(port), "--port-file", str(port_file)]
        argv = [sys.executable, "-c", _CHILD, str(fd), str(os.getpid()), module, *serving, *args]
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


def _common_args(options: ClusterOptions, kind: ServerKind) -> list[str]:
    """Flags every server of ``kind`` gets: tokens, keyring and fault specs."""
    keys = None if options.keys is None else str(Path(options.keys).resolve())
    flags = [("--token", options.token), ("--keys", keys), ("--admin-token", options.admin_token)]
    flags += [("--fault", spec) for spec in options.faults.get(kind.name, ())]
    # "--flag=value": a value may begin with "-" (a random token does one time in 64).
    return [f"{k}={v}" for k, v in flags if v]


def start_cluster(dir: str | os.PathLike[str], **options: Any) -> Cluster:
    """A :class:`Cluster` in ``dir`` (``options`` are :class:`ClusterOptions` fields), to use
    as ``with start_cluster(...) as cluster`` or ``async with``; ``cluster.config`` is the
    ClientConfig, ``cluster.processes`` the servers."""
    return Cluster(Path(dir), with_service_token(ClusterOptions(**options)))


def with_service_token(options: ClusterOptions) -> ClusterOptions:
    """With a keyring but no static token, the servers still need an admin token among
    themselves (an L3 node reads through the block servers): a random one, which
    client.toml gets too (tenants use tokens made by ``blobsdk token create``)."""
    if options.keys is None or options.token is not None:
        return options
    return dataclasses.replace(options, token=secrets.token_urlsafe(24))


def client_config(kinds: Sequence[ServerKind], urls: dict[str, list[str]], options: ClusterOptions) -> ClientConfig:
    raw: dict[str, Any] = {}
    for kind in kinds:
        raw.update(kind.to_config(urls[kind.name]))
    if options.source is not None:
        raw.update(source_url=options.source, s3=options.s3)
    return ClientConfig(**raw, token=options.token, write=WriteConfig(write_quorum=options.write_quorum))


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
    parser = argparse.ArgumentParser(prog=prog(f"{__package__}.cluster"), description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--metadata", metavar="URL", help="redis://HOST:PORT/DB: the API server's metadata in Redis")
    parser.add_argument("--source", metavar="S3_URL", help="s3://BUCKET/PREFIX: L4 in an object store, no block servers")
    add_s3_args(parser)
    parser.add_argument(
        "--seaweedfs", action="store_true", help="L4 on a local SeaweedFS this starts and stops (no block servers)"
    )
    parser.add_argument(
        "--no-restart", action="store_true", help="leave a server that dies down (default: restart it, with backoff)"
    )
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
    )
    faults = {kind.name: tuple(getattr(args, f"{kind.name}_faults")) for kind in KINDS}
    if args.keys is not None and not args.keys.is_file():
        parser.error(f"--keys {args.keys}: no such file (make one with 'blobsdk token keygen FILE')")
    try:
        if args.source is not None:
            s3_location(args.source)
    except ValueError as exc:
        parser.error(f"--source: {exc}")
    if args.metadata is not None and not args.metadata.startswith(("redis://", "rediss://")):
        parser.error(f"--metadata must be redis://HOST:PORT/DB, got {args.metadata!r}")
    if args.seaweedfs and (args.source is not None or args.s3_endpoint is not None):
        parser.error("--seaweedfs and --source (or --s3-endpoint) both name L4: give one")
    s3 = msgspec.structs.replace(s3_config_of_args(args), **_aws_credentials())
    options = ClusterOptions(
        **{n: getattr(args, n) for n in names},
        faults=faults,
        metadata=args.metadata,
        source=args.source,
        s3=s3,
        seaweedfs=args.seaweedfs,
    )
    return args.dir, with_service_token(options), not args.no_restart


def _aws_credentials() -> dict[str, str]:
    """The AWS credentials of this environment, for client.toml's [s3] (the servers get them
    through theirs)."""
    keys = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY"}
    return {field: os.environ[var] for field, var in keys.items() if os.environ.get(var)}


def _print_ready(cluster: Cluster) -> None:
    width = max(len(p.name) for p in cluster.processes)
    for p in cluster.processes:
        print(f"{p.name:<{width}}  {p.url}  pid {p.pid}  log {p.log}")
    if cluster.seaweed is not None:
        print(f"SeaweedFS S3 {cluster.seaweed.endpoint}  L4 {cluster.options.source}  log {cluster.seaweed.dir / 'weed.log'}")
    print(f"client config: {cluster.config_path}\ncluster ready; Ctrl-C or SIGTERM stops it", flush=True)


def _supervise(cluster: Cluster, restart: bool, log: ClusterLog) -> NoReturn:
    """Watch the servers until a signal interrupts this with _Shutdown."""
    supervisor = Supervisor(cluster.processes, cluster.restart if restart else None, log.info, log.warning)
    while True:
        supervisor.poll(time.monotonic())
        time.sleep(0.2)


def run(dir: Path, options: ClusterOptions, restart: bool = True) -> int:
    cluster = Cluster(dir, options)
    log = ClusterLog(dir)
    stopped_by = None
    try:
        cluster.start()
        _print_ready(cluster)
        log.info(f"ready: {len(cluster.processes)} servers; client config {cluster.config_path}")
        _supervise(cluster, restart, log)
    except _Shutdown as exc:
        stopped_by = str(exc)
        return 0
    except ClusterError as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
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
