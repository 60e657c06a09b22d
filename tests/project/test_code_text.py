"""The code says why in its own words: no docstring or comment of blobsdk/, servers/ or
benchmarks/ points at an issue number, which says nothing to a reader without the tracker."""

from __future__ import annotations

import re

from tests.helpers import ROOT

ISSUE_REF = re.compile(r"\b[Ii]ssues? #?\d+")


def test_no_code_refers_to_an_issue_number():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("blobsdk", "servers", "benchmarks")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_REF.search(line)
    ]
    assert found == []
