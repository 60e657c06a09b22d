"""tests/ mirrors the code (docs/development.md): each folder of tests is a package of blobsdk/,
or servers/, the benchmarks' code or the repository as a whole; a test file at the top tests a
top-level module; and each folder is a package, so two files of one name in two folders
(tests/sources/test_http.py, tests/metadata/test_http.py) import as two modules."""

from __future__ import annotations

from tests.helpers import ROOT

TESTS = ROOT / "tests"
OTHERS = {"servers", "benchmarks", "project"}
PACKAGES = {path.parent.name for path in (ROOT / "blobsdk").glob("*/__init__.py")}


def test_every_test_folder_mirrors_a_package() -> None:
    folders = {path.parent.relative_to(TESTS).parts[0] for path in TESTS.glob("*/**/test_*.py")}
    assert sorted(folders - PACKAGES - OTHERS) == []


def test_no_test_file_at_the_top_is_named_for_a_package() -> None:
    flat = sorted(path.name for path in TESTS.glob("test_*.py") if path.stem.split("_")[1] in PACKAGES | OTHERS)
    assert flat == [], f"move them into the package's folder: {flat}"


def test_every_test_folder_is_a_package() -> None:
    folders = {path.parent for path in TESTS.rglob("test_*.py")}
    loose = sorted(str(folder.relative_to(ROOT)) for folder in folders if not (folder / "__init__.py").exists())
    assert loose == [], f"add an __init__.py to: {loose}"
