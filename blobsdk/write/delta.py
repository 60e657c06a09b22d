"""What changed in a chunk: the byte runs where its new bytes differ from the mirror's copy
of its previous version (blobsdk/write/stage.py), found at ``granule`` resolution with numpy.
A changed chunk is then stored as a patch of those runs (blobsdk/write/patch.py).
"""

from __future__ import annotations

import math
from typing import Any

from ..sources import Buffer

Run = tuple[int, int]  # [start, end) bytes of a chunk


def changed_runs(old: Buffer, new: Buffer, granule: int) -> list[Run]:
    """The ``[start, end)`` byte ranges where ``new`` differs from ``old`` (buffers of one
    length), in ``granule``-byte granules: a granule is dirty if any of its bytes differs (the
    last one may be short), and adjacent dirty granules form one run.

    Cost: one pass over both buffers, comparing them as the widest words (up to 8 bytes) that
    the granule and both buffers' alignment allow; temporaries are one bool per word and one
    per granule, never an index per byte.  A granule that is a multiple of 64 bytes is the
    fastest (about a cold memcpy's time).  Needs numpy: the caller uses this only when numpy
    imports (it is not a core dependency of blobsdk)."""
    import numpy as np

    if not isinstance(granule, int) or isinstance(granule, bool) or granule < 1:
        raise ValueError(f"granule must be an int >= 1, got {granule!r}")
    a = np.frombuffer(memoryview(old).cast("B"), np.uint8)
    b = np.frombuffer(memoryview(new).cast("B"), np.uint8)
    if len(a) != len(b):
        raise ValueError(f"old and new differ in length: {len(a)} and {len(b)} bytes")
    body = len(a) - len(a) % granule
    dirty = _dirty_granules(a[:body], b[:body], granule)
    if body < len(a):
        dirty = np.append(dirty, not np.array_equal(a[body:], b[body:]))
    edges = np.flatnonzero(np.diff(dirty, prepend=False, append=False)) * granule
    return list(zip(edges[0::2].tolist(), np.minimum(edges[1::2], len(a)).tolist(), strict=True))


def _dirty_granules(a: Any, b: Any, granule: int) -> Any:
    """One bool per ``granule`` bytes of ``a`` and ``b`` (uint8 arrays, a whole number of
    granules): whether they differ there."""
    import numpy as np

    width = math.gcd(granule, 8, a.ctypes.data, b.ctypes.data)  # bytes per word compared
    word = np.dtype(f"<u{width}")
    differs = a.view(word) != b.view(word)
    return _any_per_row(differs.reshape(-1, granule // width))


def _any_per_row(differs: Any) -> Any:
    """``differs.any(axis=1)``, fast for short rows too: 8 flags are read as one word, and a
    row of a few words is OR-ed column by column (numpy's reduction is slow across short rows)."""
    import numpy as np

    words = differs.shape[1]
    if words % 8 == 0:
        differs, words = differs.view(np.uint64), words // 8
    if words == 1:
        return differs[:, 0].astype(bool)
    if words > 16:
        return differs.any(axis=1)
    out = differs[:, 0].astype(bool)
    for column in range(1, words):
        out |= differs[:, column].astype(bool)
    return out
