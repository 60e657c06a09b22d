"""The benchmarks' pictures (matplotlib, of the ``bench`` extra), every one drawn through
:func:`draw`: without matplotlib a benchmark still runs and reports all its figures, and its
report's skipped rows say that no picture was drawn and what to install."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from blobsdk._extras import pip_install

from ._report import Report

DPI = 110


def missing() -> str | None:
    """Why no picture can be drawn here, or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"matplotlib not installed: no picture ({pip_install('bench')})"
    return None


def draw(report: Report, path: Path, figure: Callable[[Any], Any]) -> bool:
    """Save ``figure(pyplot)`` (it returns the figure it drew) as ``path``, named in the
    report's details; without matplotlib, the note in ``report.skipped["png"]`` instead and
    ``figure`` is not called.  True if drawn."""
    why = missing()
    if why is not None:
        report.skipped["png"] = why
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    fig = figure(plt)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    report.details["png"] = str(path)
    return True
