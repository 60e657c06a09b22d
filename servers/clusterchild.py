"""What runs first inside each server process of a local cluster (servers/cluster.py starts
every server as ``python -c "...serve_child()" FD STARTER MODULE FLAGS``): the server's module,
stopped once its starter is gone (servers/_common/lifeline.py).  Kept apart from the cluster
so a server imports only this and its own module."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import threading
import time
from typing import NoReturn

from ._common.lifeline import wait_orphaned

ORPHAN_GRACE_SECONDS = 5.0  # an orphaned server that has not stopped on SIGTERM by then exits hard


def serve_child() -> None:
    """Run ``python -m MODULE FLAGS`` in this process (``sys.argv[1:]`` is the lifeline's
    fd, the starter's pid, MODULE, FLAGS) and stop it once it is orphaned."""
    fd, starter, module, *flags = sys.argv[1:]
    threading.Thread(target=_stop_when_orphaned, args=(int(fd), int(starter)), name="lifeline", daemon=True).start()
    sys.argv = [module, *flags]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _stop_when_orphaned(fd: int, starter: int) -> NoReturn:
    """Once the starter is gone (already gone, if it died before we got here) or the lifeline
    reached EOF, stop the server gracefully, and for good after ORPHAN_GRACE_SECONDS."""
    with contextlib.suppress(OSError):  # a bad fd: stopping is the safe side
        wait_orphaned(fd, starter)
    os.kill(os.getpid(), signal.SIGTERM)  # the server's own graceful stop
    time.sleep(ORPHAN_GRACE_SECONDS)
    os._exit(1)
