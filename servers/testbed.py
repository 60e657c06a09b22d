"""The testbed of hosts (servers/testbed_hosts.py: :class:`Testbed`, :class:`Host`, :class:`Link`;
import them from here), and its command line.

``python -m servers.testbed`` (``blobsdk-testbed``): bring up a testbed of hosts, and drive
the links of a running one (a bare testbed, or a cluster on hosts: ``blobsdk-cluster --hosts``)
through the state file in its directory.

    python -m servers.testbed up --dir DIR --host NAME[=UP:DOWN] ...   # until SIGINT/SIGTERM
    python -m servers.testbed hosts --dir DIR
    python -m servers.testbed partition --dir DIR HOST [--direction both|in|out]
    python -m servers.testbed heal --dir DIR HOST
    python -m servers.testbed slow --dir DIR HOST [--up MBIT] [--down MBIT]
    python -m servers.testbed flap --dir DIR HOST --down-s S --up-s S [--cycles N]

Rates are Mbit/s; an empty or absent rate is unshaped (``NAME=1000:`` shapes the uplink only).
``flap`` runs until its ``--cycles`` are done or SIGINT/SIGTERM, and leaves the link healed.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from blobsdk.cli import ArgumentParser

from ._common import prog
from ._common.stopsignals import stop_signals
from .testbed_hosts import DIRECTIONS, Direction, Flap, Host, Link, NetnsError, Testbed, check_address, unavailable

__all__ = [  # the testbed's API (servers/testbed_hosts.py) and this command line
    "Direction",
    "Flap",
    "Host",
    "Link",
    "NetnsError",
    "Testbed",
    "check_address",
    "main",
    "parse_link",
    "unavailable",
]

PROG = f"{__package__}.testbed"


def parse_rate(text: str) -> float | None:
    """A rate in Mbit/s ('' is None: unshaped); ValueError says what is wrong."""
    if text == "":
        return None
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"rate {text!r} is not a number of Mbit/s") from None
    if not 0 < rate < float("inf"):
        raise ValueError(f"rate {text!r} must be positive")
    return rate


def parse_link(spec: str) -> tuple[str, Link]:
    """``NAME`` or ``NAME=UP:DOWN`` (Mbit/s; either may be empty: unshaped)."""
    name, sep, rates = spec.partition("=")
    if not sep:
        return name, Link()
    up, colon, down = rates.partition(":")
    if not colon:
        raise ValueError(f"{spec!r}: rates are UP:DOWN in Mbit/s (e.g. {name}=1000:1000)")
    return name, Link(up=parse_rate(up), down=parse_rate(down))


def _parser() -> tuple[ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each subcommand's (whose errors name the subcommand)."""
    parser = ArgumentParser(prog=prog(PROG), description="Bring up a testbed of hosts, and drive the links of a running one.")
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    made: dict[str, argparse.ArgumentParser] = {}

    def sub(name: str, help: str) -> argparse.ArgumentParser:
        p = made[name] = subs.add_parser(name, help=help)
        p.add_argument("--dir", type=Path, required=True, help="the testbed's directory (its testbed.json)")
        return p

    up = sub("up", "make a testbed with these hosts; run until SIGINT/SIGTERM, then remove it")
    up.add_argument("--host", action="append", default=[], metavar="NAME[=UP:DOWN]", help="a host (repeatable)")
    sub("hosts", "list the hosts of a running testbed")
    p = sub("partition", "drop a host's packets at its link")
    p.add_argument("host")
    p.add_argument("--direction", choices=DIRECTIONS, default="both", help="in, out or both (default)")
    sub("heal", "end a host's partition").add_argument("host")
    slow = sub("slow", "set a host's link rates (an absent one: unshaped)")
    slow.add_argument("host")
    slow.add_argument("--up", type=float, metavar="MBIT", help="host -> bridge rate")
    slow.add_argument("--down", type=float, metavar="MBIT", help="bridge -> host rate")
    flap = sub("flap", "take a host's link down and up again and again")
    flap.add_argument("host")
    flap.add_argument("--down-s", type=float, required=True, metavar="S")
    flap.add_argument("--up-s", type=float, required=True, metavar="S")
    flap.add_argument("--cycles", type=int, metavar="N", help="stop after N downs (default: at SIGINT/SIGTERM)")
    return parser, made


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[tuple[str, Link]]]:
    top, subs = _parser()
    args = top.parse_args(argv)
    parser = subs[args.command]
    links: list[tuple[str, Link]] = []
    try:
        links = [parse_link(spec) for spec in getattr(args, "host", None) or [] if args.command == "up"]
        for name in ("up", "down", "down_s", "up_s"):
            value = getattr(args, name, None)
            if value is not None and not 0 < value < float("inf"):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value:g}")
        if getattr(args, "cycles", None) is not None and args.cycles < 1:
            raise ValueError(f"--cycles must be at least 1, got {args.cycles}")
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "up" and not links:
        parser.error("up needs at least one --host")
    return args, links


class _Stop(Exception):
    pass


def _up(dir: Path, links: list[tuple[str, Link]]) -> int:
    with stop_signals(_Stop) as stopping:
        bed = Testbed(dir=dir.resolve())
        try:
            bed.start()
            for name, link in links:
                bed.add_host(name, link)
            _list(bed)
            print(f"testbed ready in {dir}; Ctrl-C or SIGTERM removes it", file=sys.stderr, flush=True)
            threading.Event().wait()
        except _Stop:
            pass
        finally:
            stopping.ignore()
            bed.stop()
    return 0


def _list(bed: Testbed) -> None:
    for h in bed.hosts.values():
        state = f"partitioned {h.partitioned}" if h.partitioned else "up"
        print(f"{h.name}\t{h.address}\t{h.namespace}\tup={_rate(h.link.up)}\tdown={_rate(h.link.down)}\t{state}", flush=True)


def _rate(mbit: float | None) -> str:
    return "unshaped" if mbit is None else f"{mbit:g}mbit"


def _flap(bed: Testbed, host: str, down_s: float, up_s: float, cycles: int | None) -> None:
    with stop_signals(_Stop) as stopping:
        flap = bed.flap(host, down_s, up_s)
        try:
            while cycles is None or flap.cycles < cycles or flap.host.partitioned:
                threading.Event().wait(0.05)
        except _Stop:
            pass
        finally:
            stopping.ignore()
            flap.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args, links = parse_args(argv)
    if args.command == "up":
        return _up(args.dir, links)
    try:
        bed = Testbed.attach(args.dir)
        if args.command == "hosts":
            _list(bed)
        elif args.command == "partition":
            bed.partition(args.host, args.direction)
        elif args.command == "heal":
            bed.heal(args.host)
        elif args.command == "slow":
            bed.set_link(args.host, up=args.up, down=args.down)
        elif args.command == "flap":
            _flap(bed, args.host, args.down_s, args.up_s, args.cycles)
    except (ValueError, KeyError, NetnsError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
        print(f"{prog(PROG)}: error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
