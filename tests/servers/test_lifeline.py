"""servers/_common/lifeline.py: a third-party server started under the lifeline stops with the
process that started it, whatever that process forked.  (The cluster's own servers, started
through the pytest plugin: tests/servers/test_testing.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from servers._common.lifeline import wait_orphaned
from tests.helpers import ROOT
from tests.servers.test_cluster import _alive as running
from tests.servers.test_cluster import _wait_for

STARTER = textwrap.dedent(
    """
    import json, multiprocessing, signal, socket, sys
    from pathlib import Path
    from servers._common.lifeline import LocalService

    class Listener(LocalService):
        def command(self, port):
            serve = f"import signal, socket; s = socket.create_server(('127.0.0.1', {port})); signal.pause()"
            return [sys.executable, "-c", serve]

        def answers(self, port):
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

    service = Listener(Path(sys.argv[1]))
    service.start()
    pid = service.process.pid
    (server,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    child = multiprocessing.get_context("fork").Process(target=signal.pause, daemon=True)  # lives on
    child.start()
    print(json.dumps({"lifeline": pid, "server": int(server), "child": child.pid}), flush=True)
    signal.pause()  # killed here
    """
)


def test_a_service_stops_with_its_starter_while_a_process_it_forked_lives_on(tmp_path):
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    pids: dict[str, int] = {}
    try:
        pids = json.loads(starter.stdout.readline() or "{}")
        assert sorted(pids) == ["child", "lifeline", "server"] and all(running(pid) for pid in pids.values())
        starter.kill()
        starter.wait()
        _wait_for(lambda: not running(pids["lifeline"]) and not running(pids["server"]), 30, "the service to stop")
        assert running(pids["child"])  # it still holds the lifeline's write end: the service did not wait for it
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "parent-pid"])
def test_an_orphan_sees_its_starter_gone_while_its_lifeline_is_held(monkeypatch: pytest.MonkeyPatch, pidfds: bool) -> None:
    """Without pidfds (not Linux, an old kernel) the parent pid tells it.  Every process here
    holds the lifeline's write end, the orphan too: only the starter's death can end the wait."""
    if not pidfds:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    lifeline, held = os.pipe()
    report, told = os.pipe()
    starter = os.fork()
    if starter == 0:
        me = os.getpid()
        if os.fork() == 0:  # the server
            try:
                wait_orphaned(lifeline, me)
                os.write(told, b"orphaned")
            finally:
                os._exit(0)
        os._exit(0)  # the starter dies at once
    try:
        os.waitpid(starter, 0)
        assert select.select([report], [], [], 30)[0] == [report]  # a failure guard: the orphan says so within PARENT_POLL_S
        assert os.read(report, 8) == b"orphaned"
    finally:
        for fd in (lifeline, held, report, told):
            os.close(fd)
