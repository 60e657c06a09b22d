"""Servers that stop with the process that started them (the *starter*), even when it is
SIGKILLed: our own (servers/cluster.py) and third-party ones started for tests and benchmarks
(redis-server, moto), with a free port to give the latter.

A server is orphaned, and stops, once :func:`wait_orphaned` returns: when its starter is gone,
watched directly (a pidfd where the kernel has them, Linux 5.3 on; elsewhere its parent pid,
looked at every ``PARENT_POLL_S``), or when the *lifeline* reaches EOF, a pipe whose write end
only the starter holds.  The pipe alone is not enough: a process forked from the starter (a
test's ``multiprocessing`` or ``os.fork`` child, a ``fork`` DataLoader worker) holds a copy of
its write end for as long as it lives, so the pipe's EOF would wait for it, and closing the
copy in children (``os.register_at_fork``) would miss a fork made from C.  The starter's death
is seen whatever it forked.  Watching the starter *process* is also why this is not
``PR_SET_PDEATHSIG``, which fires when the starter's *thread* exits (``async with`` starts
servers from a worker thread).

Our own servers watch from a thread of their own (servers/cluster.py); a program that cannot
runs under :data:`LIFELINE`, a small Python parent that kills it once it is orphaned.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, NoReturn

from . import netns

PARENT_POLL_S = 0.5  # without pidfds: how often an orphan looks whether its starter is gone
# ``python -c LIFELINE STARTER_PID COMMAND...``: see run_under_lifeline.
LIFELINE = f"from {__package__}.lifeline import run_under_lifeline; run_under_lifeline()"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where LIFELINE imports this module from


def wait_orphaned(lifeline: int, starter: int) -> None:
    """Return once this process is orphaned: its parent ``starter`` is gone, or nobody holds
    the write end of the lifeline pipe whose read end is ``lifeline`` (nobody writes to it:
    a read returns only at EOF).  OSError if ``lifeline`` is not an open file."""
    pidfd = _pidfd(starter)
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    timeout = None if pidfd is not None else PARENT_POLL_S * 1000
    try:
        while os.getppid() == starter:  # reparented: the starter died (before the pidfd was open, too)
            for fd, _ in poller.poll(timeout):
                if fd == pidfd or not os.read(lifeline, 1):
                    return
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid``, readable once it exits; None where there are none (not Linux, a
    kernel before 5.3) or if ``pid`` is gone already (the parent pid says so then)."""
    open_pidfd = getattr(os, "pidfd_open", None)
    if open_pidfd is None:
        return None
    try:
        fd: int = open_pidfd(pid)
    except OSError:
        return None
    return fd


def run_under_lifeline() -> NoReturn:
    """Run ``sys.argv[2:]`` and kill it once this process is orphaned (its starter is
    ``sys.argv[1]``, its lifeline is stdin) or gets SIGTERM; exit with its exit code."""
    starter, *command = sys.argv[1:]
    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: child.kill())  # LocalService.stop

    def watch() -> None:
        with contextlib.suppress(OSError):  # a bad stdin: stopping is the safe side
            wait_orphaned(0, int(starter))
        child.kill()

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    sys.exit(child.wait())


def free_port() -> int:
    """A loopback port free a moment ago: for a server that cannot bind port 0 itself (a
    caller retries with another if it was taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalService:
    """A third-party server in ``dir`` on a loopback port, run under :data:`LIFELINE`:
    ``start()`` (again after ``stop()``: a restart on the same port), ``stop()`` (SIGKILL, and
    waits).  A subclass says how to run it (:meth:`command`, binding :attr:`address`) and when
    it serves (:meth:`answers`, one probe).  ``namespace``: a testbed host's network namespace
    to run it in (``ip netns exec``, which keeps the pid, so the lifeline still watches its
    starter), with ``address`` that host's; None: this namespace, on loopback."""

    dir: Path
    port: int = 0
    address: str = "127.0.0.1"
    namespace: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lifeline: int | None = field(default=None, repr=False)

    name: ClassVar[str] = "service"
    log_name: ClassVar[str] = "service.log"
    start_timeout_s: ClassVar[float] = 10.0

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def answers(self, port: int) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        """Start and wait until it answers; a port taken meanwhile by another process is
        left for a new free one (never when restarting on our own)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            port = self.port or free_port()
            read, write = os.pipe()
            with open(self.dir / self.log_name, "ab") as log:
                argv = [sys.executable, "-c", LIFELINE, str(os.getpid()), *self.command(port)]
                if self.namespace is not None:
                    argv = [netns.IP, "netns", "exec", self.namespace, *argv]
                self.process = subprocess.Popen(argv, stdin=read, stdout=log, stderr=log, env=_lifeline_env())
            os.close(read)
            self._lifeline = write
            if self._wait_ready(port):
                self.port = port
                return
            self.stop()
            if self.port:
                break
        raise RuntimeError(f"{self.name} did not start in {self.dir} (see {self.dir / self.log_name})")

    def _wait_ready(self, port: int) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return False  # exited: the port was taken, most likely
            with contextlib.suppress(OSError):
                if self.answers(port):
                    return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Kill the server (SIGKILL: no chance to save anything) and wait for it."""
        if self._lifeline is not None:
            os.close(self._lifeline)  # the lifeline kills the server
            self._lifeline = None
        if self.process is not None:
            # and so does SIGTERM: the pipe's EOF never comes while a process forked from the
            # starter meanwhile (a DataLoader worker) still holds a copy of its write end
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def _lifeline_env() -> dict[str, str]:
    """This environment, with the root LIFELINE imports this package from on the path."""
    path = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}
