"""A process SIGKILLed in the middle of put leaves the previous version intact."""

import os
import signal
import subprocess
import sys
import time

import pytest

import blobsdk
from tests.helpers import ROOT

WRITER = r"""
import asyncio, sys
import blobsdk
from blobsdk.config import WriteConfig

async def main(root):
    cfg = WriteConfig(chunk_size=256 << 10, block_size=1 << 20, parallel_blocks=2)
    async with blobsdk.Client.local(root, write=cfg) as c:
        await c.put("/b/x", b"old" * 100_000)
        print("ready", flush=True)
        await c.put("/b/x", bytes(range(256)) * (256 * 1024))  # 64 MiB in 64 blocks
        print("done", flush=True)

asyncio.run(main(sys.argv[1]))
"""

OLD = b"old" * 100_000
NEW = bytes(range(256)) * (256 * 1024)


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
async def test_sigkill_mid_put_keeps_previous_version(tmp_path, delay):
    proc = subprocess.Popen(  # noqa: ASYNC220 - the child, not the loop, is under test: nothing else runs
        [sys.executable, "-c", WRITER, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.readline() == b"ready\n"
    time.sleep(delay)  # noqa: ASYNC251 - a precise pause before the kill; nothing else runs
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait()
    proc.stdout.close()
    async with blobsdk.Client.local(tmp_path) as c:
        data = await c.get("/b/x")
        info = await c.stat("/b/x")
    # Either the kill landed before the commit (old version, byte-identical) or after it
    # (new version, whole): never anything in between.
    if info.version == 1:
        assert data == OLD
    else:
        assert (info.version, data) == (2, NEW)
    assert rest in (b"", b"done\n")
