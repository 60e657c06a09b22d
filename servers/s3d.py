"""A local S3 API for tests and benchmarks: moto's standalone server (``moto[server]``) as a
subprocess on a free loopback port, with buckets made on request.

    with start_s3(dir) as s3:
        s3.make_bucket("data")
        S3BlockStore("data", config=s3.config, allow_http=True)
        s3.stop(); s3.start()        # down, and back (moto keeps nothing: an empty S3)

moto checks no signature, so any credentials do; :attr:`S3Server.config` carries dummy ones
(and the endpoint), so obstore never looks for real ones.  The server dies with the process
that started it (servers/_common/lifeline.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from servers._common.lifeline import LIFELINE, free_port

START_TIMEOUT_S = 30.0  # moto imports a lot


@dataclass
class S3Server:
    dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lifeline: int | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> dict[str, str]:
        """obstore S3 options for this server."""
        return {"endpoint": self.endpoint, "region": "us-east-1", "access_key_id": "test", "secret_access_key": "test"}

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            port = self.port or free_port()
            read, write = os.pipe()
            args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
            with open(self.dir / "moto.log", "ab") as log:
                self.process = subprocess.Popen([sys.executable, "-c", LIFELINE, *args], stdin=read, stdout=log, stderr=log)
            os.close(read)
            self._lifeline = write
            if self._wait_ready(port):
                self.port = port
                return
            self.stop()
            if self.port:
                break
        raise RuntimeError(f"moto's S3 server did not start (see {self.dir / 'moto.log'})")

    def _wait_ready(self, port: int) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
            time.sleep(0.1)
        return False

    def make_bucket(self, bucket: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def stop(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.process is not None:
            self.process.wait(timeout=10)
            self.process = None


@contextlib.contextmanager
def start_s3(dir: str | os.PathLike[str]) -> Iterator[S3Server]:
    server = S3Server(Path(dir))
    server.start()
    try:
        yield server
    finally:
        server.stop()
