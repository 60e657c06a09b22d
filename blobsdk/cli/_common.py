"""What every ``blobsdk`` command module shares: the exit-code exceptions, argument types and
output helpers."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..client import Client
from ..sources import Buffer

Command = Callable[[Client, argparse.Namespace], Awaitable[int]]
Offline = Callable[[argparse.Namespace], int]  # a command that needs no store


class UsageError(Exception):
    """Bad invocation: exit code 2."""


def non_negative(text: str) -> int:
    """A whole number >= 0 (``--offset``, ``--length``, ``--if-version``, a step)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value):  # nan compares false with every cutoff: gc would do nothing
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
    return value


def write_stdout(data: Buffer) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def print_json(obj: Any) -> None:
    print(msgspec.json.encode(obj).decode())


def print_pretty(obj: Any) -> None:
    print(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode())


def iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
