"""Test helpers: run an aiohttp app in-loop on a free loopback port, or a server as a real
subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from aiohttp import web

from servers._common.limits import ServerLimits, serving

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def running_app(app: web.Application, limits: ServerLimits | None = None) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1:0 in this loop, as ``serve`` does (with ``limits``); yield
    its base URL."""
    async with serving(app, "127.0.0.1", 0, limits) as port:
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
