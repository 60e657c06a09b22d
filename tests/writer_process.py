"""A writer in another process (a local block store's or a disk cache's), held mid-write
until the test releases it or kills it: deterministic, no sleeps."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import blobsdk
from tests.helpers import ROOT

FIRST, SECOND = b"first half, ", b"second half"

_CHILD = r"""
import asyncio, sys
from pathlib import Path

FIRST, SECOND = b"first half, ", b"second half"


def wait_for_the_test():
    print("writing", flush=True)
    sys.stdin.readline()


async def store(root, block_id):
    from blobsdk.sources import LocalBlockStore

    async with LocalBlockStore(root) as s:
        async with s.block_writer(block_id) as writer:
            await writer.write([FIRST])
            await asyncio.to_thread(wait_for_the_test)
            await writer.write([SECOND])
            await writer.commit()
    print("committed", flush=True)


async def cache(root, key):
    from blobsdk.cache import DiskCache

    c = DiskCache(root, capacity_bytes=1 << 20, min_free_ratio=0)
    write = c._files.write_parts  # the cache's file operation, replaced to pause the fill

    def paused(fd, parts):
        header, payload = parts
        write(fd, [header, payload[: len(FIRST)]])
        wait_for_the_test()
        write(fd, [payload[len(FIRST) :]])

    c._files.write_parts = paused
    async with c:
        stored = await c.put(key, FIRST + SECOND)
    print("committed" if stored else "failed", flush=True)


kind, root, name = sys.argv[1:]
asyncio.run((store if kind == "store" else cache)(Path(root), name))
"""


class WriterProcess:
    """``kind`` ("store" or "cache") writing ``name`` under ``root`` in a child process,
    paused after the first half of its bytes.  Use ``async with``: the child is killed and
    reaped on the way out."""

    def __init__(self, kind: str, root: Path, name: str) -> None:
        here = Path(blobsdk.__file__).resolve().parent.parent  # the blobsdk this test runs
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(ROOT)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, kind, str(root), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    async def __aenter__(self) -> WriterProcess:
        line = await asyncio.to_thread(self._line)
        assert line == "writing", self._stderr()
        return self

    async def __aexit__(self, *exc: object | TracebackType) -> None:
        self.kill()

    async def finish(self) -> str:
        """Let the writer go on; what it says at the end ("committed" or "failed")."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        said = await asyncio.to_thread(self._line)
        code = await asyncio.to_thread(self.proc.wait)
        assert code == 0, self._stderr()
        return said

    def kill(self) -> None:
        """SIGKILL: the writer dies holding its temp file."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().decode().strip()

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stderr is not None
        return "" if self.proc.stderr.closed else self.proc.stderr.read().decode()
