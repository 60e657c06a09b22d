"""The checkpoint benchmark's rows for deduplication as training frameworks save:

- ``cnr``: Check-N-Run's workload, an embedding table (float32 rows of 128 dims, 512 B) of
  1 GiB (``--quick``: 256 MiB), saved 10 times (``--quick``: 4) with ``client.checkpoints``
  on the embedded store; before every save but the first, 1% of its rows change, picked by a
  Zipf law over the rows' popularity (exponent 1.05, without replacement; the ranks mapped to
  rows by a fixed permutation, as hashed ids land, so the hot rows are spread over the table;
  fixed seeds).  Three variants replay the same changes (``CNR_VARIANTS``): ``cnr`` with
  ``mirror=True`` (a changed chunk's changed runs written as a patch, until its patches would
  pass the default ``rewrite_at``, half the chunk), ``cnr_tight`` with ``rewrite_at=0.025`` (a
  chunk is written whole again every few saves: what a long run costs, seen within 10 saves),
  ``cnr_whole`` without the mirror (a changed chunk written whole).  Per save: the bytes written ÷ the bytes changed (the distinct
  rows touched x 512 B), the stall (how long ``save`` blocks) against a synchronous
  ``np.save`` + fsync of the table, and the data plan's size.  At the end, the restore
  (``load(into=)`` of the last checkpoint by a fresh client) ÷ a numpy memcpy of the same
  bytes into warm memory, in the same run.  ``cnr_stall_cut_floor``: the synchronous save ÷
  hashing the table once on 2 threads, the best cut a save that must look at every byte can
  reach; ``cnr_restore_floor_vs_memcpy``: the memcpy ÷ the least work of any verified restore
  (``os.preadv`` of the same bytes from the page cache into warm memory, each 4 MiB checked
  with xxh3-64, on 2 threads), the best ``restore_vs_memcpy`` this machine allows.
- ``cnr_long``: the ``cnr`` replay of a 64 MiB table (the same share of rows changed per
  chunk) saved 100 times (``--quick``: 40): the long-run cost of patches, whose chunks are
  written whole again once their patches reach the budget (``rewrite_at`` or 32 patches); the
  total bytes written ÷ the total changed, and the restore after the last save.
- ``unchanged``: the stall of a save of the same size in 16 torch tensors of which only a
  1-float one changed, with ``trust_version_counters=True`` (the unchanged tensors are not
  hashed), against ``np.save`` + fsync of the same bytes; 5 saves.
- ``scattered``: 5% of a 64 MiB array (quick and full alike) changed in 20 regions of 160 KiB
  spread over it (one at a random place in each twentieth), 5 times (``--quick``: 2) after a
  first save, with ``mirror=True``: the bytes written ÷ the bytes changed.
- ``dcp_steps``: DCP with a path per step, ``BlobStorageWriter`` on the embedded store with the
  prefix ``/bkt/ckpt/step-{n}``, for a ~52 MiB model (an embedding and 3 transformer layers)
  of which one norm (512 floats) changes between saves; 4 saves (``--quick``: 3): every later
  save's bytes written ÷ the first's (the bucket's chunk index finds the chunks).

Every save uses the store's default grain (the checkpoints' ``chunk_size`` is left unset).
Bytes written: what the store's block directory grew by.  Figures that repeat are reported as
their median, with their range in the goal column, which also says whether the goal is met.
"""

from __future__ import annotations

import inspect
import os
import shutil
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import xxhash

import blobsdk
from blobsdk.config import WriteConfig

from ._report import Report, du, median, timed

MiB = 1 << 20
GB = 1e9
DIMS = 128  # float32: 512 B a row
ROW = DIMS * 4
ZIPF = 1.05
CHANGED_ROWS = 0.01
REGIONS = 20


@dataclass(frozen=True)
class Shape:
    table_bytes: int  # Check-N-Run's embedding table
    saves: int  # of the table
    scattered_bytes: int  # the array of the scattered case
    region: int  # bytes: one of its 20 changed regions
    scattered_saves: int
    dcp_width: int  # the model's: 512 makes ~52 MiB
    dcp_saves: int
    long_table_bytes: int  # the long Check-N-Run run's table
    long_saves: int  # of it


