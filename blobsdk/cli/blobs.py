"""``blobsdk put | get | cat | ls | stat | rm | import``: blobs one at a time, and trees."""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path, PurePosixPath

from ..chunks import refuse_reserved, validate_prefix, validate_writable
from ..client import Client
from ..errors import InvalidPath
from ..ops import IndexProgress
from ..runtime import ProgressLine
from ..sources import Buffer
from ._common import Command, UsageError, iso, non_negative, print_json, print_pretty, write_stdout
from .outfile import OutFile

MiB = 1 << 20
MMAP_THRESHOLD = 4 * MiB  # import reads smaller files into memory, maps larger ones
STDIO = "-"  # put's LOCAL_FILE, get's OUT: stdin, stdout

AddCommand = Callable[..., argparse.ArgumentParser]


async def cmd_put(client: Client, args: argparse.Namespace) -> int:
    if args.local_file == STDIO:
        data: Buffer = await asyncio.to_thread(sys.stdin.buffer.read)
    else:
        data = await asyncio.to_thread(_load, Path(args.local_file))
    info = await client.put(args.path, data, if_version=args.if_version)
    print_json(info)
    return 0


async def cmd_get(client: Client, args: argparse.Namespace) -> int:
    if args.out in (None, STDIO):
        write_stdout(await client.get(args.path, args.offset, args.length))
        return 0
    out = await asyncio.to_thread(OutFile, _out_file(Path(args.out), args.path))
    try:
        data = await client.get(args.path, args.offset, args.length)
    except BaseException:
        out.discard()
        raise
    await asyncio.to_thread(out.commit, data)
    return 0


def _out_file(out: Path, path: str) -> Path:
    """``OUT``, or for a directory (or a link to one) the blob's last segment in it, as
    ``cp`` does."""
    return out / PurePosixPath(path).name if out.is_dir() else out


async def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    async for info in client.list(args.prefix):
        if args.long:
            print(f"{info.size:>14}  v{info.version:<5} {iso(info.created)}  {info.path}")
        else:
            print(info.path)
    return 0


async def cmd_stat(client: Client, args: argparse.Namespace) -> int:
    print_pretty(await client.stat(args.path))
    return 0


async def cmd_rm(client: Client, args: argparse.Namespace) -> int:
    print_json(await client.delete(args.path, if_version=args.if_version))
    return 0


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
    from tqdm import tqdm

    with tqdm(desc="index in place", unit="B", unit_scale=True, file=sys.stderr, mininterval=0.5) as bar:

        def show(progress: IndexProgress) -> None:
            bar.total = progress.bytes_total
            bar.update(progress.bytes_done - bar.n)
            bar.set_postfix_str(f"{progress.objects_done}/{progress.objects_total} objects", refresh=False)

        report = await client.index_s3(args.source, args.prefix, progress=show)
    if not report.objects:
        print(f"blobsdk: no objects under {args.source}", file=sys.stderr)
    print_json(report)
    return 1 if report.failed or report.skipped else 0


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
    refuse_reserved(prefix)
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
            path = validate_writable(prefix + rel)
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


# --- arguments -------------------------------------------------------------------------


def add_parsers(command: AddCommand) -> None:
    """``command(name, run, help, creates=...)`` makes a subcommand's parser."""
    p = command("put", cmd_put, "write a local file (or stdin: -) as a blob", creates=True)
    p.add_argument("local_file", metavar="LOCAL_FILE|-")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--if-version", type=non_negative, metavar="N", help="only if the live version is N (0: create only)")

    p = command("get", cmd_get, "read a blob (or a byte range of it) to a file, into a directory, or to stdout")
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "out",
        nargs="?",
        metavar="OUT|DIR|-",
        help="output file (default: stdout); a directory gets the blob's last segment as its name, as cp does;"
        " a FIFO or device is written through, a symlink is followed (never replaced)",
    )
    p.add_argument("--offset", type=non_negative, default=0, metavar="N")
    p.add_argument("--length", type=non_negative, default=None, metavar="N")

    p = command("cat", cmd_get, "write a blob to stdout")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(out=STDIO, offset=0, length=None)

    p = command("ls", cmd_ls, "list blobs under a prefix, sorted by path ('/a' lists bucket a only)")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument("--long", "-l", action="store_true", help="also size, version and creation time")

    p = command("stat", cmd_stat, "show a blob's metadata as JSON")
    p.add_argument("path", metavar="PATH")

    p = command("rm", cmd_rm, "delete a blob")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--if-version", type=non_negative, metavar="N", help="only if the live version is N")

    p = command(
        "import",
        cmd_import,
        "upload a local directory tree under PREFIX (symlinks skipped), or index an S3 directory in place (--in-place)",
        creates=True,
    )
    p.add_argument("source", metavar="DIR|s3://BUCKET/DIR")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument(
        "--in-place",
        action="store_true",
        help="s3:// only: make blobs of the objects where they are, no copy (again: only what changed)",
    )


__all__ = ["MMAP_THRESHOLD", "Command", "add_parsers"]
