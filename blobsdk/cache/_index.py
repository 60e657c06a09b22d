"""The bookkeeping of a cache engine's entries (blobsdk/cache/policy.py picks victims from it):
one :class:`Entry` per cached chunk, kept in an :class:`Index` in the orders the policies
read."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter

import msgspec

from .base import DEFAULT_TENANT


class Entry(msgspec.Struct, array_like=True, gc=False):
    """The bookkeeping of one cached chunk (its bytes live in the engine).

    A msgspec Struct, untracked by the cyclic collector (it holds no containers): the disk
    cache's index file (blobsdk/cache/_indexfile.py) decodes a million of them in C.

    ``created`` and ``last_access`` are on the engine's clock (monotonic by default);
    ``pin_until`` too: the entry is not evicted (nor expired) while ``pin_until > now``.
    """

    key: str
    size: int
    created: float
    last_access: float
    tenant: str = DEFAULT_TENANT
    pin_until: float = 0.0

    def pinned(self, now: float) -> bool:
        return self.pin_until > now


class Index:
    """The entries of one cache, least recently used first, with bytes per tenant.
    ``by_age`` adds the creation order, which a TTL needs (it is expiry order: one TTL per
    cache); ``per_tenant_lru`` an LRU order per tenant, which quotas need; ``hold`` what a hold
    period needs: ``held``, the entries not yet released, in creation order (they are
    released from its old end: one hold period per cache), and ``released``, a heap of the
    others by last access (:meth:`release`, :meth:`released_lru`).  Each order costs a dict
    operation per touch or put, and ~0.5 s per million entries when a disk cache loads its
    index file: an engine keeps only those its policies read (``PolicyChain.new_index``)."""

    __slots__ = ("_lent", "_seq", "by_age", "held", "lru", "released", "tenant_bytes", "tenant_lru", "used")

    def __init__(self, *, per_tenant_lru: bool = False, by_age: bool = True, hold: bool = False) -> None:
        self.lru: OrderedDict[str, Entry] = OrderedDict()
        self.by_age: OrderedDict[str, Entry] | None = OrderedDict() if by_age else None
        self.held: OrderedDict[str, Entry] | None = OrderedDict() if hold else None
        self.released: list[tuple[float, int, Entry]] = []  # (last access then, tie-break, entry)
        self._lent: list[tuple[float, Entry]] = []  # taken from ``released`` by the last walk
        self._seq = itertools.count()
        self.tenant_bytes: dict[str, int] = {}
        self.tenant_lru: dict[str, OrderedDict[str, Entry]] | None = {} if per_tenant_lru else None
        self.used = 0

    def __len__(self) -> int:
        return len(self.lru)

    def __contains__(self, key: str) -> bool:
        return key in self.lru

    def get(self, key: str) -> Entry | None:
        return self.lru.get(key)

    def add(self, entry: Entry) -> None:
        """Insert an absent entry as the most recently used and the youngest."""
        self.lru[entry.key] = entry
        if self.by_age is not None:
            self.by_age[entry.key] = entry
        if self.held is not None:
            self.held[entry.key] = entry
        self.used += entry.size
        self.tenant_bytes[entry.tenant] = self.tenant_bytes.get(entry.tenant, 0) + entry.size
        if self.tenant_lru is not None:
            self.tenant_lru.setdefault(entry.tenant, OrderedDict())[entry.key] = entry

    def remove(self, key: str) -> Entry | None:
        entry = self.lru.pop(key, None)
        if entry is None:
            return None
        if self.by_age is not None:
            del self.by_age[key]
        if self.held is not None:
            self.held.pop(key, None)  # a released one's heap record goes when it is met
        self.used -= entry.size
        left = self.tenant_bytes.get(entry.tenant, 0) - entry.size
        if left:
            self.tenant_bytes[entry.tenant] = left
        else:
            self.tenant_bytes.pop(entry.tenant, None)
        if self.tenant_lru is not None:
            self._remove_tenant_lru(entry)
        return entry

    def touch(self, entry: Entry, now: float) -> None:
        entry.last_access = now
        self.lru.move_to_end(entry.key)
        if self.tenant_lru is not None:
            self.tenant_lru[entry.tenant].move_to_end(entry.key)

    def requeue(self, entry: Entry) -> None:
        """Move a present entry to the most recently used end, its times unchanged."""
        self.lru.move_to_end(entry.key)
        if self.tenant_lru is not None:
            self.tenant_lru[entry.tenant].move_to_end(entry.key)

    def requeue_pinned_head(self, now: float) -> int:
        """Move the pinned entries at the least recently used end to the other end, stopping
        at the first unpinned one (at most one pass); how many moved."""
        moved = 0
        while moved < len(self.lru):
            entry = next(iter(self.lru.values()))
            if not entry.pinned(now):
                break
            self.requeue(entry)
            moved += 1
        return moved

    def load(self, entries: Iterable[Entry], *, lru_ordered: bool = False) -> list[Entry]:
        """Bulk insert at start-up into an empty index, placing each entry by its times (one
        sort per order, no per-entry moves).  ``lru_ordered``: ``entries`` come least recently
        used first already (the index file), so the LRU order needs no sort: with no creation
        order kept, a million entries load with no sort at all (two sorts were ~40% of a
        restart from the index file at 10^6 entries).  A key listed more than once (an index
        file another process forged) keeps its most recently used listing: the others are
        returned, not loaded (found by the size of the LRU order, which is built anyway)."""
        if self.lru:
            raise ValueError("load needs an empty index")
        listed = list(entries)
        aged = self.by_age is not None or self.held is not None
        by_age = sorted(listed, key=attrgetter("created")) if aged or not lru_ordered else listed
        by_access = listed if lru_ordered else sorted(by_age, key=attrgetter("last_access"))  # ties: older first
        lru = _ordered(by_access)
        repeats = [e for e in by_access if lru[e.key] is not e] if len(lru) < len(by_access) else []
        if repeats:  # each key's last listing in the LRU order stays, in its own place
            by_access = [e for e in by_access if lru[e.key] is e]
            by_age = [e for e in by_age if lru[e.key] is e]
            lru = _ordered(by_access)
        self.lru = lru
        if self.by_age is not None:
            self.by_age = _ordered(by_age)
        if self.held is not None:
            self.held = _ordered(by_age)
        tenant_bytes = self.tenant_bytes
        for entry in by_access:
            tenant_bytes[entry.tenant] = tenant_bytes.get(entry.tenant, 0) + entry.size
        self.used = sum(tenant_bytes.values())
        if self.tenant_lru is not None:
            for entry in by_access:
                self.tenant_lru.setdefault(entry.tenant, OrderedDict())[entry.key] = entry
        return repeats

    def resize(self, entry: Entry, size: int) -> None:
        """Count a present entry as ``size`` bytes: its file holds that many, not what the
        index file said."""
        change, entry.size = size - entry.size, size
        self.used += change
        left = self.tenant_bytes.get(entry.tenant, 0) + change
        if left:
            self.tenant_bytes[entry.tenant] = left
        else:
            self.tenant_bytes.pop(entry.tenant, None)

    def clear(self) -> None:
        self.lru.clear()
        if self.by_age is not None:
            self.by_age.clear()
        if self.held is not None:
            self.held.clear()
        self.released.clear()
        self._lent.clear()
        self.tenant_bytes.clear()
        if self.tenant_lru is not None:
            self.tenant_lru.clear()
        self.used = 0

    def release(self, holds: Callable[[Entry], bool]) -> None:
        """Move the entries at the old end of ``held`` that ``holds`` no longer holds into the
        ``released`` heap, stopping at the first it holds (creation order: the rest are
        younger).  Each entry is released once: O(log n) a put, amortized."""
        assert self.held is not None, "an index of a hold period: Index(hold=True)"
        held, heap = self.held, self.released
        gone = list(itertools.takewhile(lambda entry: not holds(entry), held.values()))
        for entry in gone:
            del held[entry.key]
        batch = list(zip(map(attrgetter("last_access"), gone), self._seq, gone, strict=False))  # _seq: endless
        if len(heap) > 2 * len(self.lru) + 64:  # records of entries removed since: drop them
            heap[:] = [r for r in heap if self.lru.get(r[2].key) is r[2]]
            heapq.heapify(heap)
        if len(batch) > len(heap) // 8:  # many at once (a restart): one heapify, O(n)
            heap.extend(batch)
            heapq.heapify(heap)
        else:
            for record in batch:
                heapq.heappush(heap, record)

    def released_lru(self, now: float) -> Iterator[Entry]:
        """The unpinned released entries, least recently used first (by last access; ties:
        released first), taken off the heap as they are handed out and put back at the next
        walk if still present.  An entry used since its record was written is put back in its
        new place; a pinned one as if used when its pin ends (a pin only grows; a fill's, endless
        until written, as if used ``now``), and a walk stops at the first record after ``now``:
        no walk passes a pinned entry again while its pin lasts."""
        heap, lent = self.released, self._lent
        for last, entry in lent:
            if self.lru.get(entry.key) is entry:  # not evicted
                heapq.heappush(heap, (last, next(self._seq), entry))
        lent.clear()
        while heap:
            last, _, entry = heap[0]
            if last > now:
                return  # only pinned entries from here on
            if self.lru.get(entry.key) is not entry:
                heapq.heappop(heap)  # removed, or replaced by a newer put, since
            elif entry.last_access > last:
                heapq.heapreplace(heap, (entry.last_access, next(self._seq), entry))
            else:
                heapq.heappop(heap)
                if entry.pin_until > now:
                    lent.append((entry.pin_until if entry.pin_until < math.inf else now, entry))
                else:
                    lent.append((last, entry))
                    yield entry

    def tenant_entries(self, tenant: str) -> Iterable[Entry]:
        """The entries of ``tenant``, least recently used first."""
        if self.tenant_lru is not None:
            return self.tenant_lru.get(tenant, {}).values()
        return (e for e in self.lru.values() if e.tenant == tenant)

    def _remove_tenant_lru(self, entry: Entry) -> None:
        assert self.tenant_lru is not None
        own = self.tenant_lru[entry.tenant]
        del own[entry.key]
        if not own:
            del self.tenant_lru[entry.tenant]


def _ordered(entries: list[Entry]) -> OrderedDict[str, Entry]:
    return OrderedDict(zip(map(attrgetter("key"), entries), entries, strict=True))
