"""``python -m benchmarks NAME [--quick] [--json FILE]``: run one benchmark.

Every benchmark measures its baselines in the same run and reports ratios (ours / baseline),
because absolute numbers drift on a shared machine.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

from blobsdk.cli.parser import ArgumentParser

BENCHMARKS = {
    "put_get": "benchmarks.put_get",
    "tiers": "benchmarks.tiers",
    "hedging": "benchmarks.hedging",
    "concurrency": "benchmarks.concurrency",
    "tenancy": "benchmarks.tenancy",
    "ingest": "benchmarks.ingest",
    "ingest_s3": "benchmarks.ingest_s3",
    "p2p": "benchmarks.p2p",
    "checkpoint": "benchmarks.checkpoint",
    "metadata": "benchmarks.metadata",
    "write_availability": "benchmarks.write_availability",
    "soak": "benchmarks.soak",
    "s3_read": "benchmarks.s3_read",
    "dlio": "benchmarks.dlio",
    "get_into": "benchmarks.get_into",
    "scale": "benchmarks.scale",
    "swarm_sim": "benchmarks.swarm_sim",
    "membership": "benchmarks.membership",
    "l3": "benchmarks.l3",
    "walk": "benchmarks.walk",
}
# The benchmarks that draw a picture (--png).
PICTURES: tuple[str, ...] = ("ingest", "scale", "swarm_sim", "membership")
# The benchmarks that run on a testbed of emulated hosts (servers/testbed.py) with --hosts N.
ON_HOSTS: tuple[str, ...] = ("hedging", "p2p", "l3", "soak")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (smoke run)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    ingest = parser.add_argument_group("ingest, scale, swarm_sim and membership only")
    ingest.add_argument("--png", type=Path, metavar="PATH", help="the picture (default: next to --json, else NAME.png)")
    ingest.add_argument("--p2p-json", type=Path, metavar="PATH", help="swarm_sim: a p2p run's --json to validate against")
    hosts = parser.add_argument_group(f"{', '.join(ON_HOSTS)} only")
    hosts.add_argument(
        "--hosts",
        type=int,
        metavar="N",
        help="run on a testbed of N emulated hosts, each in its own network namespace with a shaped link (needs root)",
    )
    soak = parser.add_argument_group("soak only")
    soak.add_argument("--duration", type=float, metavar="S", help="seconds of chaos (default 300; --quick: 30)")
    soak.add_argument("--clients", type=int, default=4, metavar="N", help="client processes (default 4)")
    soak.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the ops and the chaos (default 0)")
    soak.add_argument("--redis-s3", action="store_true", help="metadata in Redis, L4 in S3 (moto)")
    soak.add_argument(
        "--api-servers", type=int, default=1, metavar="N", help="API servers over one Redis, failed over between (default 1)"
    )
    soak.add_argument("--clock-skew", type=int, default=4, metavar="S", help="largest clock step of a client, s (default 4)")
    soak.add_argument(
        "--targets",
        metavar="KINDS",
        help="the kinds of server the chaos hits, e.g. 'block' (default: all; kinds: api, block, l3, tracker, redis, s3)",
    )
    args = parser.parse_args(argv)
    soak_flags = ("duration", "clients", "seed", "redis_s3", "clock_skew", "targets", "api_servers")
    if args.name != "soak" and any(getattr(args, a) != parser.get_default(a) for a in soak_flags):
        parser.error("--duration, --clients, --seed, --redis-s3, --api-servers, --clock-skew and --targets are for the soak")
    if args.name not in PICTURES and args.png is not None:
        parser.error(f"--png is for the {', '.join(PICTURES)} benchmarks")
    if args.name != "swarm_sim" and args.p2p_json is not None:
        parser.error("--p2p-json is for the swarm_sim benchmark")
    if args.hosts is not None and args.name not in ON_HOSTS:
        parser.error(f"--hosts is for the {', '.join(ON_HOSTS)} benchmarks")
    if args.hosts is not None and args.hosts < 1:
        parser.error("--hosts must be at least 1")
    if (args.duration is not None and not args.duration > 0) or args.clients < 1 or args.clock_skew < 0:
        parser.error("--duration must be positive, --clients at least 1, --clock-skew >= 0")
    if args.api_servers < 1 or (args.api_servers > 1 and args.redis_s3):
        parser.error("--api-servers must be at least 1, and not with --redis-s3 (whose clients talk to Redis directly)")
    module = importlib.import_module(BENCHMARKS[args.name])
    extra = module.options(args) if hasattr(module, "options") else {}
    report = asyncio.run(module.run(quick=args.quick, **extra))
    report.print_table(sys.stdout)
    if args.json:
        report.write_json(args.json)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
