"""The checks of the public API's arguments, before any work: an argument of the wrong kind is
a TypeError naming it (``gc: grace must be a number > 0, not str``), never the error of the
first operation that trips over it deep inside (``'>' not supported between 'str' and 'float'``).

A number of the right kind but outside its rule follows blobsdk/_numbers.py, as a setting of
``client.toml`` does: an int argument refuses a bool and a float, a float one takes an int and
refuses a bool, nan and the infinities, each a ValueError (or the call's own ValueError subclass,
``BadRequest``) naming the argument and showing the value.  ``name`` is how the message names
the argument: the call and the argument (``"gc: grace"``), or the argument alone where the call's
other messages do so.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import Any

from ._numbers import Number

BYTES_LIKE = "a bytes-like object (bytes, bytearray, memoryview, ...)"


def wrong(name: str, wanted: str, value: object) -> TypeError:
    """The TypeError for ``value`` given as ``name``, which must be ``wanted``."""
    return TypeError(f"{name} must be {wanted}, not {type(value).__name__}")


def check_number(name: str, value: object, rule: Number, error: type[ValueError] = ValueError, unit: str = "") -> None:
    """TypeError unless ``value`` is a number (or None, if ``rule`` allows it); ``error`` if it
    breaks ``rule`` (a bool, a float for an int, nan, ±inf, out of range).  Both messages say
    all the rule asks, and then ``unit`` (" (seconds)")."""
    if not isinstance(value, int | float) and not (value is None and rule.optional):
        raise wrong(name, rule.wanted() + unit, value)
    if rule.problem(value) is not None:
        raise error(f"{name} must be {rule.wanted()}{unit}, got {value!r}")


def check_flag(name: str, value: object) -> bool:
    """``value``, a bool: a string such as "no" or a number would be read by its truth."""
    if not isinstance(value, bool):
        raise wrong(name, "a bool", value)
    return value


def check_callable(name: str, value: object) -> None:
    """A callback: callable, or None."""
    if value is not None and not callable(value):
        raise wrong(name, "callable or None", value)


def check_bytes_like(name: str, value: object) -> None:
    """Data to write: anything ``memoryview`` takes (a str is not)."""
    try:
        memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        raise wrong(name, BYTES_LIKE, value) from None


def check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise wrong(name, "a str", value)
    return value


def check_paths(name: str, value: object) -> None:
    """One path or prefix (a str), or an iterable of them (bytes are not)."""
    if isinstance(value, bytes | bytearray | memoryview) or not isinstance(value, str | Iterable):
        raise wrong(name, "a path or an iterable of paths", value)


def check_iterable(name: str, value: object, wanted: str, *, asynchronous: bool = False) -> None:
    """An iterable (or an async one, if ``asynchronous``) that is not a str nor bytes."""
    kinds: tuple[type, ...] = (Iterable, AsyncIterable) if asynchronous else (Iterable,)
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, kinds):
        raise wrong(name, wanted, value)


def check_pair(name: str, item: object) -> tuple[Any, Any]:
    """An item of a list of pairs: a tuple or list of two."""
    if not isinstance(item, tuple | list):
        raise wrong(name, "a (path, data) pair", item)
    if len(item) != 2:
        raise TypeError(f"{name} must be a (path, data) pair, not a {type(item).__name__} of {len(item)}")
    return item[0], item[1]
