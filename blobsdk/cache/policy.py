"""Eviction for the cache engines: the bookkeeping of entries and small policy objects.

An engine keeps one :class:`Entry` per cached chunk in an :class:`Index` and asks its
:class:`PolicyChain` which entries to drop to admit a new one.  The chain asks its
policies in this order, each yielding candidates in its own order, and takes candidates
until enough bytes are freed:

1. ``quota``  the putting tenant's own least recently used entries, while its quota
              demands it (raises QuotaExceeded if even all of them are not enough);
              then those of any other tenant that is over its quota.
2. ``ttl``    expired entries, oldest first.
3. ``lru``    least recently used entries older than the hold period.
4. ``hold``   least recently used entries still inside the hold period: the last resort
              before the cache would overflow.

With a hold period, ``lru`` does not walk the held entries to find the others: the index
keeps the held ones in creation order, from whose old end they are released (at most one
look at a held entry per eviction), and the released ones in a heap by last access
(blobsdk/cache/_index.py): O(log n) per eviction, amortized.  Before, ``lru`` walked the LRU
order skipping held entries: a put into a cache full of held chunks walked them all, O(n).

Pinned entries (``pin_until > now``) are never chosen by any policy.  A pinned entry that an
eviction finds at the least recently used end is moved to the other end first (as if used
then): else every eviction would walk past every pinned entry there, O(pinned) per put (the L3
node pins the chunks it hydrates; benchmarks/scale.py ``l3_pinned_churn``: 10^4 pinned chunks
cost each put ~1 ms of the event loop).  A plan is computed in
full before anything is evicted, so a put that cannot fit evicts nothing.

All times are seconds on the owning engine's clock (``time.monotonic`` unless a clock is
injected); the disk engine maps file times to that clock at start-up by their age.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from ..errors import BadRequest, QuotaExceeded
from ._index import Entry as Entry
from ._index import Index as Index

_MAX_TENANT_BYTES = 255  # the disk header stores the tenant's length in one u16; keep names short


def validate_tenant(tenant: object) -> str:
    """``tenant`` if it is a usable tenant name (1-255 UTF-8 bytes), else BadRequest."""
    if not isinstance(tenant, str) or not 0 < len(tenant.encode("utf-8", "replace")) <= _MAX_TENANT_BYTES:
        raise BadRequest(f"invalid tenant {tenant!r}: want 1 to {_MAX_TENANT_BYTES} UTF-8 bytes")
    return tenant


class EvictionPolicy(Protocol):
    """One eviction strategy: yields candidates in the order it would evict them (never a
    pinned entry) and counts what the chain took from it."""

    name: str
    hits: int  # consultations in which it supplied victims
    misses: int  # consultations in which it had nothing to offer
    evictions: int
    evicted_bytes: int

    def victims(self, index: Index, now: float) -> Iterator[Entry]: ...

    def record(self, entry: Entry) -> None: ...

    def stats(self) -> dict[str, int]: ...


class _Counted:
    """The counters every policy keeps (see :class:`EvictionPolicy`)."""

    name = "policy"

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.evicted_bytes = 0

    def record(self, entry: Entry) -> None:
        self.evictions += 1
        self.evicted_bytes += entry.size

    def stats(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "evicted_bytes": self.evicted_bytes,
        }


class TtlPolicy(_Counted):
    """Entries older than ``ttl_seconds`` since their put are expired: a read misses and
    they are the first victims.  A pin outlives the TTL."""

    name = "ttl"

    def __init__(self, ttl_seconds: float) -> None:
        super().__init__()
        if not ttl_seconds > 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
        self.ttl_seconds = ttl_seconds

    def expired(self, entry: Entry, now: float) -> bool:
        return entry.created + self.ttl_seconds <= now and entry.pin_until <= now

    def victims(self, index: Index, now: float) -> Iterator[Entry]:
        if index.by_age is None:
            raise ValueError("a TTL needs an index that keeps the creation order (Index(by_age=True))")
        for entry in index.by_age.values():
            if entry.created + self.ttl_seconds > now:
                return  # creation order: everything after this is younger still
            if entry.pin_until <= now:
                yield entry


class LruPolicy(_Counted):
    """Least recently used first."""

    name = "lru"

    def victims(self, index: Index, now: float) -> Iterator[Entry]:
        return (e for e in index.lru.values() if e.pin_until <= now)


class HoldPolicy(_Counted):
    """Data younger than ``hold_seconds`` is kept (e.g. for the next epoch) unless the
    cache would otherwise overflow; its victims are those held entries, LRU first."""

    name = "hold"

    def __init__(self, hold_seconds: float) -> None:
        super().__init__()
        if not hold_seconds > 0:
            raise ValueError(f"hold_seconds must be positive, got {hold_seconds}")
        self.hold_seconds = hold_seconds

    def holds(self, entry: Entry, now: float) -> bool:
        return entry.created + self.hold_seconds > now

    def victims(self, index: Index, now: float) -> Iterator[Entry]:
        return (e for e in index.lru.values() if e.pin_until <= now and self.holds(e, now))

    def release(self, index: Index, now: float) -> None:
        """Move the entries whose hold period ended to the index's ``released`` heap (at each
        eviction, and at start-up: :meth:`PolicyChain.trim`)."""
        if index.held is None:
            raise ValueError("a hold period needs an index that keeps its held entries (Index(hold=True))")
        index.release(lambda entry: self.holds(entry, now))

    def released(self, index: Index, now: float) -> Iterator[Entry]:
        """The unpinned entries past their hold period, least recently used first, without
        walking the held ones (module docstring)."""
        self.release(index, now)
        return index.released_lru(now)


class QuotaPolicy(_Counted):
    """Per-tenant byte quotas: a tenant over its quota loses its own LRU entries first."""

    name = "quota"

    def __init__(self, quotas: Mapping[str, int]) -> None:
        super().__init__()
        for tenant, quota in quotas.items():
            if quota < 0:
                raise ValueError(f"quota of tenant {tenant!r} must not be negative, got {quota}")
        self.quotas = dict(quotas)

    def excess(self, index: Index, tenant: str, incoming: int = 0) -> int:
        """Bytes ``tenant`` would be over its quota with ``incoming`` more (<= 0: within)."""
        quota = self.quotas.get(tenant)
        if quota is None:
            return 0
        return index.tenant_bytes.get(tenant, 0) + incoming - quota

    def tenant_victims(self, index: Index, tenant: str, now: float) -> Iterator[Entry]:
        return (e for e in index.tenant_entries(tenant) if e.pin_until <= now)

    def victims(self, index: Index, now: float) -> Iterator[Entry]:
        for tenant in self.quotas:
            over = self.excess(index, tenant)
            for entry in self.tenant_victims(index, tenant, now):
                if over <= 0:
                    break
                over -= entry.size
                yield entry


Victims = list[tuple[EvictionPolicy, Entry]]


class _Plan:
    """Victims chosen so far, each with the policy that chose it."""

    def __init__(self) -> None:
        self.victims: Victims = []
        self.chosen: set[str] = set()
        self.freed = 0

    def take(self, policy: EvictionPolicy, candidates: Iterable[Entry], need: int) -> int:
        """Take candidates until ``need`` bytes are freed; returns the bytes taken."""
        taken = 0
        for entry in candidates:
            if taken >= need:
                break
            if entry.key not in self.chosen:
                self.chosen.add(entry.key)
                self.victims.append((policy, entry))
                taken += entry.size
        if taken:
            policy.hits += 1
        else:
            policy.misses += 1
        self.freed += taken
        return taken


class PolicyChain:
    """The eviction order of one engine, composed of its policies (module docstring)."""

    def __init__(
        self,
        *,
        ttl_seconds: float | None = None,
        hold_seconds: float = 0.0,
        quotas: Mapping[str, int] | None = None,
    ) -> None:
        self.quota = QuotaPolicy(quotas) if quotas else None
        self.ttl = TtlPolicy(ttl_seconds) if ttl_seconds is not None else None
        self.lru = LruPolicy()
        self.hold = HoldPolicy(hold_seconds) if hold_seconds > 0 else None
        found = (self.quota, self.ttl, self.lru, self.hold)
        self.policies: tuple[EvictionPolicy, ...] = tuple(p for p in found if p is not None)
        # Whether admitting an entry that fits is a no-op: no quota to enforce, no hold period
        # whose entries each admission releases (HoldPolicy.release).
        self.fits_free = self.quota is None and self.hold is None
        self.rejected = 0  # puts refused: too big, or only pinned data to evict
        self.quota_exceeded = 0

    def new_index(self) -> Index:
        """An empty index that keeps the orders these policies read: the creation order for a
        TTL, the held entries and a heap of the released ones for a hold period, an LRU order
        per tenant for quotas."""
        return Index(per_tenant_lru=self.quota is not None, by_age=self.ttl is not None, hold=self.hold is not None)

    def expired(self, entry: Entry, now: float) -> bool:
        return self.ttl is not None and self.ttl.expired(entry, now)

    def expire(self, index: Index, entry: Entry) -> None:
        """Drop an expired entry found by a read (counted as a TTL eviction)."""
        assert self.ttl is not None
        index.remove(entry.key)
        self.ttl.record(entry)

    def admit(self, index: Index, incoming: Entry, capacity: int, now: float, extra_need: int = 0) -> Victims | None:
        """Make room for ``incoming``: plan (see :meth:`plan`; ``extra_need`` bytes must be
        freed anyway), remove the victims from ``index`` and count them.  None, with
        nothing evicted, if it cannot fit; QuotaExceeded from :meth:`plan`.  With
        :attr:`fits_free`, an entry that fits (``index.used + size <= capacity``, no
        ``extra_need``) is admitted with no victims and nothing changed, so an engine may add
        it without this call (_memory.py does)."""
        if incoming.size > capacity:
            self.rejected += 1
            return None
        try:
            victims = self.plan(index, max(index.used + incoming.size - capacity, extra_need), now, incoming)
        except QuotaExceeded:
            self.quota_exceeded += 1
            raise
        if victims is None:
            self.rejected += 1
            return None
        return self.evict(index, victims)

    def check_quota(self, index: Index, incoming: Entry, now: float) -> None:
        """QuotaExceeded (counted) if ``incoming`` cannot fit its tenant's quota even once the
        entry it replaces (the key's, if that tenant's own) and every unpinned entry of that
        tenant are gone.  Changes nothing: an engine asks before it drops the key's older
        copy, so a put refused for its quota leaves another tenant's copy in place."""
        if self.quota is None:
            return
        tenant = incoming.tenant
        replaced = index.get(incoming.key)
        own = replaced if replaced is not None and replaced.tenant == tenant else None
        excess = self.quota.excess(index, tenant, incoming.size)
        freeable = own.size if own is not None else 0  # replaced whether pinned or not
        for entry in self.quota.tenant_victims(index, tenant, now):
            if freeable >= excess:
                return
            if entry is not own:
                freeable += entry.size
        if freeable < excess:
            self.quota_exceeded += 1
            raise self._quota_exceeded(index, tenant, freeable, incoming.size)

    def trim(self, index: Index, capacity: int, now: float) -> Victims:
        """Evict down to ``capacity`` (it may have shrunk since the entries were stored); with
        a hold period, release what is past it first (a start-up's many at once, not the
        first put's)."""
        if self.hold is not None:
            self.hold.release(index, now)
        return self.evict(index, self.plan(index, index.used - capacity, now) or [])

    def evict(self, index: Index, victims: Victims) -> Victims:
        for policy, entry in victims:
            index.remove(entry.key)
            policy.record(entry)
        return victims

    def plan(self, index: Index, need: int, now: float, incoming: Entry | None = None) -> Victims | None:
        """The victims that admit ``incoming`` (if given): what its tenant's quota demands,
        then at least ``need`` bytes in all.  None if that is impossible without pinned
        entries (evict nothing then).  Raises QuotaExceeded if even all of the tenant's
        unpinned entries are not enough for its quota."""
        if need > 0 or (self.quota is not None and incoming is not None):
            index.requeue_pinned_head(now)
        plan = _Plan()
        if self.quota is not None and incoming is not None:
            self._plan_quota(index, incoming, now, plan)
        need -= plan.freed
        for policy, candidates in self._stages(index, now):
            if need <= 0:
                break
            need -= plan.take(policy, candidates, need)
        return plan.victims if need <= 0 else None

    def stats(self) -> dict[str, int]:
        """Admission counters, total evictions and every policy's counters, flattened:
        ``ttl_evictions``, ``lru_evicted_bytes``..."""
        policies = {f"{p.name}_{k}": v for p in self.policies for k, v in p.stats().items()}
        evictions = sum(p.evictions for p in self.policies)
        return {"rejected": self.rejected, "quota_exceeded": self.quota_exceeded, "evictions": evictions, **policies}

    def _plan_quota(self, index: Index, incoming: Entry, now: float, plan: _Plan) -> None:
        assert self.quota is not None
        tenant = incoming.tenant
        excess = self.quota.excess(index, tenant, incoming.size)
        if excess <= 0:
            return
        freed = plan.take(self.quota, self.quota.tenant_victims(index, tenant, now), excess)
        if freed < excess:
            raise self._quota_exceeded(index, tenant, freed, incoming.size)

    def _quota_exceeded(self, index: Index, tenant: str, freeable: int, size: int) -> QuotaExceeded:
        assert self.quota is not None
        usage = index.tenant_bytes.get(tenant, 0)
        return QuotaExceeded(
            f"tenant {tenant!r} would exceed its quota of {self.quota.quotas[tenant]} bytes: "
            f"it stores {usage} bytes ({usage - freeable} of them pinned) and puts {size} more"
        )

    def _stages(self, index: Index, now: float) -> Iterator[tuple[EvictionPolicy, Iterable[Entry]]]:
        if self.quota is not None:
            yield self.quota, self.quota.victims(index, now)
        if self.ttl is not None:
            yield self.ttl, self.ttl.victims(index, now)
        hold = self.hold
        if hold is None:
            yield self.lru, self.lru.victims(index, now)
            return
        yield self.lru, hold.released(index, now)
        yield hold, hold.victims(index, now)
