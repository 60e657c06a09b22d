"""An order of a cache's index that counts what the eviction policy walks (tests/cache/test_policy_*.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from blobsdk.cache.policy import Entry


class Walked(OrderedDict[str, Entry]):
    """An order of a cache's index that counts the entries its ``values()`` hands out (the
    eviction tests set it in place of an order, and ``walked`` to 0, then count)."""

    walked = 0

    def values(self) -> Iterator[Entry]:  # type: ignore[override]
        for entry in super().values():
            Walked.walked += 1
            yield entry
