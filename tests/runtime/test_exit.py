"""A client kept for the process's life still closes (and works) at interpreter exit: from an
``atexit`` handler, and by the exit finalizer of a dataset nobody closed.

Python stops every ``ThreadPoolExecutor``'s workers in threading's exit hook, which runs
before ``atexit`` handlers and ``multiprocessing``'s finalizers, and Python 3.12 starts no new
thread from then on; blobsdk/runtime/forksafe.py's ``Executor`` then runs a job in the thread
that submits it.  Each case runs in a process of its own, which must exit 0 with nothing on
stderr (an exception in an exit handler is printed there, and the exit code stays 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blobsdk.runtime.forksafe import Executor
from tests.helpers import ROOT

SYNC_CLIENT_CLOSED_AT_EXIT = """
import atexit, sys
import blobsdk

root = sys.argv[1]
client = blobsdk.SyncClient.local(root, l2=blobsdk.L2Config(dir=root + "/l2"))
client.__enter__()
client.put("/b/kept", b"kept" * 100_000)
assert bytes(client.get("/b/kept")) == b"kept" * 100_000


def last_words():
    client.put("/b/last", b"last" * 100_000)  # a client kept for the process's life is used here too
    assert bytes(client.get("/b/last")) == b"last" * 100_000
    client.close()
    print("closed")


atexit.register(last_words)
"""

DATASET_LEFT_OPEN = """
import sys
import blobsdk
from blobsdk.torch import BlobDataset

root = sys.argv[1]
with blobsdk.SyncClient.local(root) as client:
    client.put("/b/x", b"x" * 100_000)
dataset = BlobDataset.local(root, ["/b/x"])
assert dataset[0][0] == "/b/x"
print("left open")
"""


def run(script: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, str(root)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("script", "said"),
    [
        pytest.param(SYNC_CLIENT_CLOSED_AT_EXIT, "closed\n", id="sync-client-closed-by-atexit"),
        pytest.param(DATASET_LEFT_OPEN, "left open\n", id="dataset-closed-by-its-exit-finalizer"),
    ],
)
def test_a_client_closes_cleanly_at_interpreter_exit(tmp_path: Path, script: str, said: str) -> None:
    done = run(script, tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", said)


def test_an_executor_shut_down_by_its_owner_still_refuses_work() -> None:
    """Only the interpreter's exit makes a refused job run in the submitting thread."""
    executor = Executor(max_workers=1)
    assert executor.submit(lambda: 1).result() == 1
    executor.shutdown()
    with pytest.raises(RuntimeError, match=r"^cannot schedule new futures after shutdown$"):
        executor.submit(lambda: 2)
    assert executor.wait_idle(0)  # the refused job is not counted in flight
