"""The suite's own guard (tests/conftest.py): on a nearly full disk it stops at once with why,
instead of failing every disk-cache test (they keep 5% of their file system free)."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from tests import conftest

Usage = namedtuple("Usage", "total used free")


def test_the_suite_refuses_to_run_on_a_nearly_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(100 << 30, 96 << 30, 4 << 30))
    why = r"only 4\.0% \(4 GiB\) of the file system under .* free some space \(need 6%\)"
    with pytest.raises(pytest.exit.Exception, match=why):
        conftest.pytest_sessionstart(None)  # type: ignore[arg-type]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(100 << 30, 90 << 30, 10 << 30))
    conftest.pytest_sessionstart(None)  # type: ignore[arg-type]  # 10% free: runs
