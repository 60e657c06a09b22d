"""The ``blobsdk`` command (also ``python -m blobsdk``).

    blobsdk [--local DIR | --config FILE] COMMAND ...

The store is ``--local DIR`` (embedded: SQLite + a block directory), ``--config FILE`` (a
cluster's ``client.toml``), or else the environment (``BLOBSDK_CONFIG``, or
``BLOBSDK_API_URL`` + ``BLOBSDK_BLOCK_URLS``).  Exit codes: 0 ok, 1 an expected failure
(``blobsdk: error: <message>`` on stderr, no traceback), 2 a usage error.

``blobsdk token ...`` and ``blobsdk demo`` need no store: they make keyrings and signed
tokens (blobsdk/auth.py), and run the demo on an embedded store of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import mmap
import os
import stat
import sys
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from tqdm import tqdm

from . import auth
from ._outfile import write_out
from ._progress import ProgressLine
from .client import Client
from .config import ClientConfig
from .demo import run_demo
from .errors import BadRequest, BlobError, InvalidPath
from .index import IndexProgress
from .paths import validate_path, validate_prefix
from .prefetch import PrefetchProgress
from .sources.base import Buffer

MiB = 1 << 20
PROGRESS_S = 0.2  # how often the prefetch progress bar is redrawn
MMAP_THRESHOLD = 4 * MiB  # import reads smaller files into memory, maps larger ones
NO_STORE = "no store: pass --local DIR or --config FILE"

Command = Callable[[Client, argparse.Namespace], Awaitable[int]]
Offline = Callable[[argparse.Namespace], int]  # a command that needs no store


class UsageError(Exception):
    """Bad invocation: exit code 2."""


# --- store -----------------------------------------------------------------------------


def open_client(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Client:
    """The client the global options (or the environment) name."""
    if args.local is not None:
        return Client.local(args.local)
    try:
        if args.config is not None:
            return Client(ClientConfig.from_toml(args.config))
        if environ.get("BLOBSDK_CONFIG") or environ.get("BLOBSDK_API_URL"):
            return Client(ClientConfig.from_env(dict(environ)))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load client config: {exc}") from exc
    raise UsageError(NO_STORE)


# --- commands --------------------------------------------------------------------------


async def cmd_put(client: Client, args: argparse.Namespace) -> int:
    data = await asyncio.to_thread(_load, Path(args.local_file))
    info = await client.put(args.path, data, if_version=args.if_version)
    _print_json(info)
    return 0


async def cmd_get(client: Client, args: argparse.Namespace) -> int:
    data = await client.get(args.path, args.offset, args.length)
    if args.out in (None, "-"):
        _write_stdout(data)
    else:
        await asyncio.to_thread(write_out, Path(args.out), data)
    return 0


async def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    async for info in client.list(args.prefix):
        if args.long:
            print(f"{info.size:>14}  v{info.version:<5} {_iso(info.created)}  {info.path}")
        else:
            print(info.path)
    return 0


async def cmd_stat(client: Client, args: argparse.Namespace) -> int:
    info = await client.stat(args.path)
    print(msgspec.json.format(msgspec.json.encode(info), indent=2).decode())
    return 0


async def cmd_rm(client: Client, args: argparse.Namespace) -> int:
    _print_json(await client.delete(args.path, if_version=args.if_version))
    return 0


async def cmd_ckpt_ls(client: Client, args: argparse.Namespace) -> int:
    ck = client.checkpoints(args.prefix)
    for step in await ck.list():
        m = await ck.manifest(step)
        total = m.new_bytes + m.reused_bytes
        print(f"{step:>12}  {_iso(m.created)}  {total:>14} bytes  {m.new_bytes:>14} new  {len(m.entries):>6} entries")
    return 0


async def cmd_ckpt_show(client: Client, args: argparse.Namespace) -> int:
    m = await client.checkpoints(args.prefix).manifest(args.step)
    print(f"step {m.step}  created {_iso(m.created)}  chunk_size {m.chunk_size}")
    print(f"{m.new_bytes + m.reused_bytes} bytes: {m.new_bytes} new, {m.reused_bytes} reused from earlier checkpoints")
    for e in m.entries:
        name = "/".join(e.name)
        if e.kind == "json":
            print(f"  {name}  json  {e.value.decode()}")
            continue
        kind = "bytes" if e.kind == "bytes" else f"{e.kind} {e.dtype} [{', '.join(map(str, e.shape))}]"
        print(f"  {name}  {kind}  {e.nbytes} bytes, {e.new_bytes} new")
    return 0


async def cmd_ckpt_rm(client: Client, args: argparse.Namespace) -> int:
    await client.checkpoints(args.prefix).remove(args.step)
    return 0


async def cmd_gc(client: Client, args: argparse.Namespace) -> int:
    _print_json(await client.gc(args.grace, dry_run=args.dry_run))
    return 0


async def cmd_scrub(client: Client, args: argparse.Namespace) -> int:
    """Verify (and unless --dry-run repair) every live block copy; exit 1 if any is left bad."""
    progress = ScrubProgress(sys.stderr)
    report = await client.scrub(dry_run=args.dry_run, progress=progress.blocks)
    progress.finish()
    print(msgspec.json.format(msgspec.json.encode(report), indent=2).decode())
    return 0 if report.ok else 1


class ScrubProgress(ProgressLine):
    """``done/total blocks, MiB verified, MiB/s`` on the progress line."""

    total = 0

    def blocks(self, done: int, total: int, nbytes: int) -> None:
        self.total = total
        self.update(done, nbytes)

    def text(self) -> str:
        return f"{self.blobs}/{self.total} blocks, " + super().text().split(", ", 1)[1]


async def cmd_stats(client: Client, args: argparse.Namespace) -> int:
    report = {"client": client.stats(), "nodes": await client.node_stats()}
    print(msgspec.json.format(msgspec.json.encode(report), indent=2).decode())
    return 0


async def cmd_plan(client: Client, args: argparse.Namespace) -> int:
    plan = await client.plan(args.path)
    print(msgspec.json.format(msgspec.json.encode(plan), indent=2).decode())
    return 0


async def cmd_prefetch(client: Client, args: argparse.Namespace) -> int:
    """Warm a tier with these blobs, a progress bar on stderr; the final progress and every
    failed path as JSON on stdout; exit 1 if any path failed."""
    handle = client.prefetch(args.targets, tier=args.tier, pin_seconds=args.pin_seconds)
    ended = asyncio.ensure_future(handle.wait())
    with tqdm(desc=f"prefetch into {args.tier}", unit="B", unit_scale=True, file=sys.stderr, mininterval=0.5) as bar:
        while not ended.done():
            _show(bar, handle.progress)
            await asyncio.wait([ended], timeout=PROGRESS_S)
        progress = await ended
        _show(bar, progress)
    failed = {path: f"{type(exc).__name__}: {exc}" for path, exc in handle.failed.items()}
    _print_json({"progress": progress, "failed": failed})
    return 1 if failed else 0


def _show(bar: tqdm[Any], progress: PrefetchProgress) -> None:
    bar.total = progress.bytes_total
    bar.update(progress.bytes_done - bar.n)
    bar.set_postfix_str(f"{progress.chunks_done}/{progress.chunks_total} chunks", refresh=False)


async def cmd_import(client: Client, args: argparse.Namespace) -> int:
    if args.source.startswith("s3://"):
        if not args.in_place:
            raise UsageError("an s3:// source is indexed in place, not copied: add --in-place")
        return await _index_in_place(client, args)
    if args.in_place:
        raise UsageError(f"--in-place indexes objects of an S3 bucket (s3://BUCKET/DIR), not {args.source!r}")
    root = Path(args.source)
    if not root.is_dir():  # noqa: ASYNC240 - one stat before the import starts, nothing else waits on the loop
        raise UsageError(f"not a directory: {args.source}")
    progress = ProgressLine(sys.stderr)
    tally = ImportTally(progress)
    await client.put_many(_import_items(root, _key_prefix(args.prefix), tally), progress=progress.update)
    progress.finish()
    tally.report()
    return 1 if tally.failed else 0


async def _index_in_place(client: Client, args: argparse.Namespace) -> int:
    """Index the objects under an s3:// URL, a progress bar on stderr; the report as JSON on
    stdout; exit 1 if an object failed or a key was skipped."""
    with tqdm(desc="index in place", unit="B", unit_scale=True, file=sys.stderr, mininterval=0.5) as bar:

        def show(progress: IndexProgress) -> None:
            bar.total = progress.bytes_total
            bar.update(progress.bytes_done - bar.n)
            bar.set_postfix_str(f"{progress.objects_done}/{progress.objects_total} objects", refresh=False)

        report = await client.index_s3(args.source, args.prefix, progress=show)
    if not report.objects:
        print(f"blobsdk: no objects under {args.source}", file=sys.stderr)
    _print_json(report)
    return 1 if report.failed or report.skipped else 0


# --- tokens ------------------------------------------------------------------------------

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
    _print_json(claims)
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


# --- import ----------------------------------------------------------------------------


class ImportTally:
    """Files skipped by an import, reported as they are met and summed at the end."""

    def __init__(self, progress: ProgressLine) -> None:
        self.progress = progress
        self.symlinks = self.invalid = self.unreadable = 0

    def skip_symlink(self, local: Path) -> None:
        self.symlinks += 1

    def skip_invalid(self, local: Path, exc: InvalidPath) -> None:
        self.invalid += 1
        self.progress.note(f"blobsdk: skipped {str(local)!r}: invalid blob path: {exc}")

    def skip_unreadable(self, local: Path, exc: OSError) -> None:
        self.unreadable += 1
        self.progress.note(f"blobsdk: skipped {str(local)!r}: {exc.strerror or exc}")

    @property
    def failed(self) -> bool:
        return bool(self.invalid or self.unreadable)

    def report(self) -> None:
        parts = [
            f"{n} {what}"
            for n, what in ((self.symlinks, "symlinks"), (self.invalid, "invalid paths"), (self.unreadable, "unreadable files"))
            if n
        ]
        if parts:
            self.progress.note("skipped: " + ", ".join(parts))


def _key_prefix(prefix: str) -> str:
    """``/bucket/dir`` or ``/bucket/dir/`` -> ``/bucket/dir/``."""
    validate_prefix(prefix)
    return prefix if prefix.endswith("/") else prefix + "/"


def _walk(root: Path, tally: ImportTally) -> Iterator[tuple[Path, str]]:
    """(local file, posix path relative to ``root``) of every regular file, sorted; symlinks
    are skipped, never followed."""
    stack = [(root, "")]
    while stack:
        directory, rel = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name, reverse=True)
        for entry in entries:
            if entry.is_symlink():
                tally.skip_symlink(Path(entry.path))
            elif entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), f"{rel}{entry.name}/"))
            elif entry.is_file(follow_symlinks=False):
                yield Path(entry.path), rel + entry.name


def _next_item(files: Iterator[tuple[Path, str]], prefix: str, tally: ImportTally) -> tuple[str, Buffer] | None:
    """The next (blob path, bytes) to import, or None at the end (runs in a thread)."""
    for local, rel in files:
        try:
            path = validate_path(prefix + rel)
            return path, _load(local)
        except InvalidPath as exc:
            tally.skip_invalid(local, exc)
        except OSError as exc:
            tally.skip_unreadable(local, exc)
    return None


async def _import_items(root: Path, prefix: str, tally: ImportTally) -> AsyncIterator[tuple[str, Buffer]]:
    """Feed put_many one file at a time, walking and reading off the event loop."""
    files = _walk(root, tally)
    while (item := await asyncio.to_thread(_next_item, files, prefix, tally)) is not None:
        yield item


def _load(local: Path) -> Buffer:
    """A local file's bytes.  A large regular file is mapped, not copied, and unmapped once
    the last view of it is dropped (never closed by hand: a failed put's traceback may still
    hold views of it).  Anything else is read to its end: small files, and files whose size
    says nothing (a pipe, ``/dev/stdin``, a ``/proc`` file reporting 0 bytes)."""
    with open(local, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size < MMAP_THRESHOLD:
            return f.read()
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))  # the view keeps the map


# --- local files -----------------------------------------------------------------------


def _write_stdout(data: Buffer) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _print_json(obj: Any) -> None:
    print(msgspec.json.encode(obj).decode())


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- argument parsing ------------------------------------------------------------------


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value):  # nan compares false with every cutoff: gc would do nothing
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blobsdk", description="Read and write blobs in a blobsdk store.")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--local", metavar="DIR", help="embedded store in DIR (SQLite + local blocks)")
    store.add_argument("--config", metavar="FILE", help="cluster client.toml (default: $BLOBSDK_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Command, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(run=run)
        return p

    p = command("put", cmd_put, "write a local file as a blob")
    p.add_argument("local_file", metavar="LOCAL_FILE")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--if-version", type=_non_negative, metavar="N", help="only if the live version is N (0: create only)")

    p = command("get", cmd_get, "read a blob (or a byte range of it) to a file or stdout")
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "out",
        nargs="?",
        metavar="OUT|-",
        help="output file (default: stdout); a FIFO or device is written through, a symlink is followed (never replaced)",
    )
    p.add_argument("--offset", type=_non_negative, default=0, metavar="N")
    p.add_argument("--length", type=_non_negative, default=None, metavar="N")

    p = command("cat", cmd_get, "write a blob to stdout")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(out="-", offset=0, length=None)

    p = command("ls", cmd_ls, "list blobs under a prefix, sorted by path")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument("--long", "-l", action="store_true", help="also size, version and creation time")

    p = command("stat", cmd_stat, "show a blob's metadata as JSON")
    p.add_argument("path", metavar="PATH")

    p = command("rm", cmd_rm, "delete a blob")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--if-version", type=_non_negative, metavar="N", help="only if the live version is N")

    p = command(
        "import",
        cmd_import,
        "upload a local directory tree under PREFIX (symlinks skipped), or index an S3 directory in place (--in-place)",
    )
    p.add_argument("source", metavar="DIR|s3://BUCKET/DIR")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument(
        "--in-place",
        action="store_true",
        help="s3:// only: make blobs of the objects where they are, no copy (again: only what changed)",
    )

    p = command("gc", cmd_gc, "delete L4 blocks no blob references")
    p.add_argument(
        "--grace",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="only blocks older than this (default 3600; must exceed max_write_seconds)",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted")

    p = command("scrub", cmd_scrub, "verify every replica's copy of every live block and repair bad or missing ones")
    p.add_argument("--dry-run", action="store_true", help="verify and report only: write nothing")

    command("stats", cmd_stats, "show this client's per-tier counters and the L3 nodes' own stats as JSON")

    p = command("plan", cmd_plan, "show a blob's read plan (its chunks and where they are) as JSON")
    p.add_argument("path", metavar="PATH")

    p = command("prefetch", cmd_prefetch, "warm a shared tier with blobs (a PREFIX ends in '/'), with a progress bar")
    p.add_argument("targets", nargs="+", metavar="PATH_OR_PREFIX")
    p.add_argument(
        "--tier", choices=("l2", "l3"), default="l3", help="l3: the flash nodes (default); l2: this host's local cache"
    )
    p.add_argument("--pin-seconds", type=_seconds, default=None, metavar="S", help="l3: keep them pinned this long")

    _token_parsers(sub)
    _ckpt_parsers(sub)

    p = sub.add_parser(
        "demo",
        help="ingest, read back and verify a synthetic dataset",
        description="Ingest a synthetic dataset, read it back as a training epoch, verify every byte.",
    )
    p.set_defaults(run=None, offline=_demo)  # the demo opens its own embedded store
    p.add_argument("--dir", type=Path, default=None, help="store directory (default: a temporary one)")
    p.add_argument("--size-mb", type=int, default=300, metavar="N", help="dataset size in MiB (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the temporary store directory")
    return parser


def _ckpt_parsers(sub: Any) -> None:
    ckpt = sub.add_parser("ckpt", help="list, show and remove delta checkpoints", description="Delta checkpoints.")
    kinds = ckpt.add_subparsers(dest="ckpt_command", required=True, metavar="CKPT_COMMAND")

    def command(name: str, run: Command, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = kinds.add_parser(name, help=help, description=help)
        p.set_defaults(run=run)
        p.add_argument("prefix", metavar="PREFIX", help="where the checkpoints are, e.g. /bucket/ckpt/job1")
        return p

    command("ls", cmd_ckpt_ls, "list the kept checkpoints: step, time, bytes, new bytes, entries")
    p = command("show", cmd_ckpt_show, "show one checkpoint's tensors, sizes, and new vs reused bytes")
    p.add_argument("step", type=_non_negative, metavar="STEP")
    p = command("rm", cmd_ckpt_rm, "delete one checkpoint (its unshared blocks go at the next gc)")
    p.add_argument("step", type=_non_negative, metavar="STEP")


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


# --- entry point -----------------------------------------------------------------------


async def _dispatch(args: argparse.Namespace) -> int:
    run: Command = args.run
    async with open_client(args) as client:
        return await run(client, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.run is None:
            offline: Offline = args.offline
            return offline(args)
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
    except KeyboardInterrupt:
        return 130


def _fail(exc: BaseException, code: int) -> int:
    if isinstance(exc, BrokenPipeError):  # `blobsdk cat ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    print(f"blobsdk: error: {exc}", file=sys.stderr)
    return code
