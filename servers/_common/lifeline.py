"""Third-party servers started for tests and benchmarks (redis-server, moto): a free port to
give them, and a lifeline that kills them with the process that started them.

Our own servers read their lifeline pipe themselves (servers/cluster.py); a program that
cannot runs under :data:`LIFELINE`, a small Python parent that kills it once its stdin (the
pipe whose write end only the starter holds) reaches EOF: when the starter exits or dies,
even by SIGKILL.
"""

from __future__ import annotations

import socket

LIFELINE = """
import os, subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:])
def watch():
    os.read(0, 1)  # EOF once the starter is gone
    child.kill()
threading.Thread(target=watch, daemon=True).start()
sys.exit(child.wait())
"""


def free_port() -> int:
    """A loopback port free a moment ago: for a server that cannot bind port 0 itself (a
    caller retries with another if it was taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
