"""One timed checkpoint write or read of benchmarks/dlio.py, in a process of its own (run in
.venv-dlio): ``python -m benchmarks._dlio_ckpt write|read dlio_default|blobsdk SIZE DIR``
prints ``{"seconds": ...}``.  The state is DLIO's model state, ``{"a": SIZE int8}``, of random
bytes; each mechanism saves it as its DLIO ``save_state`` does (see benchmarks/dlio.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from blobsdk.integrations.dliofiles import CheckpointStates, DlioSettings

NAME = "model-0-0-0"


def state(size: int, fill: bool) -> dict[str, torch.Tensor]:
    if fill:
        return {"a": torch.randint(-128, 128, (size,), dtype=torch.int8)}
    return {"a": torch.empty(size, dtype=torch.int8)}


def default(action: str, size: int, path: Path) -> float:
    if action == "write":
        data = state(size, True)
        start = time.perf_counter()
        with open(path, "wb") as f:  # DLIO's PyTorchCheckpointing.save_state, made durable
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - start
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: the read goes to the disk
    os.close(fd)
    start = time.perf_counter()
    loaded = torch.load(path)
    assert loaded["a"].numel() == size
    return time.perf_counter() - start


def blobsdk(action: str, size: int) -> float:
    states = CheckpointStates(DlioSettings.from_env())
    data = state(size, action == "write")
    start = time.perf_counter()
    if action == "write":
        states.save(NAME, data)
    else:
        states.load(NAME, data)
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    action, mechanism, size, root = argv[0], argv[1], int(argv[2]), Path(argv[3])
    seconds = default(action, size, root / f"{NAME}.pt") if mechanism == "dlio_default" else blobsdk(action, size)
    print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    main(sys.argv[1:])