FULL = Shape(1024 * MiB, 10, 64 * MiB, 160 << 10, 6, 512, 4, 64 * MiB, 100)
QUICK = Shape(256 * MiB, 4, 64 * MiB, 160 << 10, 3, 512, 3, 64 * MiB, 40)


def goal(report: Report, key: str, samples: list[float], op: str, bound: float, note: str = "") -> None:
    """Report the median of ``samples`` as the ratio ``key`` beside its goal and whether it is
    met, their least and greatest as ``key_min`` and ``key_max``, and the samples in the JSON's
    details."""
    value = median(samples)
    met = value <= bound if op == "<=" else value >= bound
    report.ratios.update({key: value, f"{key}_min": min(samples), f"{key}_max": max(samples)})
    report.goals[key] = f"goal {op} {bound:g}: {'met' if met else 'MISS'} (median of {len(samples)}){note}"
    report.details[key] = samples


async def run(report: Report, root: Path, shape: Shape) -> None:
    await check_n_run(report, root, shape)
    await cnr_long(report, root, shape)
    await unchanged(report, root, shape)
    await scattered(report, root, shape)
    dcp_path_per_step(report, root, shape)


class _Zipf:
    """Rows picked without replacement by a Zipf law over their popularity ranks; rank r is row
    ``order[r]``, fixed for the run (the hot rows stay hot, wherever they are)."""

    def __init__(self, rows: int, rng: np.random.Generator) -> None:
        weights = np.arange(1, rows + 1, dtype=np.float64) ** -ZIPF
        self.cdf = np.cumsum(weights)
        self.cdf /= self.cdf[-1]
        self.order = rng.permutation(rows)
        self.rng = rng

    def pick(self, count: int) -> np.ndarray:
        seen = np.empty(0, dtype=np.int64)
        while len(seen) < count:
            ranks = np.concatenate([seen, np.searchsorted(self.cdf, self.rng.random(2 * count))])
            _, first = np.unique(ranks, return_index=True)
            seen = ranks[np.sort(first)]  # in the order drawn
        picked: np.ndarray = self.order[np.minimum(seen[:count], len(self.order) - 1)]
        return picked


# Check-N-Run's variants: (name, the checkpoints' options); the first is the goal's row.
CNR_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("cnr", {"mirror": True}),  # rewrite_at: blobsdk's default
    ("cnr_tight", {"mirror": True, "rewrite_at": 0.025}),
    ("cnr_whole", {}),  # no mirror: a changed chunk is written whole
]


async def check_n_run(report: Report, root: Path, shape: Shape) -> None:
    """Each variant replays the same table and the same changes; the synchronous save and
    the hash floor are measured once, on the same table."""
    table = _table(shape)
    sync, floor = _baselines(table, root / "cnr.npy")
    copies, reads = _restore_baselines(table, root / "cnr.raw")
    del table
    report.ratios["cnr_restore_floor_vs_memcpy"] = median(copies) / median(reads)  # the best a restore can reach
    report.metrics["cnr_table_mib"] = shape.table_bytes / MiB
    report.metrics["cnr_changed_mib_per_save"] = int(shape.table_bytes // ROW * CHANGED_ROWS) * ROW / MiB
    report.metrics["cnr_sync_save_s"] = median(sync)
    report.metrics["cnr_hash_floor_s"] = median(floor)
    report.ratios["cnr_stall_cut_floor"] = median(sync) / median(floor)  # the best cut a save that reads it all can reach
    for name, options in CNR_VARIANTS:
        await _cnr_variant(report, root, shape, name, options, sync)


def _baselines(table: np.ndarray, path: Path) -> tuple[list[float], list[float]]:
    """3 synchronous saves of ``table`` (``np.save`` + fsync) and 3 hashes of it on 2 threads."""
    return _sync_saves(table, path), [timed(lambda: _hash_once(table)) for _ in range(3)]


def _restore_baselines(table: np.ndarray, path: Path) -> tuple[list[float], list[float]]:
    """3 numpy copies of ``table`` into warm memory, and 3 times the least work of any verified
    restore of it: ``os.preadv`` of its bytes (a file in the page cache) into that warm memory
    in 4 MiB pieces, each checked with xxh3-64, on 2 threads."""
    into = np.zeros_like(table)
    copies = [timed(lambda: np.copyto(into, table)) for _ in range(3)]
    path.write_bytes(memoryview(table.reshape(-1).view(np.uint8)))
    out = memoryview(into.reshape(-1).view(np.uint8))
    fd = os.open(path, os.O_RDONLY)
    try:
        reads = [timed(lambda: _read_verified(fd, out)) for _ in range(3)]
    finally:
        os.close(fd)
        path.unlink()
    assert np.array_equal(into, table)
    return copies, reads


def _read_verified(fd: int, out: memoryview) -> None:
    pieces = range(0, len(out), 4 * MiB)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda start: _read_piece(fd, out[start : start + 4 * MiB], start), pieces))


