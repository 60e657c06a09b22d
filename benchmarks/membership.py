"""membership: L3 nodes added to and removed from a running job; what moves, what it costs,
and that the hit ratio comes back.

A local cluster (every server its own process: one block server, N L3 nodes; N = 4, 3 with
``--quick``) holds a dataset of 64 KiB chunks (2,048 of them, 512 with ``--quick``), four to a
blob.  One client (no L1 nor L2, so every read asks L3) reads the whole dataset in epochs of
8 batches, 16 reads in flight, and checks every byte against what it wrote:

- epoch 0 is cold (the nodes fill from L4), epoch 1 warm (the baseline);
- at the start of epoch 2 one node is started (``Cluster.add_server``) and the client told
  (``Client.set_l3_urls``) while the epoch's first batch is in flight;
- at the start of epoch 4 one of the first nodes is taken out the same way (told first, then
  stopped: a drain); epochs 3 and 5 show the recovery.

Figures:

- ``add_moved`` / ``remove_moved``: the fraction of the dataset's chunks whose first node
  changed (blobsdk/chunks/names.py ``moved`` over the real chunk keys and node URLs), against
  ``1/(N+1)`` and ``1/N`` (``*_vs_expected``, with ``_lo``/``_hi``: the 2-sigma binomial band
  of that many keys, divided by the expected value); ``*_many_keys_vs_expected``: the same
  change over 65,536 random keys (16,384 with ``--quick``), whose band is narrower, which says whether a draw far from
  1 comes from the node names or from the dataset's keys;
- ``add_misses_vs_moved`` / ``remove_misses_vs_moved``: the L3 misses (chunks a node read
  through from L4, or L4 read itself) from a change to the next one (or the end), over the
  chunks moved: a change costs its moved chunks once, no more (goal <= 1.1; below 1 where a
  moved chunk's second node, with 2 replicas, held a copy and answered a hedge);
- ``hit_ratio_warm``, ``hit_ratio_at_add``, ``hit_ratio_after_add``, ``hit_ratio_at_remove``,
  ``hit_ratio_after_remove``: the L3 hit ratio of epochs 1 to 5, each the median of its
  batches (``_p25``, ``_p75``); ``*_vs_warm`` say the ratio recovered (goal >= 0.99).  A chunk
  read in the epoch of a change before its reads saw the new list misses once in the next
  epoch instead, so that epoch's first batch may still be below 1;
- ``wrong_bytes`` (must be 0: the run fails otherwise) and ``bytes_checked``.

The PNG (``membership.png``, or next to ``--json``) is the hit ratio of every batch, the add
and the remove marked.
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

import blobsdk
from blobsdk.chunks import expected_moved, moved
from blobsdk.config import L1Config, WriteConfig
from servers.cluster import Cluster, start_cluster

from ._picture import draw
from ._report import Report, median, percentile

CHUNK = 64 << 10
CHUNKS_PER_BLOB = 4
BATCHES = 8  # per epoch
IN_FLIGHT = 16
EPOCHS = 6
ADD_AT, REMOVE_AT = 2, 4  # the epochs whose first batch runs across a change
GOALS = {"add_misses_vs_moved": "<= 1.1", "remove_misses_vs_moved": "<= 1.1"}
GOALS |= {f"hit_ratio_after_{change}_vs_warm": ">= 0.99" for change in ("add", "remove")}


@dataclass(frozen=True)
class Size:
    nodes: int
    chunks: int
    many_keys: int = 1 << 16  # random keys placed over the same node lists


FULL, QUICK = Size(nodes=4, chunks=2048), Size(nodes=3, chunks=512, many_keys=1 << 14)


@dataclass
class Run:
    """What the job saw: each batch's L3 hits and misses, the bytes it checked."""

    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    bytes_checked: int = 0
    wrong_bytes: int = 0

    def ratio(self, batch: int) -> float:
        total = self.hits[batch] + self.misses[batch]
        return self.hits[batch] / total if total else 0.0

    def epoch(self, e: int) -> list[float]:
        return [self.ratio(b) for b in range(e * BATCHES, (e + 1) * BATCHES)]

    def misses_in(self, first: int, end: int) -> int:
        """The misses of epochs ``first`` to ``end`` (not included)."""
        return sum(self.misses[first * BATCHES : end * BATCHES])


