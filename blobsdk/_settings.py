"""The checks every configuration struct (blobsdk/config.py) runs when it is built, however it
is built: in Python, from ``client.toml`` (:func:`from_table`), or by msgspec itself
(``convert``, ``decode``); each way refuses the same values with the same message.

:class:`Settings` is the base of every table.  Its ``__post_init__`` checks, in order:

1. each field's kind, read from its annotation: a bool, a str, one of a ``Literal``'s values,
   a list of str (kept as a tuple), a table (a struct of its own type, or None where that is
   allowed).  A value of the wrong kind is a TypeError, a str that is none of a Literal's
   values a ValueError, both naming the field and showing the value:
   ``write.compression must be one of "auto", "lz4", "none", got 'zstd'``;
2. each number against its rule (blobsdk/_numbers.py: its kind and its range);
3. the rules across fields: :meth:`Settings.check`.

:func:`from_table` builds a struct from a TOML table by calling the constructors (nested
tables first), so a file meets the very checks Python does and gets the same messages, each a
ValueError: whatever its kind, a bad value in a file is a bad value.  A key the struct does not
have, or a required one missing, is refused there first, naming it (Python's own messages for
those name a keyword argument).
"""

from __future__ import annotations

import difflib
import functools
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import msgspec

from ._arguments import wrong
from ._numbers import Number, check_numbers

S = TypeVar("S", bound="Settings")


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A table of ``client.toml``: frozen, keyword-only, unknown keys refused, every field
    checked when built (see the module docstring).  A subclass names its ``table`` (how
    messages name its fields: ``"write"`` gives ``write.compression``; the top level is
    ``""``), gives its numbers' rules, and adds the rules across its fields in :meth:`check`."""

    table: ClassVar[str] = ""
    numbers: ClassVar[Mapping[str, Number]] = {}

    def __post_init__(self) -> None:
        for name, kind in _kinds(type(self)):
            value = getattr(self, name)
            kept = kind.checked(_named(self.table, name), value)
            if kept is not value:
                msgspec.structs.force_setattr(self, name, kept)
        check_numbers(self.table, self, self.numbers)
        self.check()

    def check(self) -> None:
        """The rules across fields (ValueError); each field is checked before."""


@dataclass(frozen=True)
class _Kind:
    """What a field's value must be: ``wanted`` in words; ``accepts`` says if a value is of
    the right kind; a Literal's ``values``; ``optional``: None is allowed."""

    wanted: str
    accepts: Callable[[object], bool]
    values: tuple[str, ...] = ()
    optional: bool = False
    as_tuple: bool = False
    table: bool = False

    def checked(self, name: str, value: object) -> object:
        """``value``, or the tuple of a list; TypeError or ValueError naming ``name``."""
        if value is None and self.optional:
            return value
        if not self.accepts(value):
            if self.table:
                raise wrong(name, f"{'None or ' if self.optional else ''}{self.wanted}", value)
            raise TypeError(f"{name} must be {self.wanted}, got {value!r}")
        if self.values and value not in self.values:
            raise ValueError(f"{name} must be {self.wanted}, got {value!r}")
        return tuple(value) if self.as_tuple and isinstance(value, list) else value


@functools.cache
def _fields(struct: type[Settings]) -> dict[str, msgspec.structs.FieldInfo]:
    """A struct's fields by name, their annotations resolved (once per struct: that is slow)."""
    return {field.name: field for field in msgspec.structs.fields(struct)}


@functools.cache
def _kinds(struct: type[Settings]) -> tuple[tuple[str, _Kind], ...]:
    """The kind of each field that has one (numbers have their rules instead), worked out once
    per struct from its annotations."""
    kinds = ((name, _kind_of(field.type)) for name, field in _fields(struct).items())
    return tuple((name, kind) for name, kind in kinds if kind is not None)


def _kind_of(annotation: Any) -> _Kind | None:
    options = get_args(annotation) if _is_union(annotation) else (annotation,)
    optional = type(None) in options
    rest = [option for option in options if option is not type(None)]
    if any(option in (int, float) for option in rest):
        return None  # a number (blobsdk/_numbers.py), or write_quorum, which has its own rule
    if len(rest) != 1:
        raise TypeError(f"no check for a setting of type {annotation!r}")
    (only,) = rest
    if only is bool or only is str:
        return _Kind(f"a {only.__name__}", lambda value: isinstance(value, only), optional=optional)
    if get_origin(only) is Literal and all(isinstance(value, str) for value in get_args(only)):
        values = get_args(only)
        return _Kind("one of " + ", ".join(f'"{value}"' for value in values), _is_str, values, optional)
    if get_origin(only) is tuple and get_args(only) == (str, ...):
        return _Kind("a list of str", _is_str_list, optional=optional, as_tuple=True)
    if isinstance(only, type) and issubclass(only, Settings):
        name = only.__name__
        return _Kind(f"{'an' if name[0] in 'AEILOS' else 'a'} {name}", lambda v: isinstance(v, only), (), optional, table=True)
    raise TypeError(f"no check for a setting of type {annotation!r}")


def _is_union(annotation: Any) -> bool:
    return isinstance(annotation, types.UnionType) or get_origin(annotation) is Union


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_str_list(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(item, str) for item in value)


def _named(table: str, field: str) -> str:
    return f"{table}.{field}" if table else field


# --- from a TOML table ---------------------------------------------------------------------------


def from_table(struct: type[S], raw: object) -> S:
    """``struct`` built from a TOML table (a dict; nested tables are dicts) by its constructor,
    nested tables first; ValueError with the message the constructor gives (see the module
    docstring)."""
    try:
        return _built(struct, raw)
    except TypeError as exc:
        raise ValueError(str(exc)) from exc


def _built(struct: type[S], raw: object) -> S:
    if not isinstance(raw, dict):
        raise ValueError(f"{struct.table or 'a client config'} must be a table of keys, got {raw!r}")
    fields = _fields(struct)
    for key in raw:
        if key not in fields:
            raise ValueError(_unknown(struct.table, key, list(fields)))
    for field in fields.values():
        if field.required and field.name not in raw:
            raise ValueError(f"{_named(struct.table, field.name)} is required")
    values = {key: _value(fields[key].type, value) for key, value in raw.items()}
    return struct(**values)


def _value(annotation: Any, value: object) -> object:
    """A nested table built, if ``value`` is one (anything else goes to the constructor as is)."""
    options = get_args(annotation) if _is_union(annotation) else (annotation,)
    tables = [option for option in options if isinstance(option, type) and issubclass(option, Settings)]
    return _built(tables[0], value) if tables and isinstance(value, dict) else value


def _unknown(table: str, key: str, keys: list[str]) -> str:
    nearest = difflib.get_close_matches(key, keys, n=1)
    hint = f"; did you mean {_named(table, nearest[0])}?" if nearest else ""
    return f"unknown key {_named(table, key)}{hint}"
