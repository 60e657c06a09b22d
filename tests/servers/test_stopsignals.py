"""servers/_common/stopsignals.py: SIGINT and SIGTERM stop a command's loop, and the process
is left with the handlers it had."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from servers._common.stopsignals import stop_signals


class Stop(Exception):
    pass


def test_a_signal_raises_inside_and_the_previous_handlers_come_back() -> None:
    before = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    with stop_signals(Stop), pytest.raises(Stop) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next statement
    assert str(stopped.value) == "SIGTERM"
    assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == before


def test_ignored_while_cleaning_up_and_a_later_child_still_dies_of_sigterm() -> None:
    with stop_signals(Stop) as stopping:
        stopping.ignore()
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing raised
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.terminate()
    assert child.wait(timeout=30) == -signal.SIGTERM
