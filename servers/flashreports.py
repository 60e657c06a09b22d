"""The flash node's bad-copy reports (servers/flash.py): collapsed per chunk, rate-limited
per tenant.

``POST /v1/chunks/{key}/bad?<ChunkRef>`` (the grant a GET of the chunk needs) tells the node
that a client got a bad copy of the chunk from it.  The node then verifies its file again by
a full read (servers/flashsend.py ``recheck``): up to a whole chunk read and hashed on the
cache's disk threads, which every hit's open waits for too.  So a report costs the node far
more than its request, and one tenant's flood of them (each a full re-read) would slow every
other tenant's hits.  Hence:

- **per chunk**: one re-verification in flight; a report arriving meanwhile waits for it and
  gets its answer.  A file a report found good is not verified again on reports for
  ``absorb_seconds`` (they are answered ``{"dropped": false}`` at once): a file that rots in
  that time is caught by the first report after it, and meanwhile every client verifies what
  it reads and reads a bad copy elsewhere.  A report of a chunk the node does not hold costs
  nothing and is answered the same.
- **per tenant**: a report that would start a re-verification spends a token of its tenant's
  bucket (``rate`` a second, ``burst`` at once; servers/_common/admission.py); without one it
  is 429 (``Overloaded``) and nothing is done.  The client ignores a failed report: its read
  goes on elsewhere either way.

The counters (``rechecked``, ``absorbed``, ``refused``) are on /stats and /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import cachetools

from blobsdk.cache import DiskCache
from blobsdk.errors import Overloaded
from blobsdk.runtime import SingleFlight

from ._common.admission import TenantBuckets
from .flashconfig import FlashConfig
from .flashsend import recheck

REMEMBERED = 65536  # chunks found good that are remembered for absorb_seconds


@dataclass
class ReportCounters:
    rechecked: int = 0  # reports that started a re-verification
    absorbed: int = 0  # reports answered by one in flight, a recent one, or an absent chunk
    refused: int = 0  # reports over their tenant's rate (429, nothing done)


class BadCopyReports:
    """The reports one node has taken (module docstring), at the node's ``config`` rates
    (report_rate, report_burst, report_absorb_seconds)."""

    def __init__(self, config: FlashConfig, *, clock: Callable[[], float] = time.monotonic):
        self.counters = ReportCounters()
        self._buckets = TenantBuckets(config.report_rate, config.report_burst, clock=clock)
        self._flights: SingleFlight[bool] = SingleFlight()
        absorb_seconds = config.report_absorb_seconds
        self._found_good: cachetools.TTLCache[str, bool] | None = (
            cachetools.TTLCache(REMEMBERED, absorb_seconds, timer=clock) if absorb_seconds > 0 else None
        )

    async def report(self, cache: DiskCache, key: str, tenant: str) -> bool:
        """Take ``tenant``'s report of ``key``: True if the node held the file, found it
        damaged and dropped it.  Overloaded if it would start a re-verification and the
        tenant is over its rate."""
        if not cache.contains(key) or (self._found_good is not None and key in self._found_good):
            self.counters.absorbed += 1
            return False
        if key in self._flights:
            self.counters.absorbed += 1
        elif self._buckets.take(tenant):
            self.counters.rechecked += 1
        else:
            self.counters.refused += 1
            raise Overloaded(f"tenant {tenant!r} reported more bad copies than {self._buckets.rate:g} a second: not checked")
        dropped, _ = await self._flights.run(key, lambda: self._recheck(cache, key))
        return dropped

    async def aclose(self) -> None:
        """Cancel the re-verifications in flight and wait for them."""
        await self._flights.aclose()

    async def _recheck(self, cache: DiskCache, key: str) -> bool:
        dropped = await recheck(cache, key)
        if not dropped and self._found_good is not None:
            self._found_good[key] = True
        return dropped
