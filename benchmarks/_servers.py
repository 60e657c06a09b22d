"""Start blobsdk servers as separate processes for a benchmark (as in production)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def server(module: str, args: Sequence[str], dir: Path, timeout: float = 30.0) -> Iterator[str]:
    """``python -m module --port 0 --port-file F *args`` until the block exits; yields its URL."""
    dir.mkdir(parents=True, exist_ok=True)
    port_file = dir / f"{module}-{time.monotonic_ns()}.port"
    argv = [sys.executable, "-m", module, "--port", "0", "--port-file", str(port_file), *args]
    with open(dir / f"{port_file.stem}.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + timeout
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{module} did not start; see {log.name}")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{port_file.read_text()}"
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def block_servers(dir: Path, per_server_args: Sequence[Sequence[str]]) -> Iterator[list[str]]:
    """One block server per entry of ``per_server_args`` (its extra flags)."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(server("servers.blockstore", ["--dir", str(dir / f"blocks-{i}"), *args], dir))
            for i, args in enumerate(per_server_args)
        ]


@contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ`` (for clients that read only the environment, and for
    the processes a row forks), put back as they were afterwards."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
