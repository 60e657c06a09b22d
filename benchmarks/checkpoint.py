"""checkpoint: delta checkpoint saves.  A state of float32 arrays of 64 MiB (16, 1 GiB;
``--quick``: 4, 256 MiB), saved at 10 steps (``--quick``: 5), with 5% of its 4 MiB chunks (the default size) changed
before each step, in one run:

- ``numpy``: ``np.save`` of every array into one local file, then ``fsync`` (the sync full save);
- ``torch``: ``torch.save`` of the state as tensors into a local file, then ``fsync``;
- ``dcp``: DCP's own ``FileSystemWriter``, a new checkpoint directory each step;
- ``blobsdk``: ``client.checkpoints`` delta saves, embedded (SQLite + local blocks), and
  ``blobsdk_cluster`` on a local cluster (API server, 1 block server); and DCP through
  ``BlobStorageWriter``.

Per save: the stall (how long ``save`` blocks training: the whole save for the file-based
ones), and the bytes written (file sizes; for blobsdk what its block store grew by, manifests
and all).  Restore: ``load`` of the last checkpoint by a fresh client against reading the same
bytes back from the numpy file (both from the page cache, into memory fresh from the kernel; medians of 3).

Ratios: ``stall_cut`` (numpy's stall ÷ blobsdk's median delta stall; goal >= 20),
``bytes_vs_dirty`` (blobsdk's bytes written per delta step ÷ the bytes changed; goal <= 1.2),
``restore_vs_file`` (goal >= 0.5; and ``restore_vs_fresh_memory``, against only writing that much
fresh memory once, the floor of any restore into new arrays), ``restore_check_share`` (the part of a ``load``
spent checking every chunk against its manifest's xxh3-128: that check run again alone, on the client's
executor, over the loaded arrays ÷ the load), ``dcp_bytes_vs_filesystem`` (BlobStorageWriter's second
save's new bytes ÷ FileSystemWriter's bytes for it; goal <= 0.2).

Then the rows of deduplication as training frameworks save (:mod:`benchmarks._checkpoint_dedup`):
Check-N-Run's embedding table with 1% of its rows changed per save (``cnr_*``), 5% of an array
changed in 20 scattered regions (``scattered_*``), and DCP with a path per step
(``dcp_steps_*``), each beside its goal.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

import blobsdk
from blobsdk.config import WriteConfig
from blobsdk.write import restore
from servers.cluster import start_cluster

from . import _checkpoint_dedup
from ._report import Report, median
from ._report import du as _du
from ._report import timed as _timed

MiB = 1 << 20
CHUNK = WriteConfig().chunk_size  # the default, 4 MiB: checkpoints are cut as blobs are
ARRAY_BYTES = 64 * MiB  # every array, quick or full: past glibc's largest heap allocation, so mapped anew
DIRTY = 0.05


def _state(total: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "model": {f"layer{i:02d}": rng.standard_normal(ARRAY_BYTES // 4, dtype=np.float32) for i in range(total // ARRAY_BYTES)}
    }


def _dirty(state: dict[str, Any], rng: np.random.Generator) -> int:
    """Change 5% of the state's chunks (one float in each); the bytes changed."""
    arrays = list(state["model"].values())
    per_array = arrays[0].nbytes // CHUNK
    picks = rng.choice(len(arrays) * per_array, max(1, int(len(arrays) * per_array * DIRTY)), replace=False)
    for pick in picks:
        array = arrays[pick // per_array]
        array[(pick % per_array) * (CHUNK // 4)] += 1.0
    return len(picks) * CHUNK


def _numpy_save(state: dict[str, Any], path: Path) -> None:
    with open(path, "wb") as f:
        for array in state["model"].values():
            np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def _numpy_load(path: Path, arrays: int) -> list[Any]:
    with open(path, "rb") as f:
        return [np.load(f) for _ in range(arrays)]


def _torch_save(state: dict[str, Any], path: Path) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save({k: torch.from_numpy(v) for k, v in state["model"].items()}, f)
        f.flush()
        os.fsync(f.fileno())


def _dcp_state(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {"model": {k: torch.from_numpy(v) for k, v in state["model"].items()}}


async def run(quick: bool = False) -> Report:
    report = Report("checkpoint")
    total, steps = (256 * MiB, 5) if quick else (1024 * MiB, 10)
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-", dir=os.environ.get("BENCH_DIR", "/work")) as tmp:
        root = Path(tmp)
        await _delta_rows(report, root, total, steps)
        _ratios(report)
        await _checkpoint_dedup.run(report, root, _checkpoint_dedup.QUICK if quick else _checkpoint_dedup.FULL)
    return report


async def _delta_rows(report: Report, root: Path, total: int, steps: int) -> None:
    """The rows of delta saves under one prefix, against the file-based full saves."""
    state = _state(total)
    full = [_timed(lambda: _numpy_save(state, root / "full.npy")) for _ in range(3)]
    report.metrics["numpy_save_s"] = median(full)
    report.metrics["torch_save_s"] = median([_timed(lambda: _torch_save(state, root / "full.pt")) for _ in range(2)])
    report.metrics["numpy_bytes_per_save"] = (root / "full.npy").stat().st_size
    embedded = await _blobsdk_saves(report, "blobsdk", state, steps, root, cluster=False)
    await _blobsdk_saves(report, "blobsdk_cluster", _state(total, 1), steps, root, cluster=True)
    await _restore(report, root, state, embedded)
    _dcp(report, root, _state(total, 2))


def _ratios(report: Report) -> None:
    report.ratios["stall_cut"] = report.metrics["numpy_save_s"] / report.metrics["blobsdk_delta_stall_s"]
    report.ratios["bytes_vs_dirty"] = report.metrics["blobsdk_bytes_per_delta"] / report.metrics["dirty_bytes_per_step"]
    report.ratios["restore_vs_file"] = report.metrics["restore_mb_s"] / report.metrics["file_read_mb_s"]
    report.ratios["restore_vs_fresh_memory"] = report.metrics["restore_mb_s"] / report.metrics["fresh_memory_mb_s"]
    report.ratios["dcp_bytes_vs_filesystem"] = report.metrics["dcp_blob_second_bytes"] / report.metrics["dcp_fs_second_bytes"]
    report.goals.update(
        {
            "stall_cut": "goal >= 20",
            "bytes_vs_dirty": "goal <= 1.2",
            "restore_vs_file": "goal >= 0.5",
            "dcp_bytes_vs_filesystem": "goal <= 0.2",
        }
    )


async def _blobsdk_saves(report: Report, name: str, state: dict[str, Any], steps: int, root: Path, *, cluster: bool) -> Path:
    """``steps`` saves (the first full, then deltas); the store's directory."""
    rng = np.random.default_rng(7)
    write = WriteConfig(compression="none")
    store = root / name
    if cluster:
        async with start_cluster(store, block_servers=1, l3_nodes=0, trackers=0) as running:
            assert running.config is not None
            config = msgspec.structs.replace(running.config, write=write)
            async with blobsdk.Client(config) as client:
                await _saves(report, name, client, state, steps, rng, lambda: _du(store / "blocks-0"))
    else:
        async with blobsdk.Client.local(store, write=write) as client:
            await _saves(report, name, client, state, steps, rng, lambda: _du(store / "blocks"))
    return store


async def _saves(
    report: Report, name: str, client: blobsdk.Client, state: dict[str, Any], steps: int, rng: Any, du: Callable[[], int]
) -> None:
    ck = client.checkpoints("/ck/bench", keep=2, chunk_size=CHUNK)
    stalls, written, dirty = [], [], []
    for step in range(steps):
        changed = _dirty(state, rng) if step else 0
        before = du()
        begun = time.perf_counter()
        pending = await ck.save(step, state)
        stall = time.perf_counter() - begun
        await pending.wait()
        if step == 0:
            report.metrics[f"{name}_first_stall_s"] = stall
            continue
        stalls.append(stall)
        written.append(du() - before)
        dirty.append(changed)
    report.metrics[f"{name}_delta_stall_s"] = median(stalls)
    report.metrics[f"{name}_bytes_per_delta"] = median(written)
    report.metrics["dirty_bytes_per_step"] = median(dirty)


async def _restore(report: Report, root: Path, state: dict[str, Any], store: Path) -> None:
    """The median of 3 reads of the numpy file, and of 3 loads, each by a fresh client (L1
    empty), each result freed before the next, every one of them in memory fresh from the
    kernel, as a restarted process's is: the allocator maps every large array anew
    (``_fresh_allocations``) where it would hand a read the last one's freed pages (then the
    file read is a memcpy into warm memory: 10-16 GB/s here), and numpy's arrays are not
    advised for huge pages, as blobsdk's buffers are not (see blobsdk/runtime/buffers.py).

    Not keeping the results matters on this VM: past a few GiB the kernel hands out pages
    the host must back first, and a page fault costs 5x more; the full run's loads took
    1.2 s, then 3.5 and 3.7 s (sys time) while the earlier results were kept, and the file
    read fell to 0.46 GB/s.  ``fresh_memory_mb_s`` is the floor of both: writing that much
    fresh memory once."""
    nbytes = sum(a.nbytes for a in state["model"].values())
    loads, checks = [], []
    with _fresh_allocations():
        reads = [_timed(lambda: _numpy_load(root / "full.npy", len(state["model"]))) for _ in range(3)]
        touches = [_timed(lambda: np.ones(nbytes, dtype=np.uint8)) for _ in range(3)]
        for _ in range(3):
            async with blobsdk.Client.local(store) as client:
                begun = time.perf_counter()
                loaded = await client.checkpoints("/ck/bench").load()
                loads.append(time.perf_counter() - begun)
                checks.append(await _check_time(client, loaded))
            assert all(np.array_equal(loaded["model"][k], v) for k, v in state["model"].items()), "restore is not exact"
            del loaded
    report.metrics["file_read_mb_s"] = nbytes / median(reads) / 1e6
    report.metrics["fresh_memory_mb_s"] = nbytes / median(touches) / 1e6
    report.metrics["restore_mb_s"] = nbytes / median(loads) / 1e6
    report.metrics["restore_check_s"] = median(checks)
    shares = [check / load for check, load in zip(checks, loads, strict=True)]
    report.ratios.update(
        restore_check_share=median(shares), restore_check_share_min=min(shares), restore_check_share_max=max(shares)
    )


async def _check_time(client: blobsdk.Client, loaded: dict[str, Any]) -> float:
    """Seconds the restore's digest check (blobsdk/write/restore.py) takes alone over the
    arrays a load returned, on the client's executor, as the load ran it."""
    manifest = await client.checkpoints("/ck/bench").manifest()
    memories = [memoryview(loaded[e.name[0]][e.name[1]].reshape(-1).view(np.uint8)) for e in manifest.entries]
    begun = time.perf_counter()
    await restore._check_digests(manifest, memories, client._open.executor, "bench")
    return time.perf_counter() - begun


@contextlib.contextmanager
def _fresh_allocations() -> Iterator[None]:
    """numpy without huge pages, and glibc mapping every allocation of 128 KiB or more anew
    (``M_MMAP_THRESHOLD``: freed, it goes back to the kernel, not into the heap for the next;
    for the rest of the run, as glibc has no way back to its dynamic threshold)."""
    from numpy._core.multiarray import _set_madvise_hugepage

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    m_mmap_threshold = -3
    was = _set_madvise_hugepage(False)
    libc.mallopt(m_mmap_threshold, 128 << 10)
    try:
        yield
    finally:
        _set_madvise_hugepage(was)


def _dcp(report: Report, root: Path, state: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp

    from blobsdk.torch import BlobStorageWriter

    rng = np.random.default_rng(11)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        for step in range(2):
            if step:
                _dirty(state, rng)
            path = root / f"dcp-fs-{step}"
            report.metrics[f"dcp_fs_{'first' if not step else 'second'}_s"] = _timed(
                lambda p=path: dcp.save(_dcp_state(state), storage_writer=dcp.FileSystemWriter(p))  # type: ignore[misc]
            )
            report.metrics[f"dcp_fs_{'first' if not step else 'second'}_bytes"] = _du(path)
        state = _state(len(state["model"]) * state["model"]["layer00"].nbytes, 2)
        rng = np.random.default_rng(11)
        blocks = root / "dcp-blob" / "blocks"
        with BlobStorageWriter.local(root / "dcp-blob", "/ck/dcp", chunk_size=CHUNK) as writer:
            for step in range(2):
                if step:
                    _dirty(state, rng)
                before = _du(blocks) if blocks.exists() else 0
                label = "first" if not step else "second"
                report.metrics[f"dcp_blob_{label}_s"] = _timed(lambda: dcp.save(_dcp_state(state), storage_writer=writer))
                report.metrics[f"dcp_blob_{label}_bytes"] = _du(blocks) - before
