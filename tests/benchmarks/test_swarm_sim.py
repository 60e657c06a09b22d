"""The swarm simulator (benchmarks/_swarm_model.py, benchmarks/swarm_sim.py) at tiny sizes:
its loop, exact times in a 3-host swarm, fail-over from a dead source, a stale source list
asked for again, and the real tracker being the one it drives.  Everything runs on the simulated clock (no machine speed)."""

from __future__ import annotations

import gc
import itertools
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import swarm_sim
from benchmarks._report import Report
from benchmarks._swarm_loop import Link, Loop, Metered, Network, replay
from benchmarks._swarm_model import Params, Swarm
from servers.tracker_rules import Tracker, TrackerConfig
from tests.helpers import ROOT

RTT = 0.004
# 3 hosts, 2 chunks of 1 MB, every link and the origin 1 MB/s: every time is exact.
TINY = Params(
    hosts=3,
    blob_bytes=2_000_000,
    chunk_bytes=1_000_000,
    down_Bps=1e6,
    up_Bps=1e6,
    origin_Bps=1e6,
    rtt_s=RTT,
    readahead=2,
    budget_bytes=10_000_000,
    sndbuf_bytes=1_000_000,
)


def test_the_loop_runs_events_in_time_order_and_ties_in_the_order_scheduled() -> None:
    loop, ran = Loop(), []
    for when, name in ((2.0, "c"), (1.0, "a"), (1.0, "b"), (0.5, "first")):
        loop.at(when, lambda n=name: ran.append((loop.now, n)))
    loop.at(3.0, lambda: loop.after(1.0, ran.append, (loop.now, "later")))
    loop.run(until=3.5)
    assert ran == [(0.5, "first"), (1.0, "a"), (1.0, "b"), (2.0, "c")]
    loop.run()
    assert ran[-1] == (3.0, "later") and loop.now == 4.0 and loop.events == 6


def test_flows_share_a_link_equally_and_speed_up_when_one_ends() -> None:
    loop, arrived = Loop(), []
    net = Network(loop)
    up, a, b = Link(2.0), Link(100.0), Link(100.0)
    net.start(up, a, 2.0, lambda: arrived.append(("a", loop.now)))  # 1 B/s while b runs
    net.start(up, b, 6.0, lambda: arrived.append(("b", loop.now)))  # 1 B/s, then 2 B/s
    loop.run()
    assert arrived == [("a", 2.0), ("b", 4.0)]


def test_the_collectors_passes_inside_a_tracker_call_are_counted_apart_from_its_cpu() -> None:
    """A collector's pass that an allocation trips inside a call walks the whole process's
    heap (in the simulation, mostly the simulator's), so the meter keeps it out of the call's
    CPU (issue 27).  The meter's clock reads 0, 1, 2, ...: one tick per read."""
    ticks = itertools.count()
    meter = Metered(clock=lambda: float(next(ticks)))
    with meter.watching_gc():
        meter.call("locate", gc.collect)  # reads: call 0, pass 1 to 2, call 3
        meter.call("hello", lambda: None)  # 4, 5
        gc.collect()  # outside a call: not read
    meter.call("announce", gc.collect)  # not watched: the pass counts in the call, 6 to 7
    assert gc.callbacks.count(meter._on_gc) == 0
    assert meter.gc_s == 1.0  # the pass inside "locate"
    assert meter.cpu_s == 2.0 + 1.0 + 1.0  # locate 3 - 1 of the pass, hello 1, announce 1
    assert meter.calls == {"locate": 1, "hello": 1, "announce": 1}


def test_a_replay_makes_the_recorded_calls_again_with_the_same_decisions() -> None:
    """The tracker's CPU alone: the sim's calls again on a fresh tracker, which decides the
    same (the clock and wall are the recorded ones), the rest of the process frozen out of
    the collector meanwhile, and thawed after."""
    params = replace(TINY, die_fraction=1 / 3, die_window_s=(1.0, 1.0), timeout_s=1.0, seed=3, record=True)
    swarm = Swarm(params)
    result = swarm.run()
    assert len(result.tracker.log) == result.tracker.total and Swarm(TINY).meter.log == []  # recorded only if asked
    tracker, alone = replay(params.tracker, result.tracker.log)
    assert alone.calls == result.tracker.calls
    assert tracker.counts == swarm.tracker.counts and tracker.counts["reports_failed"] > 0
    assert tracker.peer_count() == swarm.tracker.peer_count() and gc.get_freeze_count() == 0


def test_a_tiny_swarm_finishes_at_exact_times_with_one_origin_fetch_per_chunk() -> None:
    swarm = Swarm(TINY)
    tracker = swarm.tracker
    assert type(tracker) is Tracker  # the real one, on the loop's clock
    result = swarm.run()
    # host 0: its 2 chunks from the origin (1.5 RTT to start, 2 flows of 0.5 MB/s, 2 s, half an
    # RTT back); hosts 1 and 2 waited for them at host 0, then its up link sent 4 flows at
    # 0.25 MB/s: 4 s more.
    assert sorted(result.completion_s) == pytest.approx([2 + 2 * RTT, 6 + 2.5 * RTT, 6 + 2.5 * RTT], rel=1e-12)
    assert result.origin_chunks == 2 and result.origin_bytes == TINY.blob_bytes
    assert result.peer_chunks == 4 and result.problems == {"no_source": 2}
    # the real tracker decided it: one locate per host (its 2 chunks in one request)
    assert result.tracker.calls["locate"] == 3 and result.tracker.calls["hello"] == 6  # heartbeats at 0 and 5 s
    assert tracker.counts["located_origin"] == 2 and tracker.counts["located_peer"] == 4
    assert result.tracker.cpu_s >= 0 and result.tracker.gc_s >= 0


