"""The read path's levels, each an ``AsyncResource`` behind the ``Tier`` protocol (its
docstring is the contract): L1 in host memory, L2 on local flash, the peer tier, L3 (the
regional flash nodes, with hydrate jobs) and L4 (the durable blocks, through the replicated
read engine).  The composition root builds them; the read path walks them in order."""

from __future__ import annotations

from ._l1 import L1Tier
from ._l2 import L2Tier
from ._l3 import HydrateJob, L3Tier
from ._l4 import L4Tier
from ._peer import PeerTier
from .base import DirectTier, Tier

__all__ = ["DirectTier", "HydrateJob", "L1Tier", "L2Tier", "L3Tier", "L4Tier", "PeerTier", "Tier"]
