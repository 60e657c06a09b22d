"""Every script in examples/ runs as a user would run it (``python examples/X.py``, no
arguments) and prints what it did: they cannot rot.

As a user runs it means from the installed package: the venv's python, an environment with
no ``PYTHONPATH``, a working directory outside the checkout.  ``import blobsdk`` then finds
the package through the install alone (an editable install's finder maps it to a checkout's
files, never ``sys.path``), as does ``import blobsdk_servers``; ``servers`` (the checkout's
name for the servers) is not importable there.
"""

from __future__ import annotations

import json
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


# Runs the script as ``python SCRIPT`` does (``sys.argv``, the script's directory first on
# ``sys.path``, ``__main__``), then records, in the example's own process, where its imports
# came from and what its environment was.
_RECORDING = """
import atexit, json, os, runpy, sys
record, script = sys.argv[1:]

def _record():
    modules = {name: getattr(sys.modules.get(name), "__file__", None) for name in ("blobsdk", "blobsdk_servers", "servers")}
    facts = {"modules": modules, "PYTHONPATH": os.environ.get("PYTHONPATH"), "cwd": os.getcwd(), "path": sys.path}
    with open(record, "w") as out:
        json.dump(facts, out)

atexit.register(_record)
sys.argv = [script]
sys.path[0] = os.path.dirname(script)
runpy.run_path(script, run_name="__main__")
"""


def clean_env(tmp: Path) -> dict[str, str]:
    """A user's shell with the venv activated: its bin first on PATH, HOME, no PYTHONPATH."""
    kept = {key: os.environ[key] for key in ("HOME", "LANG", "USER") if key in os.environ}
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    return {**kept, "PATH": path, "TMPDIR": str(tmp)}


def installed_blobsdk(cwd: Path) -> str:
    """Where the installed package is: ``python -I`` reads neither PYTHONPATH nor the working
    directory, so only the install can put blobsdk on its path."""
    code = "import blobsdk; print(blobsdk.__file__)"
    found = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
    return found.stdout.strip()


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_the_example_runs_and_says_what_it_did(script: str, tmp_path: Path):
    work = tmp_path / "work"  # the working directory and TMPDIR
    work.mkdir()
    env = clean_env(work)
    record = tmp_path / "record.json"
    argv = [sys.executable, "-c", _RECORDING, str(record), str(EXAMPLES / script)]
    result = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    missing = [line for line in EXPECTED[script] if line not in result.stdout]
    assert not missing, f"{script} did not print {missing}; it printed:\n{result.stdout}"
    assert list(work.iterdir()) == [], "an example leaves nothing behind in its temporary directory"
    facts = json.loads(record.read_text())
    assert facts["PYTHONPATH"] is None and Path(facts["cwd"]) == work and not work.is_relative_to(ROOT)
    assert str(ROOT) not in facts["path"] and "" not in facts["path"]
    assert facts["modules"]["blobsdk"] == installed_blobsdk(work) and facts["modules"]["servers"] is None
