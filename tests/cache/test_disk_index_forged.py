"""A forged index file (blobsdk/cache/_indexfile.py): another process sharing the directory
may write ``root/INDEX`` with a valid checksum and any entries.  Each entry is checked where
it enters; a bad one is dropped, with one warning per open however many there are, and no
trim, sweep or reconciliation ever names a path outside the root."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from blobsdk.cache._diskfiles import with_file
from blobsdk.runtime.rootdir import RootDir, UnsafeEntry, create_temp, open_regular, remove_if_dead, unlink_at

from .test_disk import open_cache

PATH32 = "../../../../../victim/victim.txt"  # a path of 32 characters, as long as a chunk key


@pytest.fixture
def share(tmp_path: Path) -> tuple[Path, Path]:
    """``(root, victim)``: a cache root two levels down and a file outside it that a key of
    ``../victim/victim.txt`` would name from the root's parent."""
    root, victim = tmp_path / "share" / "l2", tmp_path / "victim" / "victim.txt"
    root.mkdir(parents=True)
    victim.parent.mkdir()
    victim.write_bytes(b"not the cache's")
    return root, victim


def test_no_file_operation_of_a_root_names_a_path_outside_it(share: tuple[Path, Path]) -> None:
    """Defence in depth below the index file's checks: a shard that is not two hex digits, a
    file name that is a path, and a cache key that is not a chunk key are refused by the
    operations themselves (before: ``..`` opened the root's parent and a path unlinked the
    victim)."""
    root, victim = share
    (root / "ab").mkdir()
    where = RootDir(root, label="cache test", log=logging.getLogger("test"))
    with pytest.raises(UnsafeEntry) as refused:
        where.open_shard("..")
    assert str(refused.value) == f"'{root}/..': not a name of a shard directory (nothing is named outside the root)"
    fd = where.open_shard("ab")
    try:
        for name in ("../../victim/victim.txt", "..", "", "a\0b"):
            for operation in (lambda n: unlink_at(fd, n), lambda n: open_regular(fd, n, n), lambda n: create_temp(fd, n, "t")):
                with pytest.raises(UnsafeEntry) as refused:
                    operation(name)
                assert (
                    str(refused.value) == f"{name!r}: not a name of a file in its directory (nothing is named outside the root)"
                )
            assert not remove_if_dead(fd, name)
    finally:
        os.close(fd)
    cache = open_cache(root)
    assert not cache._remove(PATH32)  # a victim listed by a forged index file: nothing to remove
    with pytest.raises(UnsafeEntry) as refused:
        with_file(cache._dir, PATH32, lambda fd, key: None)
    assert str(refused.value) == f"{PATH32!r}: not a name of a cache entry's file (nothing is named outside the root)"
    assert victim.read_bytes() == b"not the cache's"
