"""``blobsdk token ...`` and ``blobsdk demo``: commands that need no store (keyrings and
signed tokens, blobsdk/auth.py; the demo opens an embedded store of its own)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import auth
from ..demo import run_demo
from ._common import Offline, print_json

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def cmd_token_keygen(args: argparse.Namespace) -> int:
    """A new keyring in FILE, or (FILE exists) one more key in it, made the active one."""
    path = Path(args.file)
    if path.exists():
        old = auth.Keyring.load(path)
        kid = args.key_id or _next_key_id(old.key_ids)
        ring = old.with_key(kid)
    else:
        ring = auth.Keyring.generate(args.key_id or "k1")
    _write_private(path, ring.to_toml())
    print(f"wrote {path}: keys {', '.join(ring.key_ids)}; {ring.active} signs from now on", file=sys.stderr)
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    ring = auth.Keyring.load(args.keys)
    claims = auth.new_claims(args.tenant, tuple(args.bucket), args.ttl, admin=args.admin)
    print(ring.sign_token(claims))
    return 0


def cmd_token_show(args: argparse.Namespace) -> int:
    """The claims of a token as JSON; with --keys, only if it verifies now."""
    if args.keys is not None:
        claims = auth.Keyring.load(args.keys).verify_token(args.token, time.time())
    else:
        claims = auth.read_claims(args.token)
    print_json(claims)
    return 0


def _next_key_id(kids: Sequence[str]) -> str:
    n = len(kids) + 1
    while f"k{n}" in kids:
        n += 1
    return f"k{n}"


def _write_private(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only, atomically (temp + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _duration(text: str) -> float:
    """Seconds, or a number with a unit: 90s, 15m, 12h, 7d."""
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _DURATION_UNITS else (text, "s")
    try:
        value = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (want e.g. 3600, 90s, 15m, 12h, 7d)") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return value


def _demo(args: argparse.Namespace) -> int:
    return asyncio.run(cmd_demo(args))


async def cmd_demo(args: argparse.Namespace) -> int:
    report = await run_demo(args.dir, args.size_mb, keep=args.keep)
    if not report.ok:
        print(f"blobsdk: error: demo verification failed: {report.problems}", file=sys.stderr)
        return 1
    return 0


# --- arguments -------------------------------------------------------------------------


def add_parsers(sub: Any) -> None:
    _token_parsers(sub)
    p = sub.add_parser(
        "demo",
        help="ingest, read back and verify a synthetic dataset",
        description="Ingest a synthetic dataset, read it back as a training epoch, verify every byte.",
    )
    p.set_defaults(run=None, offline=_demo)  # the demo opens its own embedded store
    p.add_argument("--dir", type=Path, default=None, help="store directory (default: a temporary one)")
    p.add_argument("--size-mb", type=int, default=300, metavar="N", help="dataset size in MiB (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the temporary store directory")


def _token_parsers(sub: Any) -> None:
    token = sub.add_parser(
        "token", help="make keyrings and signed tenant tokens", description="Make keyrings and signed tenant tokens."
    )
    kinds = token.add_subparsers(dest="token_command", required=True, metavar="TOKEN_COMMAND")

    def command(name: str, run: Offline, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = kinds.add_parser(name, help=help, description=help)
        p.set_defaults(run=None, offline=run)
        return p

    p = command(
        "keygen", cmd_token_keygen, "write a new keyring to FILE, or add a key to FILE's keyring and make it the signing key"
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--key-id", metavar="ID", help="name of the new key (default: k1, k2, ...)")

    p = command("create", cmd_token_create, "print a signed token for a tenant")
    p.add_argument("--keys", required=True, metavar="FILE", help="keyring file (signs with its active key)")
    p.add_argument("--tenant", required=True, metavar="NAME")
    p.add_argument(
        "--bucket", action="append", default=[], metavar="BUCKET", help="a bucket the tenant may use (repeatable; '*': all)"
    )
    p.add_argument("--admin", action="store_true", help="may also list and delete blocks, scan plans, see every tenant's stats")
    p.add_argument(
        "--ttl", type=_duration, required=True, metavar="DURATION", help="valid for this long: 3600, 90s, 15m, 12h, 7d"
    )

    p = command("show", cmd_token_show, "print a token's claims as JSON")
    p.add_argument("token", metavar="TOKEN")
    p.add_argument("--keys", metavar="FILE", help="also verify it against this keyring, now")
