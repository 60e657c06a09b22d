"""Tail control: hedged requests (``Hedger``: an adaptive delay, a token-bucket budget, never
into a queue), the health of a tier's targets (``TargetHealth``: down, bad bytes, hung) and
the adaptive concurrency limit per endpoint with its priority queue (``LimiterRegistry``,
``AdaptiveLimiter``, a ``Permit`` per request)."""

from __future__ import annotations

from .health import Reason, TargetHealth
from .hedge import Hedger
from .hedgestate import AttemptFn
from .limiter import AdaptiveLimiter, LimiterRegistry, Permit

__all__ = ["AdaptiveLimiter", "AttemptFn", "Hedger", "LimiterRegistry", "Permit", "Reason", "TargetHealth"]
