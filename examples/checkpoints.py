"""Delta checkpoints: each save writes only the chunks that changed since the last one, in the
background, and commits atomically; load restores exact dtypes and shapes; the last ``keep``
are kept.  Needs numpy: the ``numpy`` extra, or ``torch`` (tensors work the same way), which
brings it; from a clone, ``pip install -e '.[numpy]'``.

    python examples/checkpoints.py [DIR]     # default: a temporary directory, removed at the end
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

import numpy as np

import blobsdk

MiB = 1 << 20


async def main(root: str) -> None:
    rng = np.random.default_rng(0)
    model = {"w1": rng.standard_normal((1024, 1024), dtype=np.float32), "w2": rng.standard_normal(256 * 1024, dtype=np.float32)}
    chunk = 256 * 1024  # the dedup grain (default: the write config's chunk_size, 4 MiB)
    async with blobsdk.Client.local(root) as c:
        ck = c.checkpoints("/ckpt/job1", keep=2, chunk_size=chunk)
        for step in range(4):
            if step:
                model["w1"][step * 64 : step * 64 + 64] += 1.0  # a training step changes a few rows
            state = {"model": model, "step": step, "lr": 0.1 / (step + 1)}
            pending = await ck.save(step, state)  # returns once the changed chunks are staged
            manifest = await pending.wait()  # ...and the model may change meanwhile
            print(
                f"step {step}: saved, {manifest.new_bytes / MiB:.2f} MiB written, "
                f"{manifest.reused_bytes / MiB:.2f} MiB named from earlier checkpoints"
            )
        print(f"kept: steps {await ck.list()}")
        restored = await ck.load()  # the latest
        assert restored["step"] == 3 and all(np.array_equal(restored["model"][k], model[k]) for k in model)
        print(f"loaded step {restored['step']}: w1 {restored['model']['w1'].dtype}{restored['model']['w1'].shape}, exact")
        only_w2 = await ck.load(select=lambda name: name == ("model", "w2"))
        print(f"load(select=...) read only {sorted(only_w2['model'])}")
    print("checkpoints: done")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="blobsdk-ckpt-") as tmp:
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
