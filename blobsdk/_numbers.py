"""Range checks of the numbers in configuration structs (and, through blobsdk/_arguments.py,
of the public API's number arguments).

Each struct names one :class:`Number` rule per numeric field, which blobsdk/_settings.py
checks with :func:`check_numbers` when it is built, however it is built: from
``client.toml`` or in Python.  The message names the field: ``timeouts.connect must be > 0,
got -1``.  An int field refuses a bool and a float; a float field takes an int, and refuses a
bool, nan and the infinities (no setting means "unbounded" by being infinite: those that can
be unbounded take None).  What is no number at all (a str, None where None is not allowed)
is a TypeError, the rest a ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Number:
    """A field's rule: an int or a (finite) float from ``low`` to ``high`` (open ends when
    ``low_open``/``high_open``); ``optional``: None is allowed."""

    kind: type[int] | type[float]
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` (the words after "must be"), or None."""
        if value is None:
            return None if self.optional else f"{self._noun()}{self._bounds()}"
        if isinstance(value, bool) or not isinstance(value, int | float) or (self.kind is int and isinstance(value, float)):
            return f"{self._noun()}{self._bounds()}"
        if isinstance(value, float) and not math.isfinite(value):
            return "finite"
        return None if self._in_range(value) else self._bounds().strip()

    def wanted(self) -> str:
        """What a value must be, in words: "an int >= 1", "None or a number > 0"."""
        return f"{'None or ' if self.optional else ''}{self._noun()}{self._bounds()}"

    def _noun(self) -> str:
        return "an int" if self.kind is int else "a number"

    def _in_range(self, value: float) -> bool:
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return low_ok and high_ok

    def _bounds(self) -> str:
        low, high = _shown(self.low), _shown(self.high)
        if self.low is not None and self.high is not None:
            if not self.low_open and not self.high_open:
                return f" from {low} to {high}"
            return f" in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f" {'>' if self.low_open else '>='} {low}"
        if self.high is not None:
            return f" {'<' if self.high_open else '<='} {high}"
        return ""


def integer(low: int | None = None, high: int | None = None, *, optional: bool = False) -> Number:
    return Number(int, low, high, optional=optional)


def positive(*, optional: bool = False) -> Number:
    """A float > 0."""
    return Number(float, 0, low_open=True, optional=optional)


def non_negative(*, optional: bool = False) -> Number:
    return Number(float, 0, optional=optional)


def real(low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False) -> Number:
    return Number(float, low, high, low_open, high_open)


def check_numbers(table: str, obj: object, rules: Mapping[str, Number]) -> None:
    """An error naming the first field of ``obj`` that breaks its rule: TypeError if it is no
    number at all (nor an allowed None), else ValueError (a bool, a float for an int, nan,
    ±inf, out of range)."""
    for name, rule in rules.items():
        value = getattr(obj, name)
        problem = rule.problem(value)
        if problem is not None:
            kind = isinstance(value, int | float) or (value is None and rule.optional)
            raise (ValueError if kind else TypeError)(f"{table}.{name} must be {problem}, got {value!r}")


def _shown(bound: float | None) -> str:
    return str(int(bound)) if bound is not None and float(bound).is_integer() else str(bound)
