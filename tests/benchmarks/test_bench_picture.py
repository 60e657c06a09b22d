"""Every benchmark that draws a picture draws it through benchmarks/_picture.py, which without
matplotlib (the ``bench`` extra) draws nothing, raises nothing, and says so in the report."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import _picture, ingest, swarm_sim
from benchmarks._ingest_workload import QUICK
from benchmarks._report import Report
from tests.helpers import ROOT

NOTE = f"matplotlib not installed: no picture (pip install -e '{ROOT}[bench]')"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here to the test's end, matplotlib is not installed (whether or not it is)."""
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError


def _never(plt: Any) -> Any:
    raise AssertionError("the figure is drawn only with matplotlib")


@pytest.mark.usefixtures("no_matplotlib")
def test_without_matplotlib_the_helper_notes_it_and_draws_nothing(tmp_path: Path):
    report = Report("x")
    assert _picture.draw(report, tmp_path / "out" / "x.png", _never) is False
    assert report.skipped == {"png": NOTE} and _picture.missing() == NOTE
    assert "png" not in report.details and not (tmp_path / "out").exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_without_matplotlib_each_benchmarks_picture_is_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    drawn = {"swarm_sim": Report("swarm_sim"), "ingest": Report("ingest")}
    swarm_sim.picture(drawn["swarm_sim"], {}, tmp_path / "swarm_sim.png")
    ingest.picture(drawn["ingest"], {}, tmp_path / "ingest.png", QUICK)
    assert {name: report.skipped for name, report in drawn.items()} == {name: {"png": NOTE} for name in drawn}
    assert list(tmp_path.iterdir()) == []
    assert f"no picture: {NOTE}\n" in capsys.readouterr().out


def _imports_matplotlib(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(name.split(".")[0] == "matplotlib" for name in names):
            return True
    return False


def test_only_the_helper_imports_matplotlib():
    importers = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if _imports_matplotlib(p))
    assert importers == ["_picture.py"]
