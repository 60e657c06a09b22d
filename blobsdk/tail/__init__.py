"""Tail control: hedged requests (``Hedger``: an adaptive delay, a token-bucket budget, never
into a queue), the health of a tier's targets (``TargetHealth``: down, bad bytes, hung), and
the replicated read engine (``ReplicaReader``: one chunk hedged across a store's replicas and
verified) that the L4 tier and the L3 node read through."""

from __future__ import annotations

from .health import Reason, TargetHealth
from .hedge import Hedger
from .replicaread import BlockReport, ReplicaReader

__all__ = ["BlockReport", "Hedger", "Reason", "ReplicaReader", "TargetHealth"]