def options(args: Any) -> dict[str, Any]:
    """``--png PATH`` (default: next to ``--json``, else membership.png)."""
    return {"png": args.png or (args.json.with_suffix(".png") if args.json else Path("membership.png"))}


async def run(quick: bool = False, png: Path | None = None, size: Size | None = None) -> Report:
    size = size or (QUICK if quick else FULL)
    report = Report("membership")
    with tempfile.TemporaryDirectory(prefix="bench-membership-") as tmp:
        async with start_cluster(tmp, block_servers=1, l3_nodes=size.nodes, trackers=0) as cluster:
            job, moves = await _job(cluster, size)
    _report(report, size, job, moves)
    if png is not None:
        draw(report, png, lambda plt: _curve(plt, job, size))
    return report


async def _job(cluster: Cluster, size: Size) -> tuple[Run, dict[str, float]]:
    assert cluster.config is not None
    config = msgspec.structs.replace(
        cluster.config, l1=L1Config(capacity_bytes=0), write=WriteConfig(chunk_size=CHUNK, block_size=16 * CHUNK)
    )
    data = {f"/bench/m/{i:05d}": os.urandom(CHUNKS_PER_BLOB * CHUNK) for i in range(size.chunks // CHUNKS_PER_BLOB)}
    job, moves = Run(), {}
    async with blobsdk.Client(config) as c:
        await c.put_many(data.items())
        keys = [ref.key for path in data for ref in (await c.plan(path)).chunks]
        for epoch in range(EPOCHS):
            change, gone = None, None
            if epoch == ADD_AT:  # started first, then the client told while a batch runs
                await asyncio.to_thread(cluster.add_server, "l3")
                assert cluster.config is not None
                change = _tell(c, keys, list(cluster.config.l3_urls), moves, "add", size.many_keys)
            elif epoch == REMOVE_AT:  # the client told while a batch runs, the node stopped after: a drain
                gone = next(p for p in cluster.processes if p.kind == "l3")  # one of the first nodes
                change = _tell(c, keys, [url for url in c.config.l3_urls if url != gone.url], moves, "remove", size.many_keys)
            await _epoch(c, data, job, change)
            if gone is not None:
                await asyncio.to_thread(cluster.remove_server, gone)
    return job, moves


async def _tell(c: blobsdk.Client, keys: list[str], urls: list[str], moves: dict[str, float], name: str, many: int) -> None:
    """Give the client its new nodes; note the fraction of ``keys`` whose first node changed,
    and of ``many`` random keys over the same node URLs (is a draw the keys' or the names'?)."""
    before = list(c.config.l3_urls)
    await c.set_l3_urls(urls)
    moves[name] = moved(keys, before, urls)
    moves[f"{name}_many_keys"] = moved((os.urandom(16).hex() for _ in range(many)), before, urls)


async def _epoch(c: blobsdk.Client, data: dict[str, bytes], job: Run, change: Any) -> None:
    paths = list(data)
    per = len(paths) // BATCHES
    for b in range(BATCHES):
        before = c.stats()["l3"]
        batch = _batch(c, paths[b * per : (b + 1) * per], data, job)
        if b == 0 and change is not None:
            await asyncio.gather(batch, change)  # the change lands while the batch's reads run
        else:
            await batch
        after = c.stats()["l3"]
        job.hits.append(int(after["node_hits"] - before["node_hits"]))
        job.misses.append(int(after["node_fills"] - before["node_fills"] + after["misses"] - before["misses"]))


async def _batch(c: blobsdk.Client, paths: list[str], data: dict[str, bytes], job: Run) -> None:
    async for path, got in c.readahead(paths, depth=IN_FLIGHT):
        job.bytes_checked += len(got)
        if got != data[path]:
            job.wrong_bytes += sum(a != b for a, b in zip(got, data[path], strict=False)) + abs(len(got) - len(data[path]))


def _report(report: Report, size: Size, job: Run, moves: dict[str, float]) -> None:
    report.metrics.update(nodes=size.nodes, chunks=size.chunks, bytes_checked=job.bytes_checked, wrong_bytes=job.wrong_bytes)
    report.failed = job.wrong_bytes > 0
    phases = (("add", size.nodes, 1, ADD_AT, REMOVE_AT), ("remove", size.nodes + 1, -1, REMOVE_AT, EPOCHS))
    for change, nodes, delta, epoch, end in phases:
        expected = expected_moved(nodes, delta)
        band = 2 * math.sqrt(expected * (1 - expected) / size.chunks)
        report.metrics[f"{change}_moved"] = moves[change]
        report.metrics[f"{change}_expected"] = expected
        report.ratios[f"{change}_moved_vs_expected"] = moves[change] / expected
        report.ratios[f"{change}_moved_vs_expected_lo"] = (expected - band) / expected
        report.ratios[f"{change}_moved_vs_expected_hi"] = (expected + band) / expected
        many_band = 2 * math.sqrt(expected * (1 - expected) / size.many_keys)
        report.ratios[f"{change}_many_keys_vs_expected"] = moves[f"{change}_many_keys"] / expected
        report.ratios[f"{change}_many_keys_vs_expected_lo"] = (expected - many_band) / expected
        report.ratios[f"{change}_many_keys_vs_expected_hi"] = (expected + many_band) / expected
        chunks_moved = moves[change] * size.chunks
        misses = job.misses_in(epoch, end)  # until the next change: what the change cost in all
        report.ratios[f"{change}_misses_vs_moved"] = misses / chunks_moved if chunks_moved else 0.0
    _hit_ratios(report, job)
    report.goals.update(GOALS)
    report.details["hit_ratio_per_batch"] = [job.ratio(b) for b in range(len(job.hits))]
    report.details["changes_before_batch"] = {"add": ADD_AT * BATCHES, "remove": REMOVE_AT * BATCHES}


def _hit_ratios(report: Report, job: Run) -> None:
    warm = job.epoch(1)
    epochs = {"warm": 1, "at_add": ADD_AT, "after_add": ADD_AT + 1, "at_remove": REMOVE_AT, "after_remove": REMOVE_AT + 1}
    for name, epoch in epochs.items():
        ratios = job.epoch(epoch)
        report.ratios[f"hit_ratio_{name}"] = median(ratios)
        report.ratios[f"hit_ratio_{name}_p25"] = percentile(ratios, 0.25)
        report.ratios[f"hit_ratio_{name}_p75"] = percentile(ratios, 0.75)
        if name.startswith("after_"):
            report.ratios[f"hit_ratio_{name}_vs_warm"] = median(ratios) / median(warm) if median(warm) else 0.0


def _curve(plt: Any, job: Run, size: Size) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    batches = list(range(len(job.hits)))
    ax.plot(batches, [job.ratio(b) for b in batches], marker="o", markersize=3, label="L3 hit ratio per batch")
    n = size.nodes
    ax.axvline(ADD_AT * BATCHES - 0.5, color="tab:green", linestyle="--", label=f"node added ({n} -> {n + 1})")
    ax.axvline(REMOVE_AT * BATCHES - 0.5, color="tab:red", linestyle="--", label=f"node removed ({n + 1} -> {n})")
    for e in range(1, EPOCHS):
        ax.axvline(e * BATCHES - 0.5, color="grey", alpha=0.2)
    # Both changes move one node's share of n + 1 nodes: the drop rendezvous hashing predicts.
    ax.axhline(n / (n + 1), color="grey", linestyle=":", label=f"predicted: 1 - 1/{n + 1}")
    ax.set_xlabel(f"read batch ({BATCHES} per epoch of {size.chunks} chunks of 64 KiB)")
    ax.set_ylabel("L3 hit ratio (node hits / chunk reads)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("membership: the L3 hit ratio across a node added and one removed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    return fig
