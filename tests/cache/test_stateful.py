"""Model-based tests: random sequences of operations against a dict model.

The model is the latest bytes put under each key (None: the cache must miss, e.g. after a
failed put or a damaged file); a put refused for its quota changes neither.  Whatever the
cache returns for a key must equal the model; a successful put must be readable at once;
pinned entries must stay; used bytes never exceed the capacity nor a tenant's quota.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blobsdk.cache import DiskCache, MemoryCache
from blobsdk.errors import QuotaExceeded
from blobsdk.testing.cache import FakeClock, blob, key

CAPACITY = 600
QUOTAS = {"a": 300}
OPTIONS = {"ttl_seconds": 30.0, "hold_seconds": 2.0, "quotas": QUOTAS}

keys = st.integers(0, 9)
sizes = st.sampled_from([0, 1, 50, 100, 150, 300, 450])
tenants = st.sampled_from(["a", "b"])
pins = st.sampled_from([0.0, 0.0, 10.0])


class CacheMachine(RuleBasedStateMachine):
    """Rules shared by both engines; subclasses build the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.clock = FakeClock()
        self.model: dict[str, bytes | None] = {}
        self.pins: dict[str, float] = {}
        self.cache = self.run(self.make_cache())

    async def make_cache(self):
        raise NotImplementedError

    def run(self, coro):
        return self.runner.run(coro)

    def teardown(self) -> None:
        self.run(self.cache.aclose())
        self.runner.close()

    @rule(n=keys, size=sizes, tenant=tenants, pin=pins, seed=st.integers(0, 250))
    def put(self, n, size, tenant, pin, seed):
        k, data = key(n), blob(seed, size)
        held = self.cache.contains(k)
        try:
            ok = self.run(self.cache.put(k, data, tenant=tenant, pin_seconds=pin))
        except QuotaExceeded:
            assert tenant in QUOTAS
            assert self.cache.contains(k) == held  # refused: nothing changed, the model neither
            return
        self.model[k] = data
        self.pins.pop(k, None)
        if ok:
            assert bytes(self.run(self.cache.get(k))) == data
            if pin:
                self.pins[k] = self.clock.now + pin
        else:
            assert not self.cache.contains(k)

    @rule(ns=st.lists(keys, min_size=4, max_size=4, unique=True), seed=st.integers(0, 250))
    def crowd(self, ns, seed):
        """Several puts in a row: the pressure under which eviction order matters."""
        for n in ns:
            self.put(n, 150, "b", 0.0, seed)

    @rule(n=keys)
    def get(self, n):
        k = key(n)
        got = self.run(self.cache.get(k))
        if got is not None:
            assert bytes(got) == self.model.get(k)

    @rule(n=keys)
    def delete(self, n):
        k = key(n)
        self.run(self.cache.delete(k))
        self.model.pop(k, None)
        self.pins.pop(k, None)
        assert not self.cache.contains(k)

    @rule(n=keys, seconds=st.sampled_from([1.0, 5.0, 20.0]))
    def pin(self, n, seconds):
        k = key(n)
        if self.cache.pin(k, seconds):
            self.pins[k] = max(self.pins.get(k, 0.0), self.clock.now + seconds)

    @rule(seconds=st.sampled_from([0.5, 3.0, 3.0, 12.0, 40.0]))
    def tick(self, seconds):
        self.clock.advance(seconds)

    @invariant()
    def within_capacity_and_quotas(self):
        usage = self.cache.tenant_usage()
        assert self.cache.used_bytes <= CAPACITY
        assert self.cache.used_bytes == sum(usage.values())
        for tenant, quota in QUOTAS.items():
            assert usage.get(tenant, 0) <= quota

    @invariant()
    def pinned_entries_stay(self):
        for k, until in self.pins.items():
            if until > self.clock.now:
                assert self.cache.contains(k), f"pinned {k} is gone"


class MemoryMachine(CacheMachine):
    async def make_cache(self):
        return MemoryCache(CAPACITY, clock=self.clock, **OPTIONS)


class DiskMachine(CacheMachine):
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="blobsdk-disk-machine-"))
        super().__init__()

    async def make_cache(self):
        cache = DiskCache(self.root, capacity_bytes=CAPACITY, min_free_ratio=0, clock=self.clock, **OPTIONS)
        return await cache.open()

    def teardown(self) -> None:
        super().teardown()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule()
    def restart(self):
        self.run(self.cache.aclose())
        self.cache = self.run(self.make_cache())
        self.pins.clear()  # pins live in memory only

    @invariant()
    def files_match_the_index(self):
        on_disk = {p.name for p in self.root.rglob("*") if p.is_file() and p.parent != self.root}  # not FORMAT
        assert on_disk == {key(n) for n in range(10) if self.cache.contains(key(n))}

    @precondition(lambda self: any(v for v in self.model.values()))
    @rule(n=keys)
    def damage(self, n):
        k = key(n)
        path = self.root / k[:2] / k
        if not path.exists() or not self.model.get(k):
            return
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        self.model[k] = None  # the cache must never serve these bytes
        self.pins.pop(k, None)  # reading it drops it, pinned or not
        assert self.run(self.cache.get(k)) is None


_SETTINGS = settings(max_examples=50, stateful_step_count=30, deadline=None)
TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = _SETTINGS
TestDiskMachine = DiskMachine.TestCase
TestDiskMachine.settings = _SETTINGS
