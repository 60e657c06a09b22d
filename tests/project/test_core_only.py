"""`make demo` installs only the core (``pip install -e .``, no extras): the demo, the swarm
and every server and client module they run must work without the extras and dev tools.

Each check runs in a child process whose imports of those packages fail, as in a venv
that lacks them (a fresh one is the real proof: see the Makefile's ``$(CORE)`` stamp).
"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

# Packages of the extras (torch, fsspec, s3, redis, testing) and of dev: none is in a core install.
NOT_CORE = (
    *("torch", "torchdata", "fsspec", "obstore", "redis", "numpy", "pyarrow", "pandas", "boto3", "botocore", "moto"),
    *("pytest", "_pytest", "pytest_asyncio"),
)

_BLOCKER = f"""
import sys
class NotCore:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_CORE!r}:
            raise ImportError(f"{{name}} is not in a core install")
        return None
sys.meta_path.insert(0, NotCore())
"""

# What `make demo` runs: the demo, and servers.swarm's cluster (API, block servers, tracker)
# and its readers (clients with a peer server and trackers).
MODULES = (
    "blobsdk.cli",
    "blobsdk.demo",
    "blobsdk.tiers._peer",
    "blobsdk.peer.server",
    "blobsdk.peer.sharing",
    "blobsdk.peer.trackers",
    "servers.swarm",
    "servers.cluster",
    "servers.api",
    "servers.blockstore",
    "servers.tracker",
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_blocker_blocks():
    done = _run("import numpy")
    assert done.returncode == 1 and "ImportError: numpy is not in a core install" in done.stderr


def test_what_make_demo_runs_imports_no_extra():
    done = _run(f"import importlib\nfor m in {MODULES!r}: importlib.import_module(m)\nprint('ok')")
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_the_demo_runs_without_the_extras(tmp_path):
    done = _run(f"from blobsdk.cli import main\nsys.exit(main(['demo', '--dir', {str(tmp_path)!r}, '--size-mb', '1']))")
    assert done.returncode == 0, done.stderr
    assert "OK: every byte verified" in done.stdout


# Every role package's face (blobsdk/*/__init__.py): importing one loads no extra, and each
# is imported first, in a process of its own, with blobsdk's own face left out (an empty
# package in its place): a face runs before any module of its package, so a loop between
# faces shows only in the order they are met, and blobsdk's face would fix that order.
FACES = tuple(
    f"blobsdk.{p.parent.name}" for p in sorted((ROOT / "blobsdk").glob("*/__init__.py")) if not p.parent.name.startswith("_")
)


_NO_TOP_FACE = f"""
import types
top = types.ModuleType("blobsdk")
top.__path__ = [{str(ROOT / "blobsdk")!r}]
sys.modules["blobsdk"] = top
"""


def test_every_face_imports_first_and_without_the_extras():
    assert len(FACES) >= 14 and "blobsdk.sources" in FACES
    failed = {}
    for face in ("blobsdk.wire", *FACES):
        done = _run(f"{_NO_TOP_FACE}import {face}\nprint('ok')")
        if done.returncode != 0 or done.stdout != "ok\n":
            failed[face] = done.stderr.strip().splitlines()[-1:]
    assert not failed, failed


# Each module that imports an extra's packages: its extra (pyproject.toml) and the package it
# imports first.
NEEDS_AN_EXTRA = {
    "blobsdk.torch": ("torch", "torch"),
    "blobsdk.dcp": ("torch", "torch"),
    "blobsdk.fsspec": ("fsspec", "fsspec"),
    "blobsdk.sources._s3": ("s3", "obstore"),
    "blobsdk.metadata._redis": ("redis", "redis"),
    "blobsdk.metadata._shared": ("redis", "redis"),
}
# A backend behind a face names the name users import (the face's), not its private module.
NAMED_AS = {
    "blobsdk.sources._s3": "blobsdk.sources.S3BlockStore",
    "blobsdk.metadata._redis": "blobsdk.metadata.RedisMetadataStore",
    "blobsdk.metadata._shared": "blobsdk.metadata.SharedPlanCache",
}


def test_a_module_that_needs_an_extra_says_which():
    """In a core install each names its extra (MissingExtra, an ImportError), not only the
    missing package; tests/project/test_packaging.py checks the rest in the test process."""
    code = f"""
import importlib
from blobsdk.errors import MissingExtra
for m in {list(NEEDS_AN_EXTRA)!r}:
    try:
        importlib.import_module(m)
    except MissingExtra as exc:
        print(isinstance(exc, ImportError), exc)
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"True {NAMED_AS.get(module, module)} needs the {extra!r} extra: "
        f"pip install -e '{ROOT}[{extra}]' ({package} is not in a core install)"
        for module, (extra, package) in NEEDS_AN_EXTRA.items()
    ]


# The conformance suites a backend's own tests subclass (docs/testing.md): pytest is theirs alone.
SUITES = ("blobsdk.testing.cache", "blobsdk.testing.metadata", "blobsdk.testing.reserved", "blobsdk.testing.sources")


def test_blobsdk_imports_no_pytest_and_the_suites_name_the_testing_extra():
    """``import blobsdk`` (and its testing package, and the plans the suites commit) needs no
    pytest; a suite itself says which extra brings it."""
    code = f"""
import importlib
import blobsdk, blobsdk.testing, blobsdk.testing.plans
from blobsdk.errors import MissingExtra
print("imported")
for m in {SUITES!r}:
    try:
        importlib.import_module(m)
    except MissingExtra as exc:
        print(exc)
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    said = f"blobsdk.testing needs the 'testing' extra: pip install -e '{ROOT}[testing]' (pytest is not in a core install)"
    assert done.stdout.splitlines() == ["imported"] + [said] * len(SUITES)
