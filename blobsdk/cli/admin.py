"""``blobsdk gc | scrub | stats | plan | prefetch | ckpt ...``: the store's upkeep, what a
client sees, warming tiers, and delta checkpoints."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..client import Client
from ..config import L2Config
from ..errors import BlobError, Unavailable
from ..read import PrefetchProgress
from ..runtime import ProgressLine
from ._common import UsageError, iso, non_negative, print_json, print_pretty, seconds

PROGRESS_S = 0.2  # how often the prefetch progress bar is redrawn
STATS_NOTE = (
    "client: this command's own client, new at each call, so its counters are zero (a process's"
    " counters are its Client.stats()); nodes: the L3 nodes' own stats, since they started"
)
METADATA_DOWN = "metadata: why the metadata store did not answer a listing's first page, here only when it did not"


AddCommand = Callable[..., argparse.ArgumentParser]


async def cmd_gc(client: Client, args: argparse.Namespace) -> int:
    print_json(await client.gc(args.grace, dry_run=args.dry_run))
    return 0


async def cmd_scrub(client: Client, args: argparse.Namespace) -> int:
    """Verify (and unless --dry-run repair) every live block copy; exit 1 if any is left bad."""
    progress = ScrubProgress(sys.stderr)
    report = await client.scrub(dry_run=args.dry_run, progress=progress.blocks)
    progress.finish()
    print_pretty(report)
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
    """The client's and the L3 nodes' counters, and on ``--local`` the store's totals; exit
    1 (after the report) if a node or, on a cluster, the metadata store did not answer (a
    config without L3 nodes has no other server to ask)."""
    nodes = await client.node_stats()
    report: dict[str, Any] = {"about": STATS_NOTE, "client": client.stats(), "nodes": nodes}
    metadata_error = None
    if args.local is not None:
        blobs = nbytes = 0
        async for info in client.list("/"):
            blobs += 1
            nbytes += info.size
        report["store"] = {"blobs": blobs, "bytes": nbytes}
    else:
        metadata_error = await _metadata_error(client)
    if metadata_error is not None:
        report["about"] = f"{STATS_NOTE}; {METADATA_DOWN}"
        report["metadata"] = {"error": metadata_error}
    print_pretty(report)
    return _silent(nodes, metadata_error is not None)


async def _metadata_error(client: Client) -> str | None:
    """Why the metadata store did not answer a listing's first page, or None: a refusal
    (a tenant's token that may not list ``/``) is an answer."""
    try:
        async with aclosing(client.list("/")) as listing:
            async for _ in listing:
                break
    except Unavailable as exc:
        return f"{type(exc).__name__}: {exc}"
    except BlobError:  # it answered, refusing
        return None
    return None


def _silent(nodes: dict[str, dict[str, object]], metadata: bool) -> int:
    """1, said on stderr, if the metadata store or any node answered with an error; else 0."""
    answers = [answer for tier in nodes.values() for answer in tier.values()]
    silent = sum(isinstance(answer, dict) and "error" in answer for answer in answers)
    if not silent and not metadata:
        return 0
    who = [*(["the metadata store"] if metadata else []), *([f"{silent} of the {len(answers)} nodes"] if silent else [])]
    print(f'blobsdk: error: {" and ".join(who)} did not answer (their "error" above)', file=sys.stderr)
    return 1


async def cmd_plan(client: Client, args: argparse.Namespace) -> int:
    print_pretty(await client.plan(args.path))
    return 0


async def cmd_prefetch(client: Client, args: argparse.Namespace) -> int:
    """Warm a tier with these blobs, a progress bar of the dataset's bytes on stderr; the
    final progress and every failed path (or prefix with no blob) as JSON on stdout; exit 1
    if any failed."""
    if args.tier == "l2" and client.config.l2 is None:
        raise UsageError(no_l2(args, os.environ))
    if args.tier == "l3" and not client.config.l3_urls:
        raise UsageError(no_l3(args, os.environ))
    handle = client.prefetch(args.targets, tier=args.tier, pin_seconds=args.pin_seconds)
    ended = asyncio.ensure_future(handle.wait())
    with tqdm(desc=f"prefetch into {args.tier}", unit="B", unit_scale=True, file=sys.stderr, mininterval=0.5) as bar:
        while not ended.done():
            _show(bar, handle.progress)
            await asyncio.wait([ended], timeout=PROGRESS_S)
        progress = await ended
        _show(bar, progress)
    failed = {path: f"{type(exc).__name__}: {exc}" for path, exc in handle.failed.items()}
    for path, exc in handle.failed.items():  # said on stderr too: a prefix with no blob is easy to miss in the JSON
        print(f"blobsdk: error: {exc}" if path in str(exc) else f"blobsdk: error: {path}: {exc}", file=sys.stderr)
    print_json({"progress": progress, "failed": failed})
    return 1 if failed else 0


def no_l2(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """Why ``prefetch --tier l2`` cannot run on this client, and the ``[l2]`` table that
    would let it (L2 is this host's own cache: no cluster's client.toml has one by default)."""
    if args.local is not None:
        return "--tier l2 warms an L2 cache, and a --local store has none: pass --config FILE, a client.toml with an [l2] table"
    source = args.config or environ.get("BLOBSDK_CONFIG")
    where = Path(source).resolve().parent if source else Path.cwd()
    capacity = L2Config(dir="l2").capacity_bytes  # the default
    table = f"[l2]\ndir = {json.dumps(str(where / 'l2'))}\ncapacity_bytes = {capacity}  # {capacity / (1 << 30):g} GiB"
    if not source:
        return (
            "--tier l2 warms an L2 cache, and a config from BLOBSDK_API_URL has none: pass --config FILE, a client.toml"
            f" with\n\n{table}"
        )
    return (
        f"--tier l2 warms this host's L2 cache, and {source} has no [l2] table: add one (dir: a directory on this host's"
        f" local flash; capacity_bytes: the most it may hold), e.g.\n\n{table}"
    )


def no_l3(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """Why ``prefetch`` (``--tier l3``, the default) cannot run on this client: no L3 nodes."""
    if args.local is not None:
        return (
            "prefetch warms a shared cache (--tier l3, the default: the L3 flash nodes; --tier l2: this host's L2), and a"
            " --local store has neither: pass --config FILE, a cluster's client.toml (blobsdk-cluster writes one)"
        )
    source = args.config or environ.get("BLOBSDK_CONFIG") or "a config from BLOBSDK_API_URL"
    return (
        f"--tier l3 (the default) warms the L3 flash nodes, and {source} names none: list them in l3_urls,"
        " or warm this host's L2 with --tier l2"
    )


def _show(bar: tqdm[Any], progress: PrefetchProgress) -> None:
    """The dataset's bytes (each chunk once); into L3, the replica copies apart."""
    bar.total = progress.dataset_bytes
    bar.update(dataset_bytes_done(progress) - bar.n)
    copies = progress.chunks_total != progress.dataset_chunks
    if copies:
        copied = tqdm.format_sizeof(progress.bytes_done, "B")
        text = f"{progress.chunks_done}/{progress.chunks_total} chunk copies, {copied} copied"
    else:
        text = f"{progress.chunks_done}/{progress.chunks_total} chunks"
    bar.set_postfix_str(text, refresh=False)


def dataset_bytes_done(progress: PrefetchProgress) -> int:
    """How much of the dataset is warm: the copies done, in the dataset's bytes (every chunk
    has as many copies as the others, so the shares are the same)."""
    if progress.bytes_total == 0:
        return 0
    return progress.bytes_done * progress.dataset_bytes // progress.bytes_total


# --- checkpoints -----------------------------------------------------------------------------


async def cmd_ckpt_ls(client: Client, args: argparse.Namespace) -> int:
    ck = client.checkpoints(args.prefix)
    for step in await ck.list():
        m = await ck.manifest(step)
        total = m.new_bytes + m.reused_bytes
        print(f"{step:>12}  {iso(m.created)}  {total:>14} bytes  {m.new_bytes:>14} new  {len(m.entries):>6} entries")
    return 0


async def cmd_ckpt_show(client: Client, args: argparse.Namespace) -> int:
    m = await client.checkpoints(args.prefix).manifest(args.step)
    print(f"step {m.step}  created {iso(m.created)}  chunk_size {m.chunk_size}")
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


# --- arguments -------------------------------------------------------------------------


def add_parsers(command: AddCommand, sub: Any) -> None:
    p = command("gc", cmd_gc, "delete L4 blocks no blob references")
    p.add_argument(
        "--grace",
        type=seconds,
        default=3600.0,
        metavar="SECONDS",
        help="only blocks older than this (default 3600; must exceed max_write_seconds)",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted")

    p = command("scrub", cmd_scrub, "verify every replica's copy of every live block and repair bad or missing ones")
    p.add_argument("--dry-run", action="store_true", help="verify and report only: write nothing")

    command(
        "stats",
        cmd_stats,
        "show as JSON the L3 nodes' own stats, this command's client's per-tier counters (zero: each call is a new"
        " client), and on --local the store's blob count and bytes; exits 1 if any node did not answer (its entry"
        ' is an "error"), or on a cluster the metadata store (a "metadata" entry), after showing the rest',
    )

    p = command("plan", cmd_plan, "show a blob's read plan (its chunks and where they are) as JSON")
    p.add_argument("path", metavar="PATH")

    p = command(
        "prefetch",
        cmd_prefetch,
        "warm a shared tier with blobs (a PREFIX ends in '/'), with a progress bar of the dataset's bytes",
    )
    p.add_argument("targets", nargs="+", metavar="PATH_OR_PREFIX")
    p.add_argument(
        "--tier", choices=("l2", "l3"), default="l3", help="l3: the flash nodes (default); l2: this host's local cache"
    )
    p.add_argument("--pin-seconds", type=seconds, default=None, metavar="S", help="l3: keep them pinned this long")

    ckpt = sub.add_parser("ckpt", help="list, show and remove delta checkpoints", description="Delta checkpoints.")
    kinds = ckpt.add_subparsers(dest="ckpt_command", required=True, metavar="CKPT_COMMAND")

    def ckpt_command(name: str, run: Any, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = kinds.add_parser(name, help=help, description=help)
        p.set_defaults(run=run, creates=False)
        p.add_argument("prefix", metavar="PREFIX", help="where the checkpoints are, e.g. /bucket/ckpt/job1")
        return p

    ckpt_command("ls", cmd_ckpt_ls, "list the kept checkpoints: step, time, bytes, new bytes, entries")
    p = ckpt_command("show", cmd_ckpt_show, "show one checkpoint's tensors, sizes, and new vs reused bytes")
    p.add_argument("step", type=non_negative, metavar="STEP")
    p = ckpt_command("rm", cmd_ckpt_rm, "delete one checkpoint (its unshared blocks go at the next gc)")
    p.add_argument("step", type=non_negative, metavar="STEP")
