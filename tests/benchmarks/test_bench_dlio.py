"""benchmarks/dlio.py without DLIO: it skips, saying why (the run itself needs .venv-dlio)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import dlio


async def test_without_dlios_venv_the_benchmark_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlio, "DLIO_BIN", tmp_path / ".venv-dlio" / "bin")
    report = await dlio.run(quick=True)
    assert report.skipped == {"dlio": f"DLIO's venv is absent ({tmp_path / '.venv-dlio'}): `make dlio` makes it"}
    assert not report.failed and not report.metrics


def test_the_quick_run_is_a_quarter_of_the_files() -> None:
    assert [dlio.scaled(w, True).files for w in dlio.WORKLOADS] == [16, 256]
    assert [dlio.scaled(w, False).files for w in dlio.WORKLOADS] == [64, 1024]


def test_a_reader_row_lists_stand_ins_and_dlios_own_reads_the_files(tmp_path: Path) -> None:
    data = dlio.Dataset(local=tmp_path / "local", standins=tmp_path / "standins", mean_bytes=1.0)
    ours = dlio.train_args(dlio.WORKLOADS[0], data, "blobsdk.dlio.BlobReader")
    theirs = dlio.train_args(dlio.WORKLOADS[0], data, None)
    assert f"dataset.data_folder={tmp_path / 'standins'}" in ours and "reader.reader_classname=blobsdk.dlio.BlobReader" in ours
    assert f"dataset.data_folder={tmp_path / 'local'}" in theirs and not any("reader_classname" in a for a in theirs)
    assert "reader.multiprocessing_context=fork" in ours and "metric.au=0.9" in ours
