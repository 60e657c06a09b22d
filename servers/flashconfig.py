"""The L3 flash node's settings: :class:`FlashConfig` (checked when built), and the command
line (``blobsdk-flash``, ``python -m servers.flash``) that builds one."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import msgspec

from blobsdk.cli import ArgumentParser
from blobsdk.config import S3Config

from ._common import prog
from ._common.http import add_serve_args
from ._common.stores import add_s3_args, s3_config_of_args

MiB = 1 << 20


class FlashConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything one flash node needs; ValueError on construction if a setting is invalid."""

    dir: str
    block_urls: tuple[str, ...] = ()  # L4 block servers (replicas), read through in order
    source_url: str | None = None  # or L4 in an object store: s3://BUCKET/PREFIX (see s3)
    s3: S3Config = S3Config()
    capacity_bytes: int
    hold_seconds: float = 0.0  # younger entries are evicted only when nothing else is left
    ttl_seconds: float | None = None
    min_free_ratio: float = 0.05
    quotas: dict[str, int] = {}  # tenant -> bytes its fills and PUTs may hold
    block_token: str | None = None  # bearer token of the block servers (an admin's)
    hydrate_concurrency: int = 8
    pin_seconds: float = 600.0  # default pin of hydrated chunks
    max_chunk_bytes: int = 64 * MiB
    max_jobs: int = 256  # hydrate jobs kept (running + finished)
    threads: int = 4  # disk threads of the cache
    tenant_slots: int = 8  # request slots shared fairly by tenants (with a keyring; servers/_common/admission.py)
    report_rate: float = 5.0  # bad-copy reports a tenant may have re-verified per second (servers/flashreports.py)
    report_burst: int = 10  # ... at once
    report_absorb_seconds: float = 10.0  # a chunk a report found good is not verified again this long

    def __post_init__(self) -> None:
        problems = [msg for bad, msg in _checks(self) if bad]
        if problems:
            raise ValueError("invalid flash config: " + "; ".join(problems))


def _checks(c: FlashConfig) -> Iterator[tuple[bool, str]]:
    yield not c.block_urls and c.source_url is None, "block_urls must name at least one L4 block server (or source_url S3)"
    yield bool(c.block_urls) and c.source_url is not None, "block_urls and source_url both name L4: set one"
    yield c.source_url is not None and not c.source_url.startswith("s3://"), "source_url must be s3://BUCKET[/PREFIX]"
    yield c.capacity_bytes < 1, "capacity_bytes must be positive"
    yield c.hold_seconds < 0 or c.pin_seconds < 0, "hold_seconds and pin_seconds must be >= 0"
    yield c.ttl_seconds is not None and c.ttl_seconds <= 0, "ttl_seconds must be positive"
    yield not 0 <= c.min_free_ratio < 1, "min_free_ratio must be in [0, 1)"
    counts = (c.hydrate_concurrency, c.max_chunk_bytes, c.max_jobs, c.threads, c.tenant_slots, c.report_burst)
    yield min(counts) < 1, "counts must be positive"
    yield not 0 < c.report_rate < float("inf"), "report_rate must be a positive number"
    yield not 0 <= c.report_absorb_seconds < float("inf"), "report_absorb_seconds must be >= 0"
    yield any(q < 0 for q in c.quotas.values()), "quotas must be >= 0"
    yield not all(c.quotas), "tenant names must be non-empty"


def config_of(args: argparse.Namespace) -> FlashConfig:
    """The FlashConfig the parsed flags describe (ValueError if they are invalid)."""
    return FlashConfig(
        dir=str(args.dir),
        block_urls=tuple(args.block_url),
        source_url=args.source,
        s3=s3_config_of_args(args),
        capacity_bytes=int(args.capacity_mb * MiB),
        hold_seconds=args.hold_seconds,
        ttl_seconds=args.ttl_seconds,
        min_free_ratio=args.min_free_ratio,
        quotas=dict(parse_quota(q) for q in args.quota),
        block_token=args.token if args.block_token is None else args.block_token,
        hydrate_concurrency=args.hydrate_concurrency,
        pin_seconds=args.pin_seconds,
        max_chunk_bytes=int(args.max_chunk_mb * MiB),
        tenant_slots=args.tenant_slots,
        report_rate=args.report_rate,
        report_burst=args.report_burst,
        report_absorb_seconds=args.report_absorb_seconds,
    )


def parse_quota(spec: str) -> tuple[str, int]:
    """``TENANT:MiB``."""
    name, sep, mib = spec.rpartition(":")
    try:
        quota = int(float(mib) * MiB) if sep and name else -1
    except ValueError:
        quota = -1
    if not 0 <= quota < 1 << 62:
        raise ValueError(f"--quota {spec!r}: want TENANT:MiB with a number of MiB >= 0")
    return name, quota


def flags() -> argparse.ArgumentParser:
    """The command line of the node."""
    parser = ArgumentParser(prog=prog(f"{__package__}.flash"), description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="directory of the flash cache")
    parser.add_argument(
        "--block-url",
        action="append",
        default=[],
        metavar="URL",
        help="L4 block server to read through (repeat for each replica, in read order)",
    )
    parser.add_argument("--source", default=None, metavar="S3_URL", help="or read through from s3://BUCKET/PREFIX")
    add_s3_args(parser)
    parser.add_argument("--capacity-mb", type=float, default=1024, metavar="N", help="cache capacity, MiB (default 1024)")
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="keep entries at least this long unless nothing else can be evicted (default 0)",
    )
    parser.add_argument("--ttl-seconds", type=float, default=None, metavar="S", help="entries expire after this")
    parser.add_argument(
        "--min-free-ratio", type=float, default=0.05, metavar="R", help="never fill the file system beyond 1 - R (default 0.05)"
    )
    parser.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="TENANT:MiB",
        help="bytes a tenant's chunks may hold in this node's cache (repeatable; default: no quota)",
    )
    parser.add_argument("--block-token", default=None, help="bearer token (an admin's) of the block servers (default: --token)")
    parser.add_argument("--hydrate-concurrency", type=int, default=8, metavar="N", help="L4 reads for hydrate jobs")
    parser.add_argument("--pin-seconds", type=float, default=600.0, metavar="S", help="default pin of hydrated chunks")
    parser.add_argument("--max-chunk-mb", type=float, default=64, metavar="N", help="largest chunk served (default 64)")
    parser.add_argument(
        "--tenant-slots",
        type=int,
        default=8,
        metavar="N",
        help="requests a tenant may run at once while alone; n tenants present share them (with --keys; default 8)",
    )
    parser.add_argument(
        "--report-rate", type=float, default=5.0, metavar="N", help="bad-copy reports verified per second per tenant (default 5)"
    )
    parser.add_argument("--report-burst", type=int, default=10, metavar="N", help="... of them at once (default 10)")
    parser.add_argument(
        "--report-absorb-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="a chunk a report found good is not verified again on reports for S seconds (default 10)",
    )
    add_serve_args(parser)
    return parser
