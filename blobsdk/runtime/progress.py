"""The one-line progress report of long ingests (``blobsdk import``, ``blobsdk demo``)."""

from __future__ import annotations

import time
from typing import IO

MiB = 1 << 20


class ProgressLine:
    """``files, MiB, MiB/s`` on one stderr line: rewritten in place on a TTY (at most 10
    times a second), else printed every few seconds."""

    def __init__(self, stream: IO[str], interval: float | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval if interval is not None else (0.1 if self.tty else 5.0)
        self.start = self.last = time.monotonic()
        self.blobs = self.nbytes = 0

    def update(self, blobs: int, nbytes: int) -> None:
        self.blobs, self.nbytes = blobs, nbytes
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._emit(final=False)

    def note(self, message: str) -> None:
        """Print a message on its own line, without mangling the progress line."""
        self.stream.write(("\r\x1b[K" if self.tty else "") + message + "\n")
        self.stream.flush()

    def finish(self) -> None:
        self._emit(final=True)

    def clear(self) -> None:
        """End without a final line (the caller reports the totals itself): a TTY's line is
        erased; elsewhere the lines printed so far stay."""
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def text(self) -> str:
        seconds = max(time.monotonic() - self.start, 1e-9)
        mib = self.nbytes / MiB
        return f"{self.blobs} files, {mib:.1f} MiB, {mib / seconds:.1f} MiB/s"

    def _emit(self, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + self.text() + ("\n" if final else ""))
        else:
            self.stream.write(self.text() + "\n")
        self.stream.flush()
