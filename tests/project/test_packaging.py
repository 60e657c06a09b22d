"""What an installed blobsdk tells its user about itself: its version (``blobsdk.__version__``,
``blobsdk --version``), its type information (``py.typed``), its licence, and which extra to
install when a module needs one (``MissingExtra``).

The extras are taken away in this process: the extra's modules are dropped from
``sys.modules`` and a finder refuses them as an uninstalled package is refused (``No module
named ...``), then the module under test is imported afresh.  ``monkeypatch`` puts every
module back after the test.  tests/project/test_core_only.py checks the same in a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.abc
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import blobsdk
from blobsdk import Client, ClientConfig, MissingExtra
from blobsdk._extras import install_command, pip_install
from blobsdk._version import UNKNOWN, installed_version
from tests.cli.test_cli import run
from tests.helpers import ROOT

# --- version, py.typed, licence -------------------------------------------------------------


def test_the_version_is_the_installed_distributions():
    assert blobsdk.__version__ == metadata.version("blobsdk") and "__version__" in blobsdk.__all__
    assert run("--version").stdout.decode() == f"blobsdk {blobsdk.__version__}\n"


def test_a_checkout_never_installed_has_a_pep440_version():
    assert installed_version("blobsdk-no-such-distribution") == UNKNOWN == "0+unknown"


def test_py_typed_is_shipped():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["blobsdk"] == ["py.typed"]
    assert (ROOT / "blobsdk" / "py.typed").is_file()


def test_the_licence_is_apache_2():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "\n   Copyright 2026 the blobsdk authors\n" in text and "[yyyy]" not in text


# --- what the wheel installs -------------------------------------------------------------------


# What building the wheel reads of the tree.
BUILT_FROM = ("pyproject.toml", "README.md", "LICENSE", "blobsdk", "servers")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree (no network: the venv's setuptools builds it), from a
    copy of it: setuptools builds in the tree's build/ and never removes a module from there,
    so a build in the checkout after a module was renamed would ship the old name as well."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "-w", str(out), str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("blobsdk-*.whl")
    return built


def _repo_modules(directory: str, installed_as: str) -> set[str]:
    return {f"{installed_as}/{p.relative_to(ROOT / directory).as_posix()}" for p in (ROOT / directory).rglob("*.py")}


def test_the_wheel_installs_blobsdk_and_its_servers_under_unambiguous_names(wheel: Path):
    """No ``servers`` or ``benchmarks`` at site-packages' top level: the servers are
    ``blobsdk_servers``, and every module of blobsdk/ and servers/ is in the wheel."""
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"blobsdk", "blobsdk_servers", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "blobsdk/py.typed" in names
    shipped = {n for n in names if n.endswith(".py")}
    assert shipped == _repo_modules("blobsdk", "blobsdk") | _repo_modules("servers", "blobsdk_servers")
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in ("blobsdk-cluster", "blobsdk-api", "blobsdk-blockstore", "blobsdk-flash", "blobsdk-tracker", "blobsdk-testbed"):
        assert f"{script} = blobsdk_servers." in entry_points
    assert "blobsdk_servers.testing = blobsdk_servers.testing" in entry_points


def test_the_installed_servers_run_without_the_checkout(wheel: Path, tmp_path: Path):
    """The wheel unpacked on its own, away from the checkout: each server module imports from
    there (every import inside servers/ is relative) and ``--help`` names it as installed."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import importlib, sys\n"
        "for name in ('api', 'blockstore', 'flash', 'tracker', 'cluster', 'testing'):\n"
        "    module = importlib.import_module('blobsdk_servers.' + name)\n"
        "    assert module.__file__.startswith(sys.argv[1]), module.__file__\n"
        "assert 'servers' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path, env=env, check=True, timeout=120)
    shown = subprocess.run(
        [sys.executable, "-m", "blobsdk_servers.cluster", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: python -m blobsdk_servers.cluster ")


def test_the_conformance_suites_import_from_the_installed_wheel(wheel: Path, tmp_path: Path):
    """A backend's tests import the suites from the install, not from a checkout's tests/."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import importlib, sys\n"
        "for name in ('cache', 'metadata', 'plans', 'reserved', 'sources'):\n"
        "    module = importlib.import_module('blobsdk.testing.' + name)\n"
        "    assert module.__file__.startswith(sys.argv[1]), module.__file__\n"
        "from blobsdk.testing.metadata import MetadataStoreTests, PlanReaderTests\n"
        "assert issubclass(MetadataStoreTests, PlanReaderTests) and 'tests' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path, env=env, check=True, timeout=120)


# --- missing extras ---------------------------------------------------------------------------


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Refuses ``packages`` (and their submodules) as an environment without them does."""

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = set(packages)

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> None:
        if name.split(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _without(monkeypatch: pytest.MonkeyPatch, packages: Sequence[str], *forget: str) -> None:
    """From here to the test's end, ``packages`` are not installed and the ``forget`` modules
    are not imported yet."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages or name in forget:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(packages), *sys.meta_path])


def _message(module: str, extra: str, missing: str) -> str:
    """What a checkout says (these tests run blobsdk from this tree): the extra, installed into it.
    A backend behind a face is named as users import it (``NAMED_AS``)."""
    named = NAMED_AS.get(module, module)
    return f"{named} needs the {extra!r} extra: pip install -e '{ROOT}[{extra}]' (No module named {missing!r})"


NAMED_AS = {
    "blobsdk.sources._s3": "blobsdk.sources.S3BlockStore",
    "blobsdk.metadata._redis": "blobsdk.metadata.RedisMetadataStore",
    "blobsdk.metadata._shared": "blobsdk.metadata.SharedPlanCache",
}


GUARDED = [  # module, its extra, the extra's packages (torch's: in a process of its own, below)
    ("blobsdk.fsspec", "fsspec", ("fsspec",)),
    ("blobsdk.sources._s3", "s3", ("obstore",)),
    ("blobsdk.sources._s3obstore", "s3", ("obstore",)),
    ("blobsdk.metadata._redis", "redis", ("redis",)),
    ("blobsdk.metadata._shared", "redis", ("redis",)),
]


@pytest.mark.parametrize(("module", "extra", "packages"), GUARDED)
def test_a_module_names_the_extra_it_needs(monkeypatch, module, extra, packages):
    importlib.import_module(module)  # it imports with the extra installed
    _without(monkeypatch, packages, module)
    with pytest.raises(MissingExtra) as caught:
        importlib.import_module(module)
    assert str(caught.value) == _message(module, extra, packages[0])
    assert isinstance(caught.value, ImportError) and caught.value.name == packages[0]
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)
    assert module not in sys.modules  # a later import (with the extra installed) starts afresh


S3_SOURCE = {"api_url": "http://127.0.0.1:9", "source_url": "s3://bucket/dir"}
REDIS_METADATA = {"metadata_url": "redis://127.0.0.1:9/0", "block_urls": ["http://127.0.0.1:9"]}


@pytest.mark.parametrize(
    ("settings", "module", "extra", "package"),
    [(S3_SOURCE, "blobsdk.sources._s3", "s3", "obstore"), (REDIS_METADATA, "blobsdk.metadata._redis", "redis", "redis")],
)
async def test_a_client_config_names_the_extra_its_stores_need(monkeypatch, settings, module, extra, package):
    """The config is valid without the extra; opening the client is what needs it."""
    config = ClientConfig.from_dict(settings)
    _without(monkeypatch, [package], module, "blobsdk.sources._s3obstore")
    with pytest.raises(MissingExtra) as caught:
        async with Client(config):
            pass
    assert str(caught.value) == _message(module, extra, package)


def test_the_cli_says_which_extra_to_install(monkeypatch, tmp_path: Path):
    """Exit 1, one line, no traceback."""
    (tmp_path / "client.toml").write_text('api_url = "http://127.0.0.1:9"\nsource_url = "s3://bucket/dir"\n')
    _without(monkeypatch, ["obstore"], "blobsdk.sources._s3", "blobsdk.sources._s3obstore")
    result = run("--config", str(tmp_path / "client.toml"), "ls", "/bucket/")
    assert result.returncode == 1 and result.stdout == b""
    assert result.stderr.decode() == f"blobsdk: error: {_message('blobsdk.sources._s3', 's3', 'obstore')}\n"


WITHOUT_TORCH = """
import importlib.abc, json, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchdata"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
from blobsdk.errors import MissingExtra
from blobsdk.write.leaves import Entry, value_of

said = {}
for module in ("blobsdk.torch", "blobsdk.dcp"):
    try:
        __import__(module)
    except MissingExtra as exc:
        said[module] = [str(exc), isinstance(exc, ImportError), exc.name]
try:
    value_of(Entry(name=("w",), kind="tensor", dtype="float32", shape=(0,)), memoryview(b""))
except MissingExtra as exc:
    said["checkpoint"] = [str(exc), isinstance(exc, ImportError), exc.name]
print(json.dumps(said))
"""


def test_the_torch_extra_is_named_where_torch_is_missing():
    """In a process of its own: taking torch away in this one (and putting it back) reorders
    sys.modules, and torch's finalizers then run after its modules are torn down at exit."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loading = f"loading a checkpoint that holds tensors needs the 'torch' extra: pip install -e '{ROOT}[torch]'"
    assert json.loads(done.stdout) == {
        "blobsdk.torch": [_message("blobsdk.torch", "torch", "torch"), True, "torch"],
        "blobsdk.dcp": [_message("blobsdk.dcp", "torch", "torch"), True, "torch"],
        "checkpoint": [f"{loading} (No module named 'torch')", True, "torch"],
    }


def test_only_an_import_error_becomes_missing_extra():
    from blobsdk._extras import requires_extra

    with pytest.raises(ZeroDivisionError), requires_extra("torch", "here"):
        _ = 1 / 0


# --- which pip install a MissingExtra names -----------------------------------------------------


def _tree(root: Path, pyproject: str | None) -> Path:
    """``root`` holding a package directory ``blobsdk`` (and ``pyproject`` as pyproject.toml)."""
    (root / "blobsdk").mkdir(parents=True)
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    return root / "blobsdk"


def _dist_info(site: Path, direct_url: object | None) -> None:
    """A blobsdk distribution's metadata in ``site``, as pip writes it (PEP 610's direct_url.json)."""
    info = site / "blobsdk-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: blobsdk\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_a_checkout_is_told_to_install_the_extra_into_itself(tmp_path: Path):
    """A clone (its pyproject.toml is blobsdk's): an index has no distribution built from it."""
    package = _tree(tmp_path / "my clone", '[project]\nname = "blobsdk"\nversion = "0.1.0"\n')
    assert install_command("torch", package) == f"pip install -e '{tmp_path}/my clone[torch]'"
    assert pip_install("fsspec") == f"pip install -e '{ROOT}[fsspec]'"  # these tests run blobsdk from this tree


@pytest.mark.parametrize(
    "pyproject",
    [None, '[project]\nname = "other"\n', "[project\n", '[build-system]\nrequires = ["setuptools"]\n', "project = 3\n"],
)
def test_anything_but_a_checkout_or_a_local_directory_is_told_the_index_install(tmp_path: Path, pyproject: str | None):
    """site-packages, or a tree whose pyproject.toml is another project's, broken, or has no
    project: the index's distribution."""
    package = _tree(tmp_path / "site", pyproject)
    assert install_command("torch", package) == "pip install 'blobsdk[torch]'"


@pytest.mark.parametrize(
    ("direct_url", "command"),
    [
        ({"url": "file:///src/blob%20sdk", "dir_info": {}}, "pip install '/src/blob sdk[redis]'"),
        ({"url": "file:///wheels/blobsdk-0.1.0-py3-none-any.whl", "archive_info": {}}, "pip install 'blobsdk[redis]'"),
        ({"url": "https://example.com/blobsdk", "dir_info": {}}, "pip install 'blobsdk[redis]'"),
        ({"dir_info": {}}, "pip install 'blobsdk[redis]'"),
        ("file:///src", "pip install 'blobsdk[redis]'"),
        (None, "pip install 'blobsdk[redis]'"),
    ],
)
def test_an_install_from_a_local_directory_is_told_that_directory(tmp_path: Path, direct_url: object, command: str):
    """``pip install /src`` (a container's build): the directory it came from, as pip recorded it."""
    package = _tree(tmp_path / "site", None)
    _dist_info(tmp_path / "site", direct_url)
    assert install_command("redis", package) == command


def test_the_wheel_installed_names_the_index_install(wheel: Path, tmp_path: Path):
    """The wheel unpacked away from the checkout (no direct_url.json: not from a directory)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sys\n"
        "class NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'fsspec':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
        "try:\n"
        "    import blobsdk.fsspec\n"
        "except ImportError as exc:\n"
        "    assert type(exc).__name__ == 'MissingExtra' and sys.modules['blobsdk'].__file__.startswith(sys.argv[1])\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    argv = [sys.executable, "-c", code, str(site)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    said = "blobsdk.fsspec needs the 'fsspec' extra: pip install 'blobsdk[fsspec]' (No module named 'fsspec')"
    assert done.stdout == said + "\n"


WITHOUT_NUMPY = """
import asyncio, importlib.abc, json, sys, warnings

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "numpy":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
with warnings.catch_warnings(action="ignore"):  # torch says it found no numpy
    import torch
import blobsdk

async def main(root):
    said = {}

    async def attempt(what, work):
        try:
            await work
        except blobsdk.MissingExtra as exc:
            said[what] = [str(exc), exc.name]

    async with blobsdk.Client.local(root) as c:
        await c.put("/b/x", b"1234")
        await attempt("get_into", c.get_into("/b/x", torch.zeros(4, dtype=torch.uint8)))
        await attempt("get_many_into", c.get_many_into(["/b/x"], torch.zeros(4, dtype=torch.uint8)))
        ck = c.checkpoints("/b/ck")
        await attempt("save", ck.save(2, {"t": torch.zeros(4)}))
        await attempt("load arrays", ck.load(0))
        await attempt("load into", ck.load(1, into={"t": torch.zeros(4)}))
        said["load tensors"] = (await ck.load(1))["t"].tolist()  # torch.frombuffer: no numpy
        try:
            c.checkpoints("/b/mirrored", mirror=True)
        except blobsdk.MissingExtra as exc:
            said["mirror"] = [str(exc), exc.name]
    print(json.dumps(said))

asyncio.run(main(sys.argv[1]))
"""


async def test_what_needs_numpy_names_the_extra_that_brings_it(tmp_path: Path):
    """numpy made unimportable in a process of its own: torch imports without it (its wheels do
    not require it), but a tensor's bytes go through numpy, as does a loaded array."""
    import numpy as np
    import torch

    async with Client.local(tmp_path) as c:
        ck = c.checkpoints("/b/ck")
        await (await ck.save(0, {"a": np.arange(4, dtype=np.float32)})).wait()
        await (await ck.save(1, {"t": torch.arange(4, dtype=torch.float32)})).wait()
    argv = [sys.executable, "-c", WITHOUT_NUMPY, str(tmp_path)]
    run = functools.partial(subprocess.run, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    done = await asyncio.to_thread(run, argv)
    assert done.returncode == 0, done.stderr

    def said(needed_by: str, extra: str) -> list[str]:
        return [f"{needed_by} needs the {extra!r} extra: pip install -e '{ROOT}[{extra}]' (No module named 'numpy')", "numpy"]

    assert json.loads(done.stdout) == {
        "get_into": said("reading into a torch tensor (get_into)", "torch"),
        "get_many_into": said("reading into a torch tensor (get_many_into)", "torch"),
        "save": said("checkpointing a torch tensor", "torch"),
        "load arrays": said("loading a checkpoint that holds numpy arrays", "numpy"),
        "load into": said("restoring a checkpoint into a torch tensor", "torch"),
        "load tensors": [0.0, 1.0, 2.0, 3.0],
        "mirror": said("checkpoints(mirror=True)", "numpy"),
    }


def test_the_torch_extra_brings_numpy():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "numpy>=1.26" in extras["torch"] and extras["numpy"] == ["numpy>=1.26"]
