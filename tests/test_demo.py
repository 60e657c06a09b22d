"""blobsdk.demo: the synthetic dataset and the ingest / epoch / verify run."""

from __future__ import annotations

import io

from blobsdk.client import Client
from blobsdk.demo import MAX_SAMPLE, MIN_SAMPLE, MiB, make_dataset, run_demo


def test_dataset_is_deterministic_mixed_and_sized():
    samples = make_dataset(20)
    assert samples == make_dataset(20) and samples != make_dataset(20, seed=1)
    assert sum(s.size for s in samples) == 20 * MiB
    assert all(MIN_SAMPLE <= s.size <= MAX_SAMPLE for s in samples[:-1])
    assert {s.text for s in samples} == {True, False}
    assert samples[3].generate() == samples[3].generate()


async def test_demo_verifies_every_sample(tmp_path):
    out = io.StringIO()
    report = await run_demo(tmp_path / "store", size_mb=8, out=out)
    assert report.ok, report.problems
    assert report.samples > 8 and report.verified == 3 * report.samples and not report.mismatched
    cold, warm, restart = report.epochs
    chunks = cold.served["l4"]
    assert chunks >= report.samples and cold.served["l1"] == cold.served["l2"] == 0
    assert warm.served == {"l1": chunks, "l2": 0, "l4": 0}  # the embedded store has no peers and no L3
    assert restart.served == {"l1": 0, "l2": chunks, "l4": 0}
    assert report.ranged_total > 0 and report.ranged_ok == report.ranged_total
    assert report.logical_bytes == 8 * MiB and 0 < report.stored_bytes < report.logical_bytes  # text-like compresses
    assert report.stats["l2"]["hits"] == chunks
    assert "OK: every byte verified" in out.getvalue()


async def test_demo_report_says_each_thing_once_with_the_store_s_tiers(tmp_path):
    out = io.StringIO()
    report = await run_demo(tmp_path / "store", size_mb=2, out=out)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines if "MiB/s" in line and not line.startswith("  ")] == ["ingest"]
    header = next(line for line in lines if line.lstrip().startswith("epoch "))
    assert header.split() == ["epoch", "seconds", "MiB/s", "samples/s", "l1", "l2", "l4"]
    stats = lines.index("stats of the restart client (its one epoch; the first client's reads are in the table above):")
    assert [line.split(":")[0] for line in lines[stats + 1 : -1]] == ["  l1", "  l2", "  l4", "  plan"]
    assert lines[-1] == "OK: every byte verified" and report.ok


async def test_demo_on_a_terminal_erases_its_progress_line(tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(out, "isatty", lambda: True)
    await run_demo(tmp_path / "store", size_mb=1, out=out)
    text = out.getvalue()
    shown = [line.rsplit("\r\x1b[K", 1)[-1] for line in text.split("\n")]  # what the terminal keeps
    assert "\r\x1b[K" in text and not [line for line in shown if " files, " in line]
    assert [line.split(":")[0] for line in shown if "MiB/s" in line and not line.startswith("  ")] == ["ingest"]


async def test_demo_removes_its_temporary_store(tmp_path):
    report = await run_demo(None, size_mb=1, out=io.StringIO())
    assert report.ok and not report.dir.exists()


async def test_demo_reports_a_wrong_byte(tmp_path, monkeypatch):
    real_get = Client.get

    async def flip_one(self, path, offset=0, length=None):
        data = await real_get(self, path, offset, length)
        if path.endswith("sample-000002.bin") and offset == 0 and length is None:
            data[100] ^= 1
        return data

    monkeypatch.setattr(Client, "get", flip_one)
    out = io.StringIO()
    report = await run_demo(tmp_path / "store", size_mb=2, out=out)
    assert not report.ok and report.mismatched == ["/demo/train/sample-000002.bin"] * 3  # once per epoch
    assert report.verified == 3 * (report.samples - 1) and "FAILED" in out.getvalue()