def test_the_children_of_a_dead_source_fail_over_and_the_tracker_forgets_it() -> None:
    # one stripe: host 0, the first fetcher, is every later asker's first source
    params = replace(TINY, die_fraction=1 / 3, die_window_s=(1.0, 1.0), timeout_s=1.0, seed=3, tracker=TrackerConfig(stripes=1))
    swarm = Swarm(params)
    dead = [h for h in swarm.hosts if any(e[2] == swarm._die and e[3] == (h,) for e in swarm.loop._heap)]
    assert [h.index for h in dead] == [0]  # seed 3 kills host 0, the first fetcher of both chunks
    result = swarm.run()
    assert result.died == 1 and len(result.completion_s) == 2
    # silent from t=1: its children wait timeout_s, report it failed (2 children x 2 chunks)
    assert swarm.tracker.counts["reports_failed"] == 4 and result.problems["failed"] == 4
    # host 1 had only host 0: the origin; host 2 fails over to host 1, its next source
    assert result.origin_chunks == 4 and result.peer_chunks == 2
    assert math.isnan(dead[0].done) and not dead[0].alive
    assert swarm.tracker.peer_count() == 3  # it is still registered ...
    swarm.loop.run(until=swarm.loop.now + TrackerConfig().peer_ttl_s + 1.5)
    assert swarm.tracker.peer_count() == 2 and swarm.tracker.counts["peers_expired"] == 1  # ... until its TTL


def test_a_fetch_whose_sources_went_stale_asks_again_instead_of_reading_the_origin() -> None:
    # Churn at 100 hosts: children wait seconds at sources that die, and by then the other
    # sources they were given have dropped the chunk (fills the tracker did not keep).  Before,
    # such fetches read the origin (no_source_left: 9 chunks of 73); now they ask again and
    # get one of the copies made meanwhile: the origin reads only chunks nobody had.
    churn = {"late_fraction": 0.1, "late_by_s": 10.0, "die_fraction": 0.1, "die_window_s": (1.0, 8.0)}
    result = Swarm(swarm_sim.scale_params(100, leave_after_s=5.0, **churn)).run()
    assert "no_source_left" not in result.problems and "over_budget" not in result.problems
    assert result.origin_chunks == result.problems["no_source"]
    assert result.problems["asked_again"] >= 1 and result.problems["missing"] >= 1


def test_a_fetch_whose_sources_were_only_busy_waits_for_them_instead_of_the_origin() -> None:
    # Sends that hold their upload slots: children are refused (429) by sources that have the
    # chunk.  Asking again then named other busy holders: 170 origin reads instead of 160
    # (162 since a source's children count across keys); trying the same ones again after a
    # pause reads each chunk from the origin once (48).
    result = Swarm(swarm_sim.scale_params(100, sndbuf_bytes=0)).run()
    assert "asked_again" not in result.problems and result.problems["refused"] >= 1
    assert result.problems["busy_waits"] >= 1 and result.origin_chunks == 48


def test_without_peers_every_host_reads_the_whole_blob_from_the_origin() -> None:
    result = Swarm(replace(TINY, peers=False)).run()
    assert result.origin_bytes == 3 * TINY.blob_bytes and result.tracker.total == 0
    # no locate; 6 flows share the origin's 1 MB/s: every host done at 6 s and a round trip
    assert result.completion_s == pytest.approx([6 + RTT] * 3, rel=1e-12)


def test_the_validation_compares_the_simulated_p2p_run_with_a_measured_one(tmp_path: Path) -> None:
    report = Report("swarm_sim")
    swarm_sim.validation(report, swarm_sim.P2P_MEASURED)
    assert report.metrics["p2p_sim_origin_egress"] == 1.0  # every chunk from the origin once
    assert report.metrics["p2p_real_origin_egress"] == swarm_sim.P2P_MEASURED["origin_egress"]
    assert report.metrics["p2p_sim_peer_chunk_share"] == 7 / 8  # each chunk's first asker to the origin
    figures = ("peers_slowest_s", "slowest_vs_single", "origin_egress", "peer_chunk_share")
    assert set(report.ratios) == {f"p2p_sim_vs_real_{k}" for k in figures}


def test_the_scale_runs_simulate_64_mib_chunks_standing_for_16_real_ones() -> None:
    params = swarm_sim.scale_params(10)
    assert params.chunks == 48 and params.budget_bytes == 64 * params.chunk_bytes
    assert params.wait_s == 16 * 30.0 and params.sndbuf_bytes == params.chunk_bytes  # per real 4 MiB chunk
    assert swarm_sim.scale_params(10, chunk_bytes=4 << 20).wait_s == 30.0


def test_a_run_repeats_exactly_in_another_process() -> None:
    """Simultaneous events are ordered by when they were scheduled, never by object addresses
    or string hashes (flows and waiting children kept in sets varied a run's event count)."""
    script = (
        "from benchmarks.swarm_sim import scale_params\n"
        "from benchmarks._swarm_model import Swarm\n"
        "r = Swarm(scale_params(120)).run()\n"
        "print(r.events, r.origin_bytes, sorted(r.completion_s))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    ]
    assert runs[0] == runs[1] == runs[2] and runs[0]
