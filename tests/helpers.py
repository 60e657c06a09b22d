"""Test helpers: run an aiohttp app in-loop on a free loopback port, or a server as a real
subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from blobsdk.auth import GRANT_HEADER, Keyring, new_claims
from blobsdk.net.serving import ServerLimits, listening
from blobsdk.wire import ChunkRef
from servers._common.auth import ServerAuth
from servers.s3d import S3Server, start_s3
from servers.seaweedd import SeaweedServer

ROOT = Path(__file__).resolve().parent.parent
# The S3 APIs the S3 tests run against: moto (a mock; it can fake faults) and SeaweedFS (a real
# object store; one for the session, the ``seaweed`` fixture of tests/conftest.py).
S3_STORES = ("moto", "seaweedfs")


@contextmanager
def s3_server(request: Any) -> Iterator[S3Server | SeaweedServer]:
    """The S3 server of a fixture parametrized over :data:`S3_STORES` (``request.param``):
    the session's SeaweedFS, or a moto of its own."""
    if request.param == "seaweedfs":
        yield request.getfixturevalue("seaweed")
        return
    with start_s3(request.getfixturevalue("tmp_path_factory").mktemp("s3")) as server:
        yield server


def redis_s3_toml(redis_url: str, source_url: str, s3_endpoint: str, **tables: dict[str, object]) -> str:
    """A client.toml with its metadata in Redis and L4 in S3 at ``s3_endpoint`` (moto: any
    keys do), then ``tables`` (``write={"chunk_size": 65536}``; values as TOML text)."""
    text = f"""
metadata_url = "{redis_url}"
source_url = "{source_url}"

[s3]
endpoint = "{s3_endpoint}"
region = "us-east-1"
allow_http = true
access_key_id = "test"
secret_access_key = "test"
"""
    for table, values in tables.items():
        text += f"\n[{table}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
    return text


@asynccontextmanager
async def running_app(app: web.Application, limits: ServerLimits | None = None) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1:0 in this loop, as ``serve`` does (with ``limits``); yield
    its base URL."""
    async with listening(app, "127.0.0.1", 0, limits) as port:
        yield f"http://127.0.0.1:{port}"


@contextmanager
def server_process(module: str, *args: str, tmp: Path, timeout: float = 15.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start ``python -m module --port 0 --port-file F *args``; yield (base URL, process)."""
    port_file = tmp / f"{module.replace('.', '_')}-{time.monotonic_ns()}.port"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", "--port-file", str(port_file), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"{module} exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{module} did not start within {timeout}s")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port_file.read_text()}", proc
    finally:
        stop_process(proc)
        if proc.stderr:
            proc.stderr.close()


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server subprocess, and kill it if it has not exited within 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Tenancy:
    """A keyring, and the tokens and chunk grants a deployment would issue from it."""

    def __init__(self, keyring: Keyring | None = None) -> None:
        self.keyring = keyring or Keyring.generate()

    def token(self, tenant: str, *buckets: str, admin: bool = False, ttl: float = 3600.0, now: float | None = None) -> str:
        """A signed token of ``tenant`` for ``buckets`` (none given: every bucket)."""
        return self.keyring.sign_token(new_claims(tenant, buckets or ("*",), ttl, admin=admin, now=now))

    def granted(self, ref: ChunkRef, tenant: str, ttl: float = 900.0, now: float | None = None) -> ChunkRef:
        """``ref`` with the grant the metadata API would give ``tenant`` for it."""
        expires = int((time.time() if now is None else now) + ttl)
        grant = self.keyring.sign_grant(tenant, ref.block_id, ref.offset, ref.length, expires)
        return msgspec.structs.replace(ref, grant=grant)

    def auth(self, token: str | None = None, **kwargs: Any) -> ServerAuth:
        """Server auth with this keyring (and an optional static admin ``token``)."""
        return ServerAuth(token, self.keyring, **kwargs)

    def write_keys(self, path: Path) -> Path:
        path.write_text(self.keyring.to_toml())
        return path


def auth_headers(token: str | None, ref: ChunkRef | None = None) -> dict[str, str]:
    """The bearer token and, if ``ref`` carries one, its chunk grant."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if ref is not None and ref.grant:
        headers[GRANT_HEADER] = ref.grant
    return headers


def stored_files(root: Path) -> list[Path]:
    """Every file under a block store's or disk cache's ``root`` but its FORMAT marker and a
    disk cache's INDEX file, sorted."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p not in (root / "FORMAT", root / "INDEX"))


def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` (blocking) until it holds; the test fails after ``timeout`` s."""
    import pytest

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {condition}")
        time.sleep(0.01)


def wait_for_child(pid: int, timeout: float = 30.0) -> int:
    """The exit code of forked child ``pid``; the test fails (and the child is killed) if it
    has not exited within ``timeout`` seconds: a child that hangs on its parent's client."""
    import pytest

    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child did not exit within {timeout:g} s (hung on its parent's client?)")
        time.sleep(0.05)
    return os.waitstatus_to_exitcode(done[1])


def in_a_forked_child(observe: Callable[[], object], timeout: float = 30.0) -> object:
    """What ``observe()`` returns (a Python literal) in a child forked here, or its error as
    ``"Type: message"``; the test fails if the child has not ended within ``timeout`` s."""
    import ast

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            seen = repr(observe())
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, whatever it is)
            seen = repr(f"{type(exc).__name__}: {exc}")
        os.write(write_end, seen.encode())
        os._exit(0)
    os.close(write_end)
    assert wait_for_child(pid, timeout) == 0
    with os.fdopen(read_end, "rb") as pipe:
        return ast.literal_eval(pipe.read().decode())


def run_ranks(script: str, world_size: int, *args: str, timeout: float = 300) -> list[dict[str, Any]]:
    """Run ``script`` (``python -c``, with ``args``) as ``world_size`` processes, each with
    ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT`` (a free loopback port) in its
    environment, as torch.distributed's env:// rendezvous reads them; each one's last stdout
    line, as JSON, once every one exited 0."""
    import json
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args], cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, text=True
        )
        for rank in range(world_size)
    ]
    outs = [json.loads(rank.communicate(timeout=timeout)[0].strip().splitlines()[-1]) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0] * world_size
    return outs


GC_AHEAD_S = 3600.0  # gc_ahead's clock runs this far ahead: every block written is past its grace


async def gc_ahead(client: Any, *, dry_run: bool = False) -> Any:
    """``client.gc`` on a clock an hour ahead (grace 0.3 s, 0.2 s for writes in flight): every
    block no kept blob names is collected at once, without a sleep, and the client keeps the
    default ``max_write_seconds`` (a write slowed by a busy machine is not refused)."""
    from blobsdk.ops import collect_garbage

    state = client._open
    return await collect_garbage(state.metadata, state.blocks, 0.3, 0.2, dry_run=dry_run, clock=lambda: time.time() + GC_AHEAD_S)
