"""What an installed blobsdk tells its user about itself: its version (``blobsdk.__version__``,
``blobsdk --version``), its type information (``py.typed``) and its licence."""

from __future__ import annotations

import tomllib
from importlib import metadata

import blobsdk
from blobsdk._version import UNKNOWN, installed_version
from tests.helpers import ROOT
from tests.test_cli import run

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
