"""The command line of the one-command cluster (servers/cluster.py, ``blobsdk-cluster``):
its flags, checked, as the cluster's directory and :class:`ClusterOptions`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from blobsdk.cli import ArgumentParser
from blobsdk.config import check_redis_url, s3_location

from ._common import prog
from ._common.stores import add_s3_args, s3_config_of_args
from .clusterhosts import add_hosts_args, check_links, links_of_args
from .clusterplan import KINDS, METADATA_FOR_SEVERAL, OWN_REDIS, ClusterOptions, launch_table, service_hosts, with_service_token

DESCRIPTION = (
    "Start a whole local blobsdk cluster: the metadata API server, N L4 block servers, M L3 flash nodes "
    "and the peer tier's trackers, each a real subprocess on a free loopback port."
)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Path, ClusterOptions]:
    dir, options, _ = parse_cli(argv)
    return dir, options


def parse_cli(argv: Sequence[str] | None = None) -> tuple[Path, ClusterOptions, bool]:
    """The cluster's directory, options, and whether dead servers are restarted."""
    parser = ArgumentParser(prog=prog(f"{__package__}.cluster"), description=DESCRIPTION)
    parser.add_argument("--dir", type=Path, required=True, help="data, logs and client.toml go here")
    parser.add_argument("--block-servers", type=int, default=3, metavar="N", help="L4 block servers (default 3)")
    parser.add_argument("--write-quorum", type=int, metavar="Q", help="block replicas a write needs (default: a majority)")
    parser.add_argument("--latency-ms", type=float, metavar="F", help="emulated HDD seek latency per block request")
    parser.add_argument("--bandwidth-mbps", type=float, metavar="F", help="emulated HDD bandwidth of each block server, MB/s")
    parser.add_argument("--spindles", type=int, metavar="N", help="concurrent data requests each block server serves")
    parser.add_argument("--token", help="static admin bearer token every server requires (written to client.toml)")
    parser.add_argument(
        "--keys",
        type=Path,
        metavar="FILE",
        help="keyring every server takes: tenants with tokens from 'blobsdk token create' (default: no tenants)",
    )
    parser.add_argument("--l3-nodes", type=int, default=2, metavar="M", help="L3 flash nodes (default 2)")
    parser.add_argument(
        "--l3-capacity-mb", type=float, default=1024, metavar="N", help="capacity of each L3 node, MiB (default 1024)"
    )
    parser.add_argument("--l3-hold-seconds", type=float, default=0.0, metavar="S", help="hold period of the L3 nodes (default 0)")
    parser.add_argument("--trackers", type=int, default=1, metavar="N", help="peer-tier trackers (default 1; 0: no peer tier)")
    parser.add_argument("--startup-timeout", type=float, default=30.0, metavar="S", help="seconds (default 30)")
    for kind in KINDS:
        parser.add_argument(
            f"--{kind.name}-faults",
            action="append",
            default=[],
            metavar="SPEC",
            help=f"a --fault SPEC for every {kind.name} server (repeatable)",
        )
    parser.add_argument("--admin-token", help="every server mounts /admin/faults behind this bearer token")
    parser.add_argument(
        "--metadata",
        metavar="URL",
        help="redis://HOST:PORT/DB: the API servers' metadata in Redis; 'redis': in a Redis and its replica the cluster starts",
    )
    parser.add_argument(
        "--api-servers", type=int, default=1, metavar="N", help="metadata API servers (default 1; more need --metadata)"
    )
    parser.add_argument("--source", metavar="S3_URL", help="s3://BUCKET/PREFIX: L4 in an object store, no block servers")
    add_s3_args(parser)
    parser.add_argument(
        "--seaweedfs", action="store_true", help="L4 on a local SeaweedFS this starts and stops (no block servers)"
    )
    parser.add_argument(
        "--no-restart", action="store_true", help="leave a server that dies down (default: restart it, with backoff)"
    )
    add_hosts_args(parser)
    args = parser.parse_args(argv)
    if args.block_servers < 1:
        parser.error("--block-servers must be at least 1")
    if args.write_quorum is not None and not 1 <= args.write_quorum <= args.block_servers:
        parser.error(f"--write-quorum must be between 1 and --block-servers ({args.block_servers})")
    if args.l3_nodes < 0 or args.l3_capacity_mb <= 0 or args.l3_hold_seconds < 0:
        parser.error("--l3-nodes and --l3-hold-seconds must be >= 0, --l3-capacity-mb positive")
    if args.trackers < 0:
        parser.error("--trackers must be >= 0")
    emulation = (args.latency_ms, args.bandwidth_mbps, args.spindles)
    if not all(value is None or value >= 0 for value in emulation):  # nan too: it is not >= 0
        parser.error("--latency-ms, --bandwidth-mbps and --spindles must be >= 0")
    if not args.startup_timeout > 0:
        parser.error("--startup-timeout must be > 0 (seconds)")
    names = (
        "block_servers",
        "write_quorum",
        "latency_ms",
        "bandwidth_mbps",
        "spindles",
        "token",
        "keys",
        "l3_nodes",
        "l3_capacity_mb",
        "l3_hold_seconds",
        "trackers",
        "startup_timeout",
        "admin_token",
        "api_servers",
    )
    faults = {kind.name: tuple(specs) for kind in KINDS if (specs := getattr(args, f"{kind.name}_faults"))}
    if args.keys is not None and not args.keys.is_file():
        parser.error(f"--keys {args.keys}: no such file (make one with 'blobsdk token keygen FILE')")
    try:
        if args.source is not None:
            s3_location(args.source)
    except ValueError as exc:
        parser.error(f"--source: {exc}")
    if args.metadata is not None and args.metadata != OWN_REDIS:
        try:
            check_redis_url(args.metadata, "--metadata")
        except ValueError as exc:
            parser.error(f"{exc}; or redis: a Redis the cluster starts")
    if args.api_servers < 1:
        parser.error("--api-servers must be at least 1")
    if args.api_servers > 1 and args.metadata is None:
        parser.error(METADATA_FOR_SEVERAL)
    if args.seaweedfs and (args.source is not None or args.s3_endpoint is not None):
        parser.error("--seaweedfs and --source (or --s3-endpoint) both name L4: give one")
    links = links_of_args(parser, args)
    s3 = msgspec.structs.replace(s3_config_of_args(args), **_aws_credentials())
    options = ClusterOptions(
        **{n: getattr(args, n) for n in names},
        faults=faults,
        metadata=args.metadata,
        source=args.source,
        s3=s3,
        seaweedfs=args.seaweedfs,
        hosts=args.hosts,
        links=links,
    )
    table = [*launch_table(options), *service_hosts(options)]
    check_links(parser, options, table, [*(kind.name for kind in KINDS), *(kind for _, kind in service_hosts(options))])
    return args.dir, with_service_token(options), not args.no_restart


def _aws_credentials() -> dict[str, str]:
    """The AWS credentials of this environment, for client.toml's [s3] (the servers get them
    through theirs)."""
    keys = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY"}
    return {field: os.environ[var] for field, var in keys.items() if os.environ.get(var)}
