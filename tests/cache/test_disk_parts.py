"""The disk cache is composed of objects, not mixed in: each part gets what it uses by its
constructor (blobsdk/cache/_diskstate.py); tests/project/test_no_mixins.py keeps every class
of blobsdk so."""

from __future__ import annotations

from blobsdk.cache import DiskCache
from blobsdk.runtime import AsyncResource


def test_the_disk_cache_holds_its_parts_rather_than_inheriting_them() -> None:
    assert DiskCache.__mro__ == (DiskCache, AsyncResource, object)
