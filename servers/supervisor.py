"""Supervising a running local cluster (servers/cluster.py): its server processes, their
readiness (a port file, then /healthz), the supervisor that restarts those that die (with
backoff) or leaves them down, and the cluster command's log."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._common.logs import formatter

HOST = "127.0.0.1"
POLL_SECONDS = 0.05

# urllib would send loopback health checks through an http_proxy from the environment.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClusterError(Exception):
    """A server failed to start or to answer /healthz in time, or cannot be restarted."""


@dataclass(kw_only=True)
class ServerProcess:
    kind: str
    name: str
    module: str
    args: list[str]  # every flag but the serving ones (--host, --port, --port-file)
    popen: subprocess.Popen[bytes]
    port_file: Path
    log: Path
    host: str = HOST  # the address it binds (a testbed host's, on hosts: servers/clusterhosts.py)
    url: str = ""
    started: float = field(default_factory=time.monotonic)  # of the current popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _wait_ready(proc: ServerProcess, deadline: float, timeout: float) -> str:
    """Wait for ``proc``'s port file and a 200 from its /healthz; return its base URL."""
    while time.monotonic() < deadline:
        if (code := proc.popen.poll()) is not None:
            raise ClusterError(f"{proc.name} exited with code {code} during start-up; its log:\n{proc.log_tail()}")
        if not proc.url and (port := _read_port(proc.port_file)):
            proc.url = f"http://{proc.host}:{port}"
        if proc.url and _healthy(proc.url):
            return proc.url
        time.sleep(POLL_SECONDS)
    raise ClusterError(f"{proc.name} did not answer /healthz within {timeout:g}s; its log:\n{proc.log_tail()}")


def _read_port(port_file: Path) -> int | None:
    """The port in ``port_file``, or None: no file yet, or not a port (the file is in a
    directory the user owns, and may hold anything)."""
    try:
        port = int(port_file.read_text())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def reusable_port(port_file: Path) -> tuple[int, int | None]:
    """The port a server gets when its cluster starts again in the same directory: the one
    in ``port_file`` from the last run if it is free, else 0 (a new one); and that last
    port, if there was one (so a caller can say it was taken)."""
    last = _read_port(port_file)
    return (last if last is not None and port_free(last) else 0), last


def port_free(port: int) -> bool:
    """Whether a server could bind ``port`` on HOST now.  With SO_REUSEADDR, as asyncio's
    servers bind: the last run's connections in TIME_WAIT do not make it taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _healthy(url: str) -> bool:
    try:
        with _direct.open(f"{url}/healthz", timeout=2.0) as response:
            return response.status == 200
    except OSError:  # URLError, connection refused, timeouts
        return False


BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0  # seconds before restarting a dead server
STABLE_SECONDS = 10.0  # a server that ran this long before dying is restarted after BACKOFF_FIRST


@dataclass(kw_only=True)
class _Watched:
    proc: ServerProcess
    backoff: float = BACKOFF_FIRST  # before its next restart
    due: float | None = None  # when it is restarted next, while it is dead
    restarts: int = 0
    ready: bool = True  # has answered /healthz since its last (re)start
    down: bool = False  # dead and left so (--no-restart)


class Supervisor:
    """Watches servers: each :meth:`poll` restarts (``restart``, with backoff) or leaves down
    (``restart=None``) those that died and logs what happened; the others are never touched."""

    def __init__(
        self,
        processes: Sequence[ServerProcess],
        restart: Callable[[ServerProcess], None] | None,
        log: Callable[[str], None],
        warn: Callable[[str], None] | None = None,
    ) -> None:
        """``log`` takes restarts and recoveries; ``warn`` (default: ``log``) deaths and failed restarts."""
        self._watched = [_Watched(proc=p) for p in processes]
        self._restart, self._log, self._warn = restart, log, log if warn is None else warn

    def poll(self, now: float) -> None:
        for w in self._watched:
            if w.due is not None and now >= w.due:
                self._restart_now(w)
            elif w.due is None and not w.down:
                self._check(w, now)

    def _check(self, w: _Watched, now: float) -> None:
        p = w.proc
        if p.popen.poll() is None:
            if not w.ready and _healthy(p.url):
                w.ready = True
                self._log(f"{p.name} is serving again on {p.url} (pid {p.pid})")
        elif self._restart is None:
            w.down = True
            self._warn(
                f"{p.name} (pid {p.pid}) exited with code {p.popen.returncode}; left down (--no-restart), the rest keep running"
            )
        else:
            w.backoff = BACKOFF_FIRST if now - p.started >= STABLE_SECONDS else w.backoff
            w.due = now + w.backoff
            self._warn(
                f"{p.name} (pid {p.pid}) exited with code {p.popen.returncode}; restarting it in {w.backoff:g}s; its log: {p.log}"
            )
            w.backoff = min(2 * w.backoff, BACKOFF_MAX)

    def _restart_now(self, w: _Watched) -> None:
        assert self._restart is not None
        w.due, w.ready, w.restarts = None, False, w.restarts + 1
        try:
            self._restart(w.proc)
        except OSError as exc:  # its old popen is still the dead one: the next poll reschedules it
            self._warn(f"{w.proc.name} could not be restarted: {exc}")
            return
        self._log(f"{w.proc.name} restarted on {w.proc.url} (pid {w.proc.pid}, restart {w.restarts})")


class ClusterLog:
    """The cluster command's log: each record goes to its stdout and to DIR/logs/cluster.log,
    in the servers' format (servers/_common/logs.py)."""

    def __init__(self, dir: Path) -> None:
        (dir / "logs").mkdir(parents=True, exist_ok=True)
        self.logger = logging.getLogger("servers.cluster")  # its handlers are this run's, removed by close()
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self._handlers: list[logging.Handler] = [
            logging.StreamHandler(sys.stdout),
            logging.FileHandler(dir / "logs" / "cluster.log"),
        ]
        for handler in self._handlers:
            handler.setFormatter(formatter("cluster"))
            self.logger.addHandler(handler)

    def info(self, message: str) -> None:
        self.logger.info(message)

    def warning(self, message: str) -> None:
        self.logger.warning(message)

    def close(self) -> None:
        for handler in self._handlers:
            self.logger.removeHandler(handler)
            handler.close()
