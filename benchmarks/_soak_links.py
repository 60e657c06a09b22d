"""The soak's faults at the links of a cluster on hosts (``python -m benchmarks soak --hosts N``):
what the chaos driver (benchmarks/_soak_chaos.py) does to a target's testbed host, besides
killing and stopping its process.

- ``partition``: the host's link drops every packet for 2–8 s, in one direction drawn from
  both, in and out (servers/testbed.py: connections time out, they are never refused), then
  heals; counted per direction (``partition_both``, ``partition_in``, ``partition_out``).
- ``flap``: the link goes down (both directions) for 0.3–1.5 s and up for 0.5–2 s, again and
  again for 4–10 s, then stays up.
- ``slow``: the link runs at 1–10 Mbit/s each way for 3–8 s, then at its own rates again.

:meth:`LinkFaults.release` heals every link the driver touched, with its rates back, whatever
was interrupted (a cancelled soak included).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from servers.testbed import Direction, Flap, Link, Testbed

LINK_ACTIONS = ["partition", "flap", "slow"]
DIRECTIONS: tuple[Direction, ...] = ("both", "in", "out")
HOLD_PARTITION_S = (2.0, 8.0)
FLAP_DOWN_S = (0.3, 1.5)
FLAP_UP_S = (0.5, 2.0)
HOLD_FLAP_S = (4.0, 10.0)
SLOW_MBIT = (1.0, 10.0)
HOLD_SLOW_S = (3.0, 8.0)


@dataclass
class LinkFaults:
    """Faults at the links of ``testbed``'s hosts; each method returns (the count's name, the
    fault's length in seconds, a note) once the link is back as it was."""

    testbed: Testbed
    _links: dict[str, Link] = field(default_factory=dict)  # host -> its link before the driver touched it
    _flaps: list[Flap] = field(default_factory=list)

    async def partition(self, host: str, rng: random.Random) -> tuple[str, float, str]:
        direction, hold = rng.choice(DIRECTIONS), rng.uniform(*HOLD_PARTITION_S)
        self._touch(host)
        await asyncio.to_thread(self.testbed.partition, host, direction)
        try:
            await asyncio.sleep(hold)
        finally:
            await asyncio.to_thread(self._restore, host)
        return f"partition_{direction}", hold, direction

    async def flap(self, host: str, rng: random.Random) -> tuple[str, float, str]:
        down, up, hold = rng.uniform(*FLAP_DOWN_S), rng.uniform(*FLAP_UP_S), rng.uniform(*HOLD_FLAP_S)
        self._touch(host)
        flap = self.testbed.flap(host, down, up)
        self._flaps.append(flap)
        try:
            await asyncio.sleep(hold)
        finally:
            await asyncio.to_thread(flap.stop)
            self._flaps.remove(flap)
            await asyncio.to_thread(self._restore, host)
        return "flap", hold, f"down {down:.1f}s, up {up:.1f}s, {flap.cycles} downs"

    async def slow(self, host: str, rng: random.Random) -> tuple[str, float, str]:
        rate, hold = rng.uniform(*SLOW_MBIT), rng.uniform(*HOLD_SLOW_S)
        self._touch(host)
        await asyncio.to_thread(self.testbed.set_link, host, rate, rate)
        try:
            await asyncio.sleep(hold)
        finally:
            await asyncio.to_thread(self._restore, host)
        return "slow", hold, f"{rate:.1f} Mbit/s"

    def release(self) -> None:
        """Every flap stopped, every touched link healed with its own rates."""
        for flap in self._flaps:
            flap.halt()
        self._flaps.clear()
        for host in list(self._links):
            self._restore(host)

    def _touch(self, host: str) -> None:
        self._links.setdefault(host, self.testbed.host(host).link)

    def _restore(self, host: str) -> None:
        link = self._links.pop(host, None)
        if link is not None:
            self.testbed.set_link(host, link.up, link.down)
        self.testbed.heal(host)
