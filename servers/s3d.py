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
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ._common.lifeline import LocalService


@dataclass
class S3Server(LocalService):
    """moto's S3 server in ``dir``; see the module docstring."""

    name: ClassVar[str] = "moto's S3 server"
    log_name: ClassVar[str] = "moto.log"
    start_timeout_s: ClassVar[float] = 30.0  # moto imports a lot

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> dict[str, str]:
        """obstore S3 options for this server."""
        return {"endpoint": self.endpoint, "region": "us-east-1", "access_key_id": "test", "secret_access_key": "test"}

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def answers(self, port: int) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    def make_bucket(self, bucket: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()


@contextlib.contextmanager
def start_s3(dir: str | os.PathLike[str]) -> Iterator[S3Server]:
    server = S3Server(Path(dir))
    server.start()
    try:
        yield server
    finally:
        server.stop()