def _read_piece(fd: int, out: memoryview, offset: int) -> None:
    os.preadv(fd, [out], offset)
    xxhash.xxh3_64_intdigest(out)


def _table(shape: Shape) -> np.ndarray:
    return np.random.default_rng(24).standard_normal((shape.table_bytes // ROW, DIMS), dtype=np.float32)


@dataclass
class _Saves:
    """Per delta save of a replay: its stall, the bytes it wrote and changed, its plan's size."""

    stalls: list[float]
    written: list[int]
    changed: list[int]
    plan_bytes: list[int]
    first_stall: float


async def _replay(store: Path, table: np.ndarray, saves: int, options: dict[str, Any]) -> _Saves:
    """``saves`` saves of ``table`` under ``store``, 1% of its rows changed (Zipf) before each
    but the first; fixed seeds, so every replay of a table makes the same changes."""
    rng = np.random.default_rng(25)
    zipf = _Zipf(len(table), rng)
    state = {"emb": {"table": table}}
    out = _Saves([], [], [], [], 0.0)
    async with blobsdk.Client.local(store, write=WriteConfig(compression="none")) as client:
        ck = client.checkpoints("/ck/cnr", keep=2, **options)
        for step in range(saves):
            changed = 0
            if step:
                rows = zipf.pick(int(len(table) * CHANGED_ROWS))
                table[rows] += rng.standard_normal((len(rows), DIMS), dtype=np.float32)
                changed = len(np.unique(rows)) * ROW
            before = du(store / "blocks")
            begun = time.perf_counter()
            pending = await ck.save(step, state)
            stall = time.perf_counter() - begun
            await pending.wait()
            if not step:
                out.first_stall = stall
                continue
            out.stalls.append(stall)
            out.written.append(du(store / "blocks") - before)
            out.changed.append(changed)
            out.plan_bytes.append(len(msgspec.msgpack.encode(await client.plan(f"/ck/cnr/{step:012d}/data"))))
    return out


async def _cnr_variant(report: Report, root: Path, shape: Shape, name: str, options: dict[str, Any], sync: list[float]) -> None:
    table = _table(shape)
    store = root / name
    saves = await _replay(store, table, shape.saves, options)
    report.metrics[f"{name}_first_stall_s"] = saves.first_stall
    report.metrics[f"{name}_delta_stall_s"] = median(saves.stalls)
    report.metrics[f"{name}_plan_kib_last"] = saves.plan_bytes[-1] / 1024  # the data plan: a ref more per patch
    report.details[f"{name}_plan_bytes"] = saves.plan_bytes
    report.details[f"{name}_delta_stalls_s"] = saves.stalls
    goal(report, f"{name}_bytes_vs_changed", [w / c for w, c in zip(saves.written, saves.changed, strict=True)], "<=", 1.2)
    report.metrics[f"{name}_bytes_vs_changed_total"] = sum(saves.written) / sum(saves.changed)  # rewrites included
    at = "" if shape.table_bytes >= 1024 * MiB else f"; the goal is at 1 GiB, this at {shape.table_bytes / MiB:g} MiB"
    goal(report, f"{name}_stall_cut", [median(sync) / s for s in saves.stalls], ">=", 50, at)
    await _restore(report, store, table, name)
    shutil.rmtree(store)  # up to 10 GiB (whole chunks, 10 saves): the next variant needs the disk


async def cnr_long(report: Report, root: Path, shape: Shape) -> None:
    """The ``cnr`` replay (``mirror=True``, default ``rewrite_at``) run long: a smaller table
    (64 MiB), the same ~82 changed rows per 4 MiB chunk per save, saved ``long_saves`` times, so every
    chunk is written whole again as its patches reach the budget.  Reported as the total bytes
    written ÷ the total changed (a median per save would hide the rewrites), the plan and the
    restore after the last save."""
    table = np.random.default_rng(24).standard_normal((shape.long_table_bytes // ROW, DIMS), dtype=np.float32)
    store = root / "cnr_long"
    saves = await _replay(store, table, shape.long_saves, {"mirror": True})
    report.metrics["cnr_long_saves"] = shape.long_saves
    report.metrics["cnr_long_bytes_vs_changed"] = sum(saves.written) / sum(saves.changed)
    report.metrics["cnr_long_plan_kib_last"] = saves.plan_bytes[-1] / 1024
    report.details["cnr_long_written"] = saves.written
    await _restore(report, store, table, "cnr_long", with_goal=False)
    shutil.rmtree(store)


def _hash_once(array: np.ndarray) -> None:
    """xxh3-128 over every byte of ``array`` once, on 2 threads: the least any save that must
    look at all of it (every row may have changed) can stall."""
    data = memoryview(array.reshape(-1).view(np.uint8))
    half = len(data) // 2
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(_hash_chunks, [data[:half], data[half:]]))


def _hash_chunks(data: memoryview) -> None:
    for start in range(0, len(data), 4 * MiB):
        xxhash.xxh3_128_digest(data[start : start + 4 * MiB])


async def unchanged(report: Report, root: Path, shape: Shape) -> None:
    """The stall of a save of ``table_bytes`` of torch tensors (16 of them) of which only a
    small one changed, with ``trust_version_counters=True``: the unchanged ones are not hashed.
    Against ``np.save`` + fsync of the same bytes, in the same run."""
    import torch

    generator = torch.Generator().manual_seed(27)
    layers = {f"l{i}": torch.randn(shape.table_bytes // 16 // 4, generator=generator) for i in range(16)}
    state = {"layers": layers, "step": torch.zeros(1)}
    sync = _sync_saves(np.concatenate([t.numpy() for t in layers.values()]), root / "unchanged.npy")
    stalls = []
    async with blobsdk.Client.local(root / "unchanged", write=WriteConfig(compression="none")) as client:
        ck = client.checkpoints("/ck/unchanged", keep=2, trust_version_counters=True)
        await (await ck.save(0, state)).wait()
        for step in range(1, 6):
            state["step"] += 1
            begun = time.perf_counter()
            pending = await ck.save(step, state)
            stalls.append(time.perf_counter() - begun)
            await pending.wait()
    report.metrics["unchanged_sync_save_s"] = median(sync)
    report.metrics["unchanged_stall_s"] = median(stalls)
    at = "" if shape.table_bytes >= 1024 * MiB else f"; the goal is at 1 GiB, this at {shape.table_bytes / MiB:g} MiB"
    goal(report, "unchanged_stall_cut", [median(sync) / s for s in stalls], ">=", 50, at)


def _sync_saves(array: np.ndarray, path: Path) -> list[float]:
    """3 timed ``np.save`` + fsync of ``array``, the file removed after."""
    times = [timed(lambda: _np_save(array, path)) for _ in range(3)]
    path.unlink()
    return times


def _np_save(array: np.ndarray, path: Path) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


async def _restore(report: Report, store: Path, table: np.ndarray, name: str, *, with_goal: bool = True) -> None:
    """3 loads of the latest checkpoint, each by a fresh client, against 3 numpy copies of the
    table into an array already touched (a memcpy); the restore's loads fill that same array
    (zeroed first, untimed) when ``load`` takes ``into=``."""
    into = np.zeros_like(table)
    copies = [timed(lambda: np.copyto(into, table)) for _ in range(3)]
    loads = []
    in_place = False
    for _ in range(3):
        into.fill(0)
        async with blobsdk.Client.local(store) as client:
            ck = client.checkpoints("/ck/cnr")
            in_place = "into" in inspect.signature(ck.load).parameters
            begun = time.perf_counter()
            if in_place:
                await ck.load(into={"emb": {"table": into}})
                loaded = into
            else:
                loaded = (await ck.load())["emb"]["table"]
            loads.append(time.perf_counter() - begun)
        assert np.array_equal(loaded, table), "restore is not exact"
        del loaded
    memcpy = table.nbytes / median(copies) / GB
    report.metrics["memcpy_gb_s"] = memcpy
    report.metrics[f"{name}_restore_gb_s"] = table.nbytes / median(loads) / GB
    report.metrics[f"{name}_restore_in_place"] = float(in_place)
    ratios = [table.nbytes / t / GB / memcpy for t in loads]
    if with_goal:
        goal(report, f"{name}_restore_vs_memcpy", ratios, ">=", 0.9)
    else:
        report.metrics[f"{name}_restore_vs_memcpy"] = median(ratios)


async def scattered(report: Report, root: Path, shape: Shape) -> None:
    rng = np.random.default_rng(25)
    array = rng.standard_normal(shape.scattered_bytes // 4, dtype=np.float32)
    state = {"model": {"weights": array}}
    store = root / "scattered"
    slot, region = len(array) // REGIONS, shape.region // 4
    ratios = []
    async with blobsdk.Client.local(store, write=WriteConfig(compression="none")) as client:
        ck = client.checkpoints("/ck/scattered", keep=2, mirror=True)
        for step in range(shape.scattered_saves):
            if step:
                for i in range(REGIONS):
                    start = i * slot + int(rng.integers(0, slot - region + 1))
                    array[start : start + region] = rng.standard_normal(region, dtype=np.float32)
            before = du(store / "blocks")
            await (await ck.save(step, state)).wait()
            if step:
                ratios.append((du(store / "blocks") - before) / (REGIONS * region * 4))
    goal(report, "scattered_bytes_vs_changed", ratios, "<=", 1.2)


def _model(width: int) -> dict[str, Any]:
    """Of width 512, ~52 MiB of float32: an embedding of 8192 x 512 (16 MiB) and 3 layers of
    12 MiB each."""
    import torch

    generator = torch.Generator().manual_seed(26)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    model = {"tok_embeddings": randn(16 * width, width), "norm": torch.ones(width)}
    for i in range(3):
        for name in ("wq", "wk", "wv", "wo"):
            model[f"layers.{i}.attention.{name}"] = randn(width, width)
        model[f"layers.{i}.feed_forward.w1"] = randn(4 * width, width)
        model[f"layers.{i}.feed_forward.w2"] = randn(width, 4 * width)
        model[f"layers.{i}.attention_norm"] = torch.ones(width)
        model[f"layers.{i}.ffn_norm"] = torch.ones(width)
    return model


def dcp_path_per_step(report: Report, root: Path, shape: Shape) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from blobsdk.torch import BlobStorageWriter

    model = _model(shape.dcp_width)
    store = root / "dcp-steps"
    written = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        for n in range(shape.dcp_saves):
            if n:
                with torch.no_grad():
                    model["layers.2.ffn_norm"] += 1.0  # a norm: 512 floats of ~13.6M change (at width 512)
            before = du(store / "blocks")
            with BlobStorageWriter.local(store, f"/bkt/ckpt/step-{n}") as writer:
                dcp.save({"model": model}, storage_writer=writer)
            written.append(du(store / "blocks") - before)
    report.metrics["dcp_steps_model_mib"] = sum(t.nbytes for t in model.values()) / MiB
    report.metrics["dcp_steps_first_mib"] = written[0] / MiB
    goal(report, "dcp_steps_later_vs_first", [w / written[0] for w in written[1:]], "<=", 0.05)
