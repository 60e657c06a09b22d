"""benchmarks/scale.py and its curves: growth, the report's names, per-op timing on a fake
clock, memory by tracemalloc, and the curves at toy sizes (the real objects are measured)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from benchmarks import _scale_caches, scale
from benchmarks.__main__ import main
from benchmarks._picture import missing as missing_plot
from benchmarks._report import Report
from benchmarks._scale_curves import Curve, per_op_quantiles, traced_bytes
from benchmarks._scale_metadata import metadata_curves
from benchmarks._scale_ops import _grow, _MemoryBlocks, block_id, ops_curves
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.ops import collect_garbage, scrub


def test_a_rate_grows_worse_as_it_falls() -> None:
    assert Curve("sqlite", "commits_per_s", "paths per second", {10: 9000.0, 1000: 3000.0}, higher_is_better=True).growth() == 3.0


def test_a_curve_reports_its_points_and_its_growth_against_the_goal() -> None:
    curve = Curve("tracker", "locate_p50", "µs per call", {100: 30.0, 1000: 33.0, 10_000: 60.0})
    assert curve.growth() == 2.0
    report = Report("scale")
    curve.add_to(report)
    assert report.metrics == {
        "tracker_locate_p50_at_1e2": 30.0,
        "tracker_locate_p50_at_1e3": 33.0,
        "tracker_locate_p50_at_1e4": 60.0,
    }
    assert report.ratios == {"tracker_locate_p50_growth": 2.0}
    assert report.goals == {"tracker_locate_p50_growth": "<= 1.5 (x100 size)"}
    assert report.details["curves"][0]["points"] == curve.points


def test_per_op_quantiles_time_batches_by_the_clock_given() -> None:
    now = [0.0]
    cost = {i: (1.0 if i < 8 else 9.0) for i in range(10)}  # two slow calls, in the last batch

    def op(i: int) -> None:
        now[0] += cost[i]

    p50, p99 = per_op_quantiles(op, 10, batch=2, clock=lambda: now[0])
    assert (p50, p99) == (1.0, 9.0)


def test_traced_bytes_sees_what_the_block_keeps() -> None:
    with traced_bytes() as held:
        kept = bytearray(1 << 20)
    assert (1 << 20) <= held() < (1 << 20) + 4096
    del kept


def test_the_tracker_and_plan_cache_curves_measure_each_size() -> None:
    swarm = scale.tracker_swarm(range(1, 3), probes=20)
    assert [sorted(c.points) for c in swarm] == [[10, 100], [10, 100]] and all(v > 0 for v in swarm[0].points.values())
    entries = scale.tracker_entries(range(2, 4), peers=10)
    assert [c.name for c in entries] == ["tracker_entry", "tracker_locate_key", "tracker_announce_key"]
    assert sorted(entries[0].points) == [100, 1000] and entries[0].points[1000] > 100  # a (peer, key) entry costs bytes
    cache = _scale_caches.plan_cache(range(2, 4), lookups=100)
    assert [c.name for c in cache] == ["plan_cache_entry", "plan_cache_lookup_p50", "floor_dict_lookup_p50"]
    assert sorted(cache[0].points) == [100, 1000] and cache[0].points[100] > 200  # a plan and its entry


async def test_the_metadata_curves_measure_every_path_at_each_size(tmp_path: Path) -> None:
    curves, listing = await metadata_curves(range(2, 3), tmp_path, beyond=range(3, 4))
    names = {c.name for c in curves}
    for path in ("sqlite", "redis", "api"):
        assert {f"{path}_lookup_p50", f"{path}_lookup_p99", f"{path}_batch_ms"} <= names
        assert listing[f"{path}_list_1e5_ms"] > 0
    assert {"sqlite_commits_per_s", "sqlite_bytes_per_path", "redis_bytes_per_path", "floor_redis_hget_lookup_p50"} <= names
    for curve in curves:  # SQLite and the API server over it go a size beyond Redis
        assert sorted(curve.points) == ([100] if curve.component in ("redis", "floor_redis_hget") else [100, 1000]), curve.name


async def test_the_ops_curves_run_gc_scrub_and_repair_at_each_size(tmp_path: Path) -> None:
    curves = await ops_curves(range(2, 4), tmp_path)
    names = ["repair_batch_ms", "repair_walk_batch_ms", "gc_us_per_block", "gc_peak_bytes_per_block", "scrub_us_per_block"]
    assert [c.name for c in curves] == names and all(sorted(c.points) == [100, 1000] for c in curves)
    assert all(v > 0 for v in curves[3].points.values())  # a pass holds memory per block


async def test_the_benchmark_s_block_store_is_what_gc_and_scrub_expect() -> None:
    """gc deletes only the garbage; scrub verifies every live block and finds none bad."""
    blocks = _MemoryBlocks()
    with tempfile.TemporaryDirectory() as tmp:
        async with SqliteMetadataStore(Path(tmp) / "m.sqlite") as metadata:
            await _grow(metadata, blocks, 0, 100)
            assert len(blocks.blocks) == 110
            report = await collect_garbage(metadata, blocks, 3600.0, 600.0)
            assert (report.blocks_scanned, report.blocks_deleted) == (110, 10) and len(blocks.blocks) == 100
            scrubbed = await scrub(metadata, blocks, dry_run=True)
            assert scrubbed.ok and scrubbed.blocks_checked == 100 and scrubbed.copies_bad == 0
            blocks.blocks[block_id(5)] = b"x" * 64
            assert (await scrub(metadata, blocks, dry_run=True)).copies_bad == 1


async def test_the_disk_cache_curve_restarts_with_and_without_the_index_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    restarts: dict[int, float] = {}
    curves = await _scale_caches.disk_cache(range(2, 4), hits=20, report_s=restarts)
    names = ["l2_open_scan_us", "l2_open_index_us", "l2_reconcile_us", "l2_index_entry", "l2_hit_p50"]
    names += ["l2_open_index_cpu_us", "l2_hit_warm_p50"]
    assert [c.name for c in curves] == names and all(sorted(c.points) == [100, 1000] for c in curves)
    assert sorted(restarts) == [100, 1000] and restarts[100] == pytest.approx(curves[1].points[100] * 100 / 1e6)
    assert os.listdir(tmp_path) == []  # its directories are removed


async def test_the_shared_plan_cache_curve_hits_at_each_size(tmp_path: Path) -> None:
    curves = await _scale_caches.shared_plan_cache(range(2, 4), tmp_path, lookups=20)
    names = ["shared_plan_cache_lookup_p50", "shared_plan_cache_lookup_p99", "shared_plan_cache_entry", "floor_redis_get_p50"]
    assert [c.name for c in curves] == names and all(sorted(c.points) == [100, 1000] for c in curves)
    assert curves[2].points[1000] > 100  # a plan and its key in Redis


async def test_the_flash_node_curve_restarts_hits_and_churns_at_each_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    curves = await _scale_caches.flash_node(range(2, 4), hits=20, churn=30)
    churns = [f"l3_{p}churn_{f}" for p in ("", "pinned_") for f in ("put_p50", "put_p99", "loop_cpu")]
    assert [c.name for c in curves] == ["l3_restart_us", "l3_index_entry", "l3_hit_p50", *churns, "l3_restart_cpu_us"]
    assert all(sorted(c.points) == [100, 1000] and min(c.points.values()) > 0 for c in curves)
    assert os.listdir(tmp_path) == []


async def test_the_held_puts_curve_churns_a_full_cache_with_and_without_a_hold_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    curves = await _scale_caches.held_puts(range(2, 4), churn=30)
    assert [c.name for c in curves] == ["l2_held_put_p50", "l2_held_put_p99", "l2_held_loop_cpu", "l2_unheld_loop_cpu"]
    assert all(sorted(c.points) == [100, 1000] and min(c.points.values()) > 0 for c in curves)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [["--png", "x.png"], []])
def test_the_command_writes_json_and_a_png_next_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    for name in ("tracker_swarm", "tracker_entries", "plan_cache"):
        points = lambda exponents, name=name, **_: [Curve(name, "f", "µs", {10**e: float(e) for e in exponents})]  # noqa: E731
        monkeypatch.setattr(scale, name, points)

    async def disk(exponents: range, report_s: dict[int, float]) -> list[Curve]:
        report_s[1000] = 0.5
        return [Curve("disk", "f", "s", {10**e: float(e) for e in exponents})]

    monkeypatch.setattr(scale, "disk_cache", disk)

    async def shared(exponents: range, root: Path) -> list[Curve]:
        return [Curve("shared", "f", "µs", {10**e: float(e) for e in exponents})]

    async def flash(exponents: range) -> list[Curve]:
        return [Curve("flash", "f", "s", {10**e: float(e) for e in exponents})]

    async def held(exponents: range) -> list[Curve]:
        return [Curve("held", "f", "µs", {10**e: float(e) for e in exponents})]

    monkeypatch.setattr(scale, "shared_plan_cache", shared)
    monkeypatch.setattr(scale, "flash_node", flash)
    monkeypatch.setattr(scale, "held_puts", held)

    async def stores(exponents: range, root: Path, beyond: range) -> tuple[list[Curve], dict[str, float]]:
        assert not beyond  # --quick
        return [Curve("meta", "f", "µs", {10**e: float(e) for e in exponents})], {"meta_list_1e5_ms": 1.0}

    monkeypatch.setattr(scale, "metadata_curves", stores)

    async def ops(exponents: range, root: Path) -> list[Curve]:
        return [Curve("ops", "f", "µs", {10**e: float(e) for e in exponents})]

    monkeypatch.setattr(scale, "ops_curves", ops)
    monkeypatch.chdir(tmp_path)
    assert main(["scale", "--quick", "--json", "out.json", *args]) == 0
    written = json.loads((tmp_path / "out.json").read_text())
    ratios = written["ratios"]
    assert written["metrics"]["l2_open_index_s_at_1e3"] == 0.5 and written["metrics"]["meta_list_1e5_ms"] == 1.0
    assert ratios == {
        "tracker_swarm_f_growth": 3 / 2,
        "tracker_entries_f_growth": 5 / 4,
        "plan_cache_f_growth": 5 / 3,
        "shared_f_growth": 5 / 3,
        "disk_f_growth": 5 / 3,
        "flash_f_growth": 4 / 3,
        "held_f_growth": 4 / 3,
        "meta_f_growth": 5 / 3,
        "ops_f_growth": 5 / 4,
    }  # quick sizes
    png = tmp_path / ("x.png" if args else "out.png")
    if missing_plot() is None:
        assert png.stat().st_size > 1000
    else:
        assert not png.exists() and json.loads((tmp_path / "out.json").read_text())["skipped"] == {"png": missing_plot()}
