"""Third-party servers started for tests and benchmarks (redis-server, moto): a free port to
give them, and a lifeline that kills them with the process that started them.

Our own servers read their lifeline pipe themselves (servers/cluster.py); a program that
cannot runs under :data:`LIFELINE`, a small Python parent that kills it once its stdin (the
pipe whose write end only the starter holds) reaches EOF: when the starter exits or dies,
even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

LIFELINE = """
import os, signal, subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda *_: child.kill())  # stop(): a forked process may hold the pipe too
def watch():
    os.read(0, 1)  # EOF once the starter is gone
    child.kill()
threading.Thread(target=watch, daemon=True).start()
sys.exit(child.wait())
"""


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
    waits).  A subclass says how to run it (:meth:`command`) and when it serves
    (:meth:`answers`, one probe)."""

    dir: Path
    port: int = 0
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
                argv = [sys.executable, "-c", LIFELINE, *self.command(port)]
                self.process = subprocess.Popen(argv, stdin=read, stdout=log, stderr=log)
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
