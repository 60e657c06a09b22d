"""The ``blobsdk`` command (also ``python -m blobsdk``).

    blobsdk [--local DIR [--create] | --config FILE] COMMAND ...

The store is ``--local DIR`` (embedded: SQLite + a block directory), ``--config FILE`` (a
cluster's ``client.toml``), or else the environment (``BLOBSDK_CONFIG``, or
``BLOBSDK_API_URL`` + ``BLOBSDK_BLOCK_URLS``).  A ``--local`` store is made by the first
write (``put``, ``import``) or by ``--create``; any other command refuses a DIR with no store
in it, creating nothing (a typo'd path is not a new empty store).  Exit codes: 0 ok, 1 an
expected failure (``blobsdk: error: <message>`` on stderr, no traceback), 2 a usage error.

One module per group of commands: ``blobs`` (put, get, cat, ls, stat, rm, import),
``admin`` (gc, scrub, stats, plan, prefetch, ckpt ...) and ``offline`` (token ..., demo: no
store needed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._version import __version__
from ..client import Client
from ..config import ClientConfig
from ..errors import BadRequest, BlobError, MissingExtra
from . import admin, blobs, offline
from ._common import Command, Offline, UsageError
from .blobs import MMAP_THRESHOLD
from .parser import ArgumentParser

NO_STORE = "no store: pass --local DIR or --config FILE"
LOCAL_META = "meta.sqlite"  # what makes a directory a local store (blobsdk.assembly.LocalStores)


def no_local_store(root: str) -> str:
    return f"no store in {root!r} (no {LOCAL_META}): a put or import makes one, or pass --create"


# --- store -----------------------------------------------------------------------------


def open_client(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Client:
    """The client the global options (or the environment) name."""
    if args.local is not None:
        if not (args.creates or args.create or (Path(args.local) / LOCAL_META).exists()):
            raise UsageError(no_local_store(args.local))
        return Client.local(args.local)
    if args.create:
        raise UsageError("--create makes a local store: it needs --local DIR")
    try:
        if args.config is not None:
            return Client(ClientConfig.from_toml(args.config))
        if environ.get("BLOBSDK_CONFIG") or environ.get("BLOBSDK_API_URL"):
            return Client(ClientConfig.from_env(dict(environ)))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load client config: {exc}") from exc
    raise UsageError(NO_STORE)


# --- argument parsing ------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="blobsdk", description="Read and write blobs in a blobsdk store.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--local", metavar="DIR", help="embedded store in DIR (SQLite + local blocks)")
    store.add_argument("--config", metavar="FILE", help="cluster client.toml (default: $BLOBSDK_CONFIG)")
    parser.add_argument(
        "--create", action="store_true", help="with --local: make the store if DIR has none (put and import always do)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Command, help: str, *, creates: bool = False) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
        p.set_defaults(run=run, creates=creates)
        return p

    blobs.add_parsers(command)
    admin.add_parsers(command, sub)
    offline.add_parsers(sub)
    return parser


# --- entry point -----------------------------------------------------------------------


async def _dispatch(args: argparse.Namespace) -> int:
    run: Command = args.run
    async with open_client(args) as client:
        return await run(client, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.run is None:
            run: Offline = args.offline
            return run(args)
        return asyncio.run(_dispatch(args))
    except BadRequest as exc:  # an argument the client refused (e.g. gc --grace too short)
        return _fail(exc, 2)
    except BlobError as exc:
        return _fail(exc, 1)
    except UsageError as exc:
        return _fail(exc, 2)
    except ValueError as exc:  # a setting the client refused
        return _fail(exc, 2)
    except OSError as exc:  # a local file: missing, unreadable, unwritable
        return _fail(exc, 1)
    except MissingExtra as exc:  # a store this install cannot reach (s3://, redis://): what to pip install
        return _fail(exc, 1)
    except KeyboardInterrupt:
        return 130


def _fail(exc: BaseException, code: int) -> int:
    if isinstance(exc, BrokenPipeError):  # `blobsdk cat ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    print(f"blobsdk: error: {exc}", file=sys.stderr)
    return code


__all__ = ["MMAP_THRESHOLD", "NO_STORE", "ArgumentParser", "build_parser", "main", "open_client"]
