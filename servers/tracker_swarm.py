"""One chunk key's swarm, as the tracker keeps it (servers/tracker_rules.py decides with it):
who holds the key, who fetches it and since when, which child was handed to which source, and
which sources have room for another child, kept so that a locate ranks a bounded front of
them rather than walk the whole swarm.  No I/O, no clock of its own: times come in as
arguments.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass, field

SCAN = 32  # open holders, and open fetchers, a locate ranks at most (from the front of each)


@dataclass
class Swarm:
    """One chunk key: who holds it, who fetches it (since when), who was sent where.

    A locate must not walk the whole swarm: at 10,000 hosts on one blob that is quadratic
    (measured in swarm_sim).  So the swarm keeps its *open* sources, those with room for another child,
    in two insertion-ordered dicts (fetchers earliest first; a holder that is handed a child
    moves to the back, so hand-outs rotate), and a locate ranks only the first ``SCAN`` of
    each.  A source that reaches ``fanout`` children leaves its dict and waits in ``full``, a
    heap by the time its oldest hand-out ages out, unless a child's fill frees it sooner.
    """

    holders: set[str] = field(default_factory=set)
    fetchers: dict[str, float] = field(default_factory=dict)
    children: dict[str, dict[str, float]] = field(default_factory=dict)  # source -> {child: handed out at}
    parent: dict[str, str] = field(default_factory=dict)  # child -> the source it was handed last
    asks: deque[float] = field(default_factory=deque)  # when peers asked for it, oldest first
    open_holders: dict[str, None] = field(default_factory=dict)
    open_fetchers: dict[str, None] = field(default_factory=dict)
    full: list[tuple[float, str]] = field(default_factory=list)  # (when its oldest hand-out ages out, source)
    stripe: int = 0  # crc32 of the key
    depth: dict[str, int] = field(default_factory=dict)  # fetcher -> hops from a holder or the origin
    load: Counter[str] = field(default_factory=Counter)  # the tracker's: source -> its children across keys
    rooted: int = 0  # askers sent to the origin while nobody held it (its trees' roots)

    def idle(self) -> bool:
        return not (self.holders or self.fetchers or self.asks)

    def children_of(self, source: str, now: float, ttl: float) -> int:
        """The source's children handed out within ``ttl`` (older ones are dropped here)."""
        children = self.children.get(source)
        if not children:
            return 0
        for child in [c for c, at in children.items() if now - at > ttl]:
            self._drop_child(source, child)
        return len(children)

    def _add_child(self, source: str, child: str, now: float) -> None:
        children = self.children.setdefault(source, {})
        if child not in children:
            self.load[source] += 1
        children[child] = now

    def _drop_child(self, source: str, child: str) -> bool:
        children = self.children.get(source)
        if children is None or children.pop(child, None) is None:
            return False
        self.load[source] -= 1
        if not self.load[source]:
            del self.load[source]
        return True

    def drop_children(self, source: str) -> None:
        """``source``'s hand-outs of this key no longer count against it."""
        for child in list(self.children.get(source, ())):
            self._drop_child(source, child)
        self.children.pop(source, None)

    def open(self, source: str) -> None:
        """``source`` has room for a child: rank it again."""
        if source in self.holders:
            self.open_fetchers.pop(source, None)
            self.open_holders[source] = None
        elif source in self.fetchers:
            self.open_fetchers.setdefault(source, None)

    def close(self, source: str) -> None:
        self.open_holders.pop(source, None)
        self.open_fetchers.pop(source, None)

    def reopen_due(self, now: float, fanout: int, ttl: float) -> None:
        """Open the full sources whose oldest hand-out aged out by ``now``."""
        while self.full and self.full[0][0] <= now:
            _, source = heapq.heappop(self.full)
            if source in self.holders or source in self.fetchers:
                self._open_or_wait(source, now, fanout, ttl)

    def hand_out(self, source: str, child: str, now: float, fanout: int, ttl: float) -> None:
        """``child`` tries ``source`` first: it counts against the source's fan-out."""
        self.release(child, now, fanout, ttl)  # it asked again: its earlier source is free of it
        self._add_child(source, child, now)
        self.parent[child] = source
        if source in self.open_holders:
            del self.open_holders[source]  # to the back: hand-outs rotate over the holders
            self.open_holders[source] = None
        self._open_or_wait(source, now, fanout, ttl)

    def release(self, child: str, now: float, fanout: int, ttl: float) -> None:
        """``child`` no longer counts against its source (it filled)."""
        source = self.parent.pop(child, None)
        if source is not None and self._drop_child(source, child):
            self._open_or_wait(source, now, fanout, ttl)

    def forget(self, peer: str) -> None:
        self.holders.discard(peer)
        self.fetchers.pop(peer, None)
        self.depth.pop(peer, None)
        self.drop_children(peer)
        self.parent.pop(peer, None)
        self.close(peer)

    def _open_or_wait(self, source: str, now: float, fanout: int, ttl: float) -> None:
        if self.children_of(source, now, ttl) < fanout:
            self.open(source)
        else:
            self.close(source)
            heapq.heappush(self.full, (min(self.children[source].values()) + ttl, source))
