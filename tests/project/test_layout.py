"""The tree's shape as tests: no module of blobsdk/, servers/ or benchmarks/ is over
``MAX_LINES`` lines (split one by role when it grows past), and docs/architecture.md's layout
names every module of blobsdk/ and servers/, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

MAX_LINES = 500
PACKAGES = ("blobsdk", "servers", "benchmarks")
# Over the bound while their split is under way elsewhere; the check below fails once one is
# under it, so this list empties as they land and cannot hide a module that grows.
PENDING: set[str] = set()  # none left: tail/race.py and read/readpath.py were the last

ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCUMENTED = ("blobsdk", "servers")
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_][\w.]*?(?:\.py|/))(?=\s|$)")


def line_counts(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """Each module's path (relative to ``root``) -> its number of lines."""
    return {
        str(path.relative_to(root)): len(path.read_text().splitlines())
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }


def too_long(counts: dict[str, int], pending: set[str] = PENDING) -> list[str]:
    return [f"{path}: {n} lines" for path, n in sorted(counts.items()) if n > MAX_LINES and path not in pending]


def test_no_module_is_over_the_bound() -> None:
    wrong = too_long(line_counts())
    assert not wrong, f"modules over {MAX_LINES} lines (split each by role):\n" + "\n".join(wrong)


def test_every_pending_module_is_still_over_the_bound() -> None:
    counts = line_counts()
    done = sorted(path for path in PENDING if counts.get(path, 0) <= MAX_LINES)
    assert not done, f"no longer over {MAX_LINES} lines (or gone): remove from PENDING: {', '.join(done)}"


def test_the_bound_names_each_module_over_it_with_its_count(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pkg" / "waiting.py").write_text("x = 1\n" * (MAX_LINES + 7))
    counts = line_counts(tmp_path, ("pkg",))
    assert too_long(counts, pending={"pkg/waiting.py"}) == [f"pkg/sub/big.py: {MAX_LINES + 1} lines"]


# --- docs/architecture.md names every module ------------------------------------------------


def layout_block(text: str) -> list[str]:
    """The lines of the code block under ``## Layout``."""
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("```\n", 2)[1].splitlines()


def named_modules(lines: list[str]) -> set[str]:
    """Every module the layout block names, as a path: an entry is a name ending in ``.py`` or
    ``/`` at the start of a line, inside the folder whose entry it is indented under."""
    folders: list[tuple[int, str]] = []  # (indent, path) of the open folders, outermost first
    named: set[str] = set()
    for line in lines:
        match = ENTRY.match(line)
        if match is None:
            continue  # a description's continuation line
        indent, name = len(match["indent"]), match["name"]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = "/".join([*(p for _, p in folders[-1:]), name]).replace("//", "/")
        if name.endswith("/"):
            folders.append((indent, path.rstrip("/")))
        else:
            named.add(path)
    return named


def modules(root: Path = ROOT) -> set[str]:
    """Every module of blobsdk/ and servers/ but the packages' ``__init__.py`` below the top."""
    found = set()
    for package in DOCUMENTED:
        for path in (root / package).rglob("*.py"):
            rel = str(path.relative_to(root))
            if path.name != "__init__.py" or path.parent == root / package:
                found.add(rel)
    return found


def test_the_architecture_names_every_module() -> None:
    named = named_modules(layout_block(ARCHITECTURE.read_text()))
    missing = sorted(modules() - named)
    assert not missing, "docs/architecture.md's layout does not name:\n" + "\n".join(missing)


def test_the_architecture_names_no_module_that_is_gone() -> None:
    named = named_modules(layout_block(ARCHITECTURE.read_text()))
    gone = sorted(path for path in named if not (ROOT / path).is_file())
    assert not gone, "docs/architecture.md's layout names modules that do not exist:\n" + "\n".join(gone)


def test_the_layout_reader_follows_folders_by_indentation() -> None:
    lines = [
        "pkg/            the package",
        "  a.py          first",
        "                its description, continued",
        "  sub/          a folder",
        "    b.py        in it",
        "  c.py          back in pkg",
        "other/          another",
        "  d.py          in other",
    ]
    assert named_modules(lines) == {"pkg/a.py", "pkg/sub/b.py", "pkg/c.py", "other/d.py"}
