"""One log format for every server process and the cluster, through ``logging``:

    2026-12-02T14:20:01.123Z INFO blockstore[4242] servers.http: serving on http://127.0.0.1:40123

(UTC time to the millisecond, level, the process's role and pid, the logger, the message).
Each server's ``main`` calls :func:`setup_logging` once, before it serves; ``--log-level``
(:func:`add_log_args`, in every server's flags) sets the threshold.  Library code only ever
asks for ``logging.getLogger(__name__)``; configuring handlers is a process's ``main``'s job.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def formatter(role: str) -> logging.Formatter:
    """The shared format, naming ``role`` (``blockstore``, ``cluster``...) on every line."""
    fmt = f"%(asctime)s.%(msecs)03dZ %(levelname)s {role.replace('%', '%%')}[%(process)d] %(name)s: %(message)s"
    out = logging.Formatter(fmt, DATE_FORMAT)
    out.converter = time.gmtime
    return out


def setup_logging(role: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send this process's log records of ``level`` and above to ``stream`` (default: stderr,
    which the cluster writes to the server's log file) in the shared format."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter(role))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def add_log_args(parser: Any) -> None:
    parser.add_argument("--log-level", default="INFO", choices=LEVELS, help="log records of this level and above (default INFO)")
