"""What a local cluster (servers/cluster.py) starts: its options, its kinds of server and the
flags each instance gets, the launch table, what client.toml says, and what the environment
must have for the options (checked before anything is made in the cluster's directory).

A kind of server is one :class:`ServerKind` entry in :data:`KINDS`; kinds start in order,
so a later kind's arguments may name the URLs of earlier ones.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blobsdk.config import ClientConfig, S3Config, WriteConfig

from . import seaweedd
from ._common import install_hint
from ._common.stores import s3_args_of
from .testbed_hosts import Link


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """A cluster's settings; the defaults are the command's (``blobsdk-cluster --dir DIR``)."""

    block_servers: int = 3
    write_quorum: int | None = None  # None: a majority of the block replicas must acknowledge a write
    latency_ms: float | None = None  # HDD emulation on the block servers; None: their default
    bandwidth_mbps: float | None = None
    spindles: int | None = None
    token: str | None = None  # a static admin token every server takes (written to client.toml)
    keys: Path | None = None  # a keyring every server takes: tenants with signed tokens
    l3_nodes: int = 2  # L3 flash nodes, each reading through every block server
    l3_capacity_mb: float = 1024
    l3_hold_seconds: float = 0.0
    trackers: int = 1  # peer-tier trackers (servers.tracker); their URLs go in tracker_urls; 0: no peer tier
    startup_timeout: float = 30.0
    # kind name ("api", "block", "l3", "tracker") -> its servers' --fault specs (servers/_common/faults.py)
    faults: Mapping[str, Sequence[str]] = field(default_factory=dict)
    admin_token: str | None = None  # every server mounts /admin/faults behind it
    # redis://HOST:PORT/DB: the API servers keep the metadata there (default SQLite); "redis": in
    # a Redis (AOF, fsync always) and its replica (--replicaof) the cluster starts in DIR/redis*
    metadata: str | None = None
    api_servers: int = 1  # more than one: over Redis (metadata), listed in client.toml's api_urls
    source: str | None = None  # s3://BUCKET/PREFIX: L4 is that object store (no block servers)
    s3: S3Config = field(default_factory=S3Config)  # for source; its credentials reach the servers as AWS_* variables
    seaweedfs: bool = False  # L4 on a local SeaweedFS the cluster starts (its source and s3 replace those above)
    hosts: bool = False  # each server in a testbed host of its own (servers/clusterhosts.py; needs root)
    # with hosts: server name ("block-1") or kind name ("block") -> its host's link (default unshaped)
    links: Mapping[str, Link] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api_servers < 1:
            raise ValueError(f"api_servers must be at least 1, got {self.api_servers}")
        if self.api_servers > 1 and self.metadata is None:
            raise ValueError(METADATA_FOR_SEVERAL)


METADATA_FOR_SEVERAL = (
    "several API servers share their store only in Redis: give --metadata redis://HOST:PORT/DB, "
    "or --metadata redis (a Redis, its replica and the Sentinels that fail it over, started by the cluster)"
)
OWN_REDIS = "redis"  # --metadata redis: the cluster starts a Redis, its replica and 3 Sentinels
# With hosts, the third-party servers' own hosts (name, kind): see service_hosts.
REDIS_HOSTS = (("redis", "redis"), ("redis-replica", "redis"), ("redis-sentinel", "redis"))
SEAWEEDFS_HOST = ("seaweedfs", "seaweedfs")


def service_hosts(options: ClusterOptions) -> list[tuple[str, str]]:
    """(name, kind) of the third-party servers a cluster of ``options`` starts: with
    ``hosts``, each runs in a testbed host of that name (``--link`` may name it or its kind)."""
    return [*([SEAWEEDFS_HOST] if options.seaweedfs else []), *(REDIS_HOSTS if options.metadata == OWN_REDIS else [])]


@dataclass(frozen=True)
class Launch:
    """What a kind's argument builder may look at: the cluster directory, the options, and
    the URLs of the kinds started before it."""

    dir: Path
    options: ClusterOptions
    urls: dict[str, list[str]]


@dataclass(frozen=True, kw_only=True)
class ServerKind:
    name: str  # instances are "<name>" when there is one, else "<name>-<i>"
    module: str  # run as `python -m module`
    count: Callable[[ClusterOptions], int]
    args: Callable[[Launch, int], list[str]]  # instance i's own flags (data dir, ...)
    to_config: Callable[[list[str]], dict[str, Any]]  # where its URLs go in ClientConfig


def _block_args(launch: Launch, i: int) -> list[str]:
    o = launch.options
    flags = [("--latency-ms", o.latency_ms), ("--bandwidth-mbps", o.bandwidth_mbps), ("--spindles", o.spindles)]
    return ["--dir", str(launch.dir / f"blocks-{i}"), *[a for k, v in flags if v is not None for a in (k, str(v))]]


def _api_args(launch: Launch) -> list[str]:
    metadata = launch.options.metadata
    return ["--metadata", metadata] if metadata else ["--db", str(launch.dir / "meta.sqlite")]


def _flash_args(launch: Launch, i: int) -> list[str]:
    o = launch.options
    if o.source is not None:
        blocks = ["--source", o.source, *s3_args_of(o.s3)]
    else:
        blocks = [a for url in launch.urls["block"] for a in ("--block-url", url)]
    sizes = ["--capacity-mb", str(o.l3_capacity_mb), "--hold-seconds", str(o.l3_hold_seconds)]
    return ["--dir", str(launch.dir / f"l3-{i}"), *blocks, *sizes]


KINDS: tuple[ServerKind, ...] = (
    ServerKind(
        name="api",
        module=f"{__package__}.api",
        count=lambda o: o.api_servers,
        args=lambda launch, i: _api_args(launch),
        to_config=lambda urls: {"api_url": urls[0]} if len(urls) == 1 else {"api_urls": tuple(urls)},
    ),
    ServerKind(
        name="block",
        module=f"{__package__}.blockstore",
        count=lambda o: 0 if o.source is not None else o.block_servers,
        args=_block_args,
        to_config=lambda urls: {"block_urls": tuple(urls)} if urls else {},
    ),
    ServerKind(
        name="l3",
        module=f"{__package__}.flash",
        count=lambda o: o.l3_nodes,
        args=_flash_args,
        to_config=lambda urls: {"l3_urls": tuple(urls)},
    ),
    ServerKind(
        name="tracker",
        module=f"{__package__}.tracker",
        count=lambda o: o.trackers,
        args=lambda launch, i: [],
        to_config=lambda urls: {"tracker_urls": tuple(urls)},
    ),
)


def launch_table(options: ClusterOptions, kinds: Sequence[ServerKind] = KINDS) -> list[tuple[str, str]]:
    """(name, module) of every server a cluster of ``options`` starts, in the order it starts
    them (SeaweedFS, with ``seaweedfs``, starts before them all)."""
    return [(server_name(kind, i, options), kind.module) for kind in kinds for i in range(kind.count(options))]


def server_name(kind: ServerKind, i: int, options: ClusterOptions) -> str:
    return kind.name if kind.count(options) == 1 else f"{kind.name}-{i}"


def common_args(options: ClusterOptions, kind: ServerKind) -> list[str]:
    """Flags every server of ``kind`` gets: tokens, keyring and fault specs."""
    keys = None if options.keys is None else str(Path(options.keys).resolve())
    flags = [("--token", options.token), ("--keys", keys), ("--admin-token", options.admin_token)]
    flags += [("--fault", spec) for spec in options.faults.get(kind.name, ())]
    # "--flag=value": a value may begin with "-" (a random token does one time in 64).
    return [f"{k}={v}" for k, v in flags if v]


def with_service_token(options: ClusterOptions) -> ClusterOptions:
    """With a keyring but no static token, the servers still need an admin token among
    themselves (an L3 node reads through the block servers): a random one, which
    client.toml gets too (tenants use tokens made by ``blobsdk token create``)."""
    if options.keys is None or options.token is not None:
        return options
    return dataclasses.replace(options, token=secrets.token_urlsafe(24))


def client_config(kinds: Sequence[ServerKind], urls: dict[str, list[str]], options: ClusterOptions) -> ClientConfig:
    raw: dict[str, Any] = {}
    for kind in kinds:
        raw.update(kind.to_config(urls[kind.name]))
    if options.source is not None:
        raw.update(source_url=options.source, s3=options.s3)
    return ClientConfig(**raw, token=options.token, write=WriteConfig(write_quorum=options.write_quorum))


def lacking(options: ClusterOptions) -> str | None:
    """What this environment lacks for ``options``, in one line, or None: checked before the
    cluster makes anything in its directory."""
    needs: list[tuple[str, str, list[str]]] = []
    if options.seaweedfs:
        needs.append(("--seaweedfs", "seaweedfs", [*seaweedd.missing(), *_absent("obstore")]))
    if options.source is not None:
        needs.append(("--source", "s3", _absent("obstore")))
    if options.metadata is not None:
        needs.append(("--metadata", "redis", _absent("redis")))
    for flag, extra, packages in needs:
        if packages:
            listed = ", ".join(packages[:-1]) + (" and " if len(packages) > 1 else "") + packages[-1]
            return f"{flag} needs {listed}, not installed here: {install_hint(extra)}"
    return None


def _absent(module: str) -> list[str]:
    return [] if importlib.util.find_spec(module) is not None else [module]
