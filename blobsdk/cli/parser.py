"""The command-line parser of every command of the project (``blobsdk``, each server's,
``python -m benchmarks``): argparse's, without what it lets slip.

- **No abbreviations**, in every subcommand too: ``--block-server 3`` is not taken for
  ``--block-servers 3``, nor ``ls --lon`` for ``ls --long``.
- **An unknown option is the first error**, naming the nearest known one:
  ``unrecognized argument --dirr; did you mean --dir?``.  argparse alone reports it last, after
  what it caused: ``the following arguments are required: --dir``, or ``invalid choice: 'x'``
  for the value that followed it (taken for a subcommand).

A parser with subcommands checks the options up to its first positional argument (in ours, the
subcommand's name); the subcommand's parser (this class too: argparse makes subparsers of the
parent's class) checks the rest.  **An option of the command given after its subcommand** is
named as such, where it goes: ``blobsdk get /b/k --config c.toml`` says ``--config is an
option of blobsdk, before the subcommand: blobsdk --config FILE get ...``.  Python 3.14's
``suggest_on_error`` suggests only for choices, and we run on 3.11.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import re
import sys
from collections.abc import Sequence
from typing import Any

_NUMBER = re.compile(r"-\d+|-\d*\.\d+")  # a negative number is a value, as argparse reads it


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``allow_abbrev=False`` and unknown options refused
    first, with a suggestion (see the module docstring)."""

    def __init__(self, *args: Any, outer: ArgumentParser | None = None, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # whatever is asked, here and in every subparser (made of this class)
        super().__init__(*args, **kwargs)
        self.outer = outer  # the parser whose subcommand this one is

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(type(self), outer=self))
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:  # type: ignore[override]
        arguments = list(sys.argv[1:] if args is None else args)
        self._refuse_unknown_options(arguments)
        return super().parse_known_args(arguments, namespace)

    def _refuse_unknown_options(self, arguments: list[str]) -> None:
        """Exit (argparse's usage error) at the first option, before this parser's subcommand,
        that it does not know."""
        owed = 0  # values the last option still takes
        for arg in arguments:
            if arg == "--":
                return
            if not self._is_option(arg):
                if owed:
                    owed -= 1
                elif self._has_subcommands():
                    return  # a positional (the subcommand's name, or before it): the rest is left to argparse
                continue
            action, name = self._known(arg)
            if action is None:
                self.error(self._misplaced(name) or self._unknown(name))
            owed = 0 if "=" in arg or len(arg) > len(name) else _values_taken(action, len(arguments))

    def _is_option(self, arg: str) -> bool:
        return len(arg) > 1 and arg[0] in self.prefix_chars and " " not in arg and not _NUMBER.fullmatch(arg)

    def _known(self, arg: str) -> tuple[argparse.Action | None, str]:
        """The action ``arg`` names (or None), and the option string it was taken as."""
        actions = self._option_string_actions
        name = arg.split("=", 1)[0]
        if name in actions:
            return actions[name], name
        short = arg[:2]  # -p8080, -vq: a one-letter option with its value (or more flags) attached
        if arg[1] not in self.prefix_chars and short in actions:
            return actions[short], short
        return None, name

    def _misplaced(self, name: str) -> str | None:
        """The error for an option of a command that encloses this subcommand, or None."""
        outer = self.outer
        while outer is not None:
            action = outer._option_string_actions.get(name)
            if action is not None:
                value = "" if action.nargs == 0 else " " + outer._get_formatter()._format_args(action, action.dest.upper())
                subcommand = self.prog.removeprefix(outer.prog).strip()
                return f"{name} is an option of {outer.prog}, before the subcommand: {outer.prog} {name}{value} {subcommand} ..."
            outer = outer.outer
        return None

    def _unknown(self, name: str) -> str:
        """The error for an unknown option: the one shown option it abbreviates, else its
        nearest shown one by name (without the dashes, which would make ``--l3`` look like
        ``--help``).  An abbreviation is refused too, but ``--cr`` is too short for difflib
        to see ``--create`` in it."""
        shown = {o.lstrip(self.prefix_chars): o for a in self._actions if a.help != argparse.SUPPRESS for o in a.option_strings}
        bare = name.lstrip(self.prefix_chars)
        expanded = [known for known in shown if known.startswith(bare)]
        nearest = expanded if len(expanded) == 1 else difflib.get_close_matches(bare, shown, n=1)
        return f"unrecognized argument {name}" + (f"; did you mean {shown[nearest[0]]}?" if nearest else "")

    def _has_subcommands(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self._actions)


def _values_taken(action: argparse.Action, most: int) -> int:
    """How many of the arguments after ``action``'s option it takes (at most ``most``)."""
    nargs = action.nargs
    if nargs is None:
        return 1
    if isinstance(nargs, int):
        return nargs
    return {argparse.OPTIONAL: 1}.get(nargs, most)  # "*", "+", REMAINDER: all it can
