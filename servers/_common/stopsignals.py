"""SIGINT and SIGTERM as a request to stop, for the commands that run until one comes
(``blobsdk-cluster``, ``python -m servers.testbed up|flap``), also when their ``main`` is
called in a process of someone else's (a test, a notebook).

    with stop_signals(Shutdown) as stopping:
        try:
            work()                    # a signal raises Shutdown(signal name) here
        except Shutdown:
            pass
        finally:
            stopping.ignore()         # a second signal must not interrupt the clean-up
            clean_up()

The handlers the process had before are put back on leaving, so the process is left as it
was: a later child it starts (it inherits ignored signals across ``exec``) still dies of
SIGTERM.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopping:
    """What the body of :func:`stop_signals` may do with the signals meanwhile."""

    def ignore(self) -> None:
        """Ignore both signals until the block ends (while cleaning up)."""
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextmanager
def stop_signals(raise_: Callable[[str], BaseException]) -> Iterator[Stopping]:
    """Within the block, SIGINT and SIGTERM raise ``raise_(name)``; on leaving, the previous
    handlers are restored."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise raise_(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    try:
        yield Stopping()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
