"""Every script in examples/ runs as a user would run it (``python examples/X.py``, no
arguments, in a fresh directory) and prints what it did: they cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

EXAMPLES = ROOT / "examples"
# script -> lines its output must hold (each a fact the script also asserts, or its last word)
EXPECTED = {
    "embedded.py": [
        "get /bucket/hello.txt: b'hello world'",
        "get a range: b'world'",
        "put_many: 100 small blobs, packed into shared blocks; first /bucket/samples/0000, last /bucket/samples/0099",
        "replaced as version 2",
        "deleted: a get is BlobNotFound",
        "SyncClient get: b'blocking code uses the same methods'",
        "embedded: done",
    ],
    "checkpoints.py": [
        "step 0: saved, 5.00 MiB written, 0.00 MiB named from earlier checkpoints",
        "step 3: saved, 0.25 MiB written, 4.75 MiB named from earlier checkpoints",
        "kept: steps [2, 3]",
        "loaded step 3: w1 float32(1024, 1024), exact",
        "load(select=...) read only ['w2']",
        "checkpoints: done",
    ],
    "fsspec_pandas.py": [
        "pandas wrote and read back blob://datasets/labels/part-0.parquet: 1000 rows, equal",
        "fs.ls('datasets/labels'): ['datasets/labels/part-0.parquet', 'datasets/labels/part-1.parquet']",
        "the file's last 4 bytes: b'PAR1' (parquet's magic)",
        "fsspec_pandas: done",
    ],
    "cluster_dataloader.py": [
        "wrote 64 samples of 256 KiB under /train/",
        "map-style: 64 samples through BlobDataset and BlobSampler",
        "cluster_dataloader: done",
    ],
    "s3_indexed.py": [
        "indexed in place: 20 of 20 objects (2000190 bytes), none copied",
        "get /datasets/train/007.jpg: 100007 bytes, verified",
        "after the object changed: SourceChanged: s3://lake/train/008.jpg changed since it was indexed",
        "indexed again: 1 changed object read, 19 unchanged not read",
        "s3_indexed: done",
    ],
}


def test_every_example_is_run():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_the_example_runs_and_says_what_it_did(script: str, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    missing = [line for line in EXPECTED[script] if line not in result.stdout]
    assert not missing, f"{script} did not print {missing}; it printed:\n{result.stdout}"
    assert list(tmp_path.iterdir()) == [], "an example leaves nothing behind in its temporary directory"
