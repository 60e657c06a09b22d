"""The fixtures fsspec's abstract test suite needs, for ``blob://`` over an embedded store
(wired as fsspec's own memory_fixtures.py and s3fs's derived tests are)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fsspec.tests.abstract import AbstractFixtures

from blobsdk.config import ClientConfig, WriteConfig
from blobsdk.fsspec import BlobFileSystem

# Small chunks and blocks, so test blobs span several chunks and ranged reads cross them.
SMALL_WRITE = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)
SMALL = ClientConfig(write=SMALL_WRITE)


def local_fs(root: Path) -> BlobFileSystem:
    """A fresh (uncached) filesystem over an embedded store in ``root``."""
    return BlobFileSystem(local=root, config=SMALL, skip_instance_cache=True)


class BlobFixtures(AbstractFixtures):
    @pytest.fixture
    def fs(self, tmp_path: Path) -> Iterator[BlobFileSystem]:
        with local_fs(tmp_path / "store") as fs:
            yield fs

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return lambda *args: "/".join(args)

    @pytest.fixture
    def fs_path(self) -> str:
        return "bucket"

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # a directory is the blobs below it, as in s3fs
