"""Frozen, keyword-only configuration structs: every table of ``client.toml``.

Environment variables are read in exactly one place, :meth:`ClientConfig.from_env`.

The ground floor: the structs of the modules with behaviour (the hedger, the limiter,
repair) live here and those modules import them, never the other way round.  This module
imports only leaves (``_settings``, ``_numbers``, ``_arguments``, ``_redisurl``, ``errors``, ``wire``);
tests/project/test_imports.py holds it to that.

Every struct is a :class:`~blobsdk._settings.Settings`: each field's kind, each number's range
and the rules across fields are checked when it is built, in Python or from ``client.toml``,
with the same message either way (blobsdk/_settings.py).
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from typing import ClassVar, Literal

import msgspec

from ._numbers import Number, integer, non_negative, positive, real
from ._redisurl import check_redis_url as check_redis_url  # servers check --metadata with it
from ._settings import Settings, from_table
from .wire import MAX_CHUNK_BYTES

MiB = 1 << 20

Compression = Literal["auto", "lz4", "none"]


class L1Config(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Host-memory chunk cache."""

    table: ClassVar[str] = "l1"
    numbers: ClassVar[dict[str, Number]] = {"capacity_bytes": integer(0), "ttl_seconds": positive(optional=True)}

    capacity_bytes: int = 1 << 30  # 0 disables L1
    ttl_seconds: float | None = None


class L2Config(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Local-flash chunk cache (a directory this client may share with others)."""

    table: ClassVar[str] = "l2"
    numbers: ClassVar[dict[str, Number]] = {
        "capacity_bytes": integer(0),
        "min_free_ratio": real(0, 1, high_open=True),
        "ttl_seconds": positive(optional=True),
    }

    dir: str
    capacity_bytes: int = 10 << 30
    min_free_ratio: float = 0.05  # never fill the file system beyond 1 - this
    ttl_seconds: float | None = None


class L3Config(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the client uses the L3 flash nodes named by ``l3_urls``."""

    table: ClassVar[str] = "l3"
    numbers: ClassVar[dict[str, Number]] = {"replicas": integer(1), "down_seconds": non_negative()}

    replicas: int = 2  # nodes per chunk, chosen by rendezvous hashing
    down_seconds: float = 5.0  # a node that failed is skipped this long


PRIVATE_NETWORKS = ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")


class PeerConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The peer tier (with ``tracker_urls``): this client's peer server, and whom it fetches from."""

    table: ClassVar[str] = "peer"
    numbers: ClassVar[dict[str, Number]] = {
        "port": integer(0, 65535),
        "budget_bytes": integer(0),
        "max_uploads": integer(1),
        **dict.fromkeys(("timeout_s", "wait_s", "tracker_timeout_s"), positive()),
        "fetch_budget_s": positive(optional=True),
    }

    host: str = "127.0.0.1"  # where the peer server listens
    port: int = 0  # 0: a free port
    advertise: str | None = None  # the address the trackers hand out (default: http://HOST:PORT as bound)
    budget_bytes: int = 256 * MiB  # serving memory: the chunks it offers to other peers
    max_uploads: int = 8  # concurrent uploads; past it a child is refused at once (429) and moves on
    allowed_networks: tuple[str, ...] = PRIVATE_NETWORKS  # peers are contacted only at IP addresses in these
    timeout_s: float = 5.0  # bounds connecting to a peer, each silence (no byte, no 102), each upload piece
    # How long a child waits at a peer for a chunk that peer is still fetching (hearing 102
    # Processing meanwhile): above the time that peer's uplink needs for the children queued
    # at it (8 hosts x 16 chunks at 200 Mbit/s: ~20 s).
    wait_s: float = 30.0
    tracker_timeout_s: float = 1.0  # a tracker call longer than this is skipped (the read goes on to L3/L4)
    # The most one chunk's read spends on peers, however many sources stall: then L3/L4.
    fetch_budget_s: float | None = None  # None: wait_s + 1

    def check(self) -> None:
        if self.host in ("0.0.0.0", "::") and self.advertise is None:
            raise ValueError(f"[peer] host {self.host!r} listens everywhere: set advertise to the address peers should use")
        networks(self.allowed_networks)


def networks(specs: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The parsed ``allowed_networks``; ValueError naming a bad one."""
    try:
        return tuple(ipaddress.ip_network(spec) for spec in specs)
    except ValueError as exc:
        raise ValueError(f"[peer] allowed_networks: {exc}") from None


class S3Config(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The object store that ``source_url = "s3://bucket/prefix"`` names (``[s3]``).  Absent
    credentials come from the standard AWS chain: environment, ``~/.aws`` files, instance role."""

    table: ClassVar[str] = "s3"

    endpoint: str | None = None  # MinIO, Ceph RGW, moto...; None: AWS
    region: str | None = None
    allow_http: bool = False  # an endpoint without TLS
    access_key_id: str | None = None
    secret_access_key: str | None = None

    def options(self) -> dict[str, str]:
        """obstore's S3 options for what is set."""
        names = ("endpoint", "region", "access_key_id", "secret_access_key")
        return {name: str(getattr(self, name)) for name in names if getattr(self, name) is not None}


_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # what S3, GCS and Ceph accept, with legacy names


def s3_location(url: str) -> tuple[str, str]:
    """(bucket, prefix) of an ``s3://bucket/prefix`` URL; ValueError for anything else: a
    bucket name S3 would refuse, or a prefix with an empty, "." or ".." segment."""
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if scheme != "s3" or not bucket:
        raise ValueError(f"an S3 location is s3://BUCKET[/PREFIX], got {url!r}")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"{url!r}: {bucket!r} is no bucket name (letters, digits, '.', '_' and '-')")
    prefix = prefix.strip("/")
    if prefix and any(segment in ("", ".", "..") for segment in prefix.split("/")):
        raise ValueError(f"{url!r}: an S3 prefix has no empty, '.' or '..' segment")
    return bucket, prefix


class Timeouts(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Seconds.  ``sock_read`` bounds every wait for the next bytes of a response; ``stall``
    every wait for the next bytes of an L4 read's body once it has begun (block servers and
    S3): a body silent that long fails that try, which S3 retries and replicas fail over."""

    table: ClassVar[str] = "timeouts"
    numbers: ClassVar[dict[str, Number]] = dict.fromkeys(("connect", "sock_read", "total", "stall", "api_failover"), positive())

    connect: float = 5.0
    sock_read: float = 30.0
    total: float = 300.0
    stall: float = 5.0
    api_failover: float = 5.0  # with several api_urls: an API server silent this long is left for the next


# --- tail control and repair: used by blobsdk/tail/hedge.py, blobsdk/net/limiter.py, blobsdk/ops/repair.py

MIN_SAMPLES = 8  # fewer recent latencies than this: a hedger's target borrows the tier-wide estimate


_HEDGE_NUMBERS = {
    "min_delay_ms": non_negative(),
    "max_delay_ms": non_negative(),
    "quantile": real(0, 1, low_open=True),
    "budget_ratio": non_negative(),
    "budget_burst": non_negative(),
    "max_parallel": integer(1),
    "window": integer(MIN_SAMPLES),
    **dict.fromkeys(("hang_factor", "hang_min_ms", "hang_max_ms", "probe_after_s", "probe_max_s"), positive()),
}


class HedgeConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one tier hedges its reads (``enabled = false``: plain failover in rank order; see
    blobsdk/tail/hedge.py)."""

    table: ClassVar[str] = "hedge"
    numbers: ClassVar[dict[str, Number]] = _HEDGE_NUMBERS

    enabled: bool = True
    min_delay_ms: float = 2.0
    max_delay_ms: float = 500.0  # also the delay while nothing has been measured yet
    quantile: float = 0.95
    budget_ratio: float = 0.05  # hedges earned per primary request
    budget_burst: float = 50.0  # token bucket capacity (it starts full): a fan-out's worth of hedges
    max_parallel: int = 2  # attempts in flight per request
    window: int = 128  # recent latencies kept per target
    # A target is hung once an attempt is in service longer than hang_factor x its latency
    # estimate, clamped to [hang_min_ms, hang_max_ms]; probed back after probe_after_s,
    # doubling to probe_max_s (blobsdk/tail/health.py).
    hang_factor: float = 8.0
    hang_min_ms: float = 500.0
    hang_max_ms: float = 1000.0
    probe_after_s: float = 1.0
    probe_max_s: float = 30.0

    def check(self) -> None:
        if not self.min_delay_ms <= self.max_delay_ms:
            raise ValueError(f"need 0 <= min_delay_ms <= max_delay_ms, got {self.min_delay_ms}, {self.max_delay_ms}")
        if not self.hang_min_ms <= self.hang_max_ms:
            got = f"{self.hang_factor}, {self.hang_min_ms}, {self.hang_max_ms}"
            raise ValueError(f"need hang_factor > 0 and 0 < hang_min_ms <= hang_max_ms, got {got}")
        if not self.probe_after_s <= self.probe_max_s:
            raise ValueError(f"need 0 < probe_after_s <= probe_max_s, got {self.probe_after_s}, {self.probe_max_s}")


_LIMITER_NUMBERS = {
    **dict.fromkeys(("initial", "min_limit", "max_limit"), integer(1)),
    "backoff": real(0, 1, low_open=True, high_open=True),
    "tolerance": real(1),
    "smoothing": real(0, 1, low_open=True),
    "min_rtt_window_s": positive(),
}


class LimiterConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one endpoint's in-flight limit adapts (see blobsdk/net/limiter.py)."""

    table: ClassVar[str] = "limiter"
    numbers: ClassVar[dict[str, Number]] = _LIMITER_NUMBERS

    initial: int = 16
    min_limit: int = 1
    max_limit: int = 256
    algorithm: Literal["gradient", "aimd"] = "gradient"
    backoff: float = 0.9  # multiplicative decrease on a drop
    tolerance: float = 2.0  # RTT inflation tolerated over the floor
    smoothing: float = 0.2  # share of the way to its target the gradient moves per round trip
    min_rtt_window_s: float = 10.0  # a floor not seen again for this long is re-probed

    def check(self) -> None:
        if not self.min_limit <= self.initial <= self.max_limit:
            bounds = f"{self.min_limit}, {self.initial}, {self.max_limit}"
            raise ValueError(f"need 1 <= min_limit <= initial <= max_limit, got {bounds}")


class RepairConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds of background repair: ``queue`` blocks waiting at most, ``batch`` blocks per
    lookup of the metadata store's block -> plans index, ``concurrency`` blocks repaired at once; ``demote_seconds`` a replica
    that served bad bytes is ranked after the others; ``retry_seconds`` until an
    under-replicated block is tried again (doubling up to ``retry_max_seconds``); see
    blobsdk/ops/repair.py."""

    table: ClassVar[str] = "repair"
    numbers: ClassVar[dict[str, Number]] = {
        **dict.fromkeys(("queue", "batch", "concurrency"), integer(1)),
        "demote_seconds": non_negative(),
        **dict.fromkeys(("retry_seconds", "retry_max_seconds"), positive()),
    }

    queue: int = 64
    batch: int = 16
    concurrency: int = 2
    demote_seconds: float = 60.0
    retry_seconds: float = 5.0
    retry_max_seconds: float = 120.0

    def check(self) -> None:
        if not self.retry_seconds <= self.retry_max_seconds:
            raise ValueError(
                f"[repair] retry_seconds must be at most retry_max_seconds, got {self.retry_seconds} and {self.retry_max_seconds}"
            )


def check_quorum(quorum: object) -> None:
    """``[write] write_quorum``: a number of replicas >= 1, "all", or None (a majority)."""
    if quorum is not None and quorum != "all" and (isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1):
        raise ValueError(f'write.write_quorum must be a number of replicas >= 1, "all", or unset (a majority), got {quorum!r}')


_WRITE_NUMBERS = {
    "chunk_size": integer(1, MAX_CHUNK_BYTES),
    "block_size": integer(1),
    "parallel_blocks": integer(1),
    "max_write_seconds": positive(),
}


class WriteConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    table: ClassVar[str] = "write"
    numbers: ClassVar[dict[str, Number]] = _WRITE_NUMBERS

    chunk_size: int = 4 * MiB
    block_size: int = 64 * MiB  # target size of a packed block
    compression: Compression = "auto"
    write_quorum: int | Literal["all"] | None = None  # block replicas that must acknowledge; None: a majority
    parallel_blocks: int = 4  # blocks written concurrently by one put
    max_write_seconds: float = 600.0  # a put slower than this aborts before committing

    def check(self) -> None:
        check_quorum(self.write_quorum)
        if self.block_size < self.chunk_size:
            raise ValueError(f"block_size {self.block_size} is smaller than chunk_size {self.chunk_size}")


_READ_NUMBERS = {
    "parallel_chunks": integer(1),
    "plan_cache_ttl_seconds": non_negative(),
    "plan_cache_entries": integer(1),
    "shared_plan_cache_ttl_seconds": positive(),
}


class ReadConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    table: ClassVar[str] = "read"
    numbers: ClassVar[dict[str, Number]] = _READ_NUMBERS

    parallel_chunks: int = 16  # chunk reads in flight per get
    plan_cache_ttl_seconds: float = 10.0  # how stale another client's write may look; 0 disables
    plan_cache_entries: int = 100_000
    shared_plan_cache_url: str | None = None  # redis://HOST:PORT/DB: plans shared by clients (blobsdk/metadata/_shared.py)
    shared_plan_cache_ttl_seconds: float = 10.0

    def check(self) -> None:
        url = self.shared_plan_cache_url
        if url is not None:
            check_redis_url(url, "[read] shared_plan_cache_url")


class ClientConfig(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a :class:`blobsdk.Client` needs (``client.toml``).  In cluster mode
    ``api_url`` (one API server) or ``api_urls`` (several, failed over between) and
    ``block_urls`` name the servers; a client whose stores are given another way
    (``Client.local``, ``Client.from_stores``) leaves them out."""

    api_url: str | None = None
    api_urls: tuple[str, ...] = ()  # several API servers over one store: blobsdk/metadata/_http.py fails over
    metadata_url: str | None = None  # redis://HOST:PORT/DB: the metadata in Redis, talked to directly
    block_urls: tuple[str, ...] = ()
    source_url: str | None = None  # s3://BUCKET/PREFIX: L4 in an object store (see [s3])
    l3_urls: tuple[str, ...] = ()
    tracker_urls: tuple[str, ...] = ()
    token: str | None = None
    l1: L1Config = L1Config()
    l2: L2Config | None = None
    l3: L3Config = L3Config()
    peer: PeerConfig = PeerConfig()
    write: WriteConfig = WriteConfig()
    read: ReadConfig = ReadConfig()
    hedge: HedgeConfig = HedgeConfig()  # per tier: L3 nodes and L4 replicas
    limiter: LimiterConfig = LimiterConfig()  # per endpoint: each L3 node and L4 block server
    timeouts: Timeouts = Timeouts()
    repair: RepairConfig = RepairConfig()  # background repair of bad L4 copies found by reads
    s3: S3Config = S3Config()

    def __post_init__(self) -> None:
        if isinstance(self.api_url, list | tuple):  # the one-server key given several
            raise TypeError(f"api_url must be a str, got {self.api_url!r}: several API servers go in api_urls")
        super().__post_init__()

    @property
    def names_stores(self) -> bool:
        """Whether this config says where its stores are (servers, Redis, S3); if not, a
        client of it needs them given (``Client.local``, ``Client.from_stores``)."""
        return bool(self.api_servers) or self.metadata_url is not None

    @property
    def api_servers(self) -> tuple[str, ...]:
        """The API servers, from ``api_url`` or ``api_urls`` (empty: none)."""
        return self.api_urls or (() if self.api_url is None else (self.api_url,))

    def check(self) -> None:
        for name in ("api_url", "api_urls", "block_urls", "l3_urls", "tracker_urls"):
            check_urls(name, getattr(self, name))
        if self.api_url is not None and self.api_urls:
            raise ValueError("api_url and api_urls both name the API servers: set one (api_urls lists several)")
        if len(set(self.api_urls)) != len(self.api_urls):
            twice = next(url for url in self.api_urls if self.api_urls.count(url) > 1)
            raise ValueError(f"api_urls names {twice!r} twice")
        if self.api_servers and self.metadata_url is not None:
            name = "api_url" if self.api_url is not None else "api_urls"
            raise ValueError(f"{name} and metadata_url both name the metadata: set one")
        if self.block_urls and self.source_url is not None:
            raise ValueError("block_urls and source_url both name L4: set one")
        has_metadata, has_l4 = self.names_stores, self.block_urls or self.source_url
        if has_metadata and not has_l4:
            raise ValueError("block_urls must name at least one L4 block server (or source_url an object store)")
        if has_l4 and not has_metadata:
            raise ValueError("L4 needs its metadata: an api_url (the metadata API server) or a metadata_url (Redis)")
        if self.metadata_url is not None:
            check_redis_url(self.metadata_url, "metadata_url")
        if self.source_url is not None:
            s3_location(self.source_url)
        check_write_config(self.write)
        quorum = self.write.write_quorum
        if isinstance(quorum, int) and self.block_urls and quorum > len(self.block_urls):
            raise ValueError(f"write_quorum {quorum} must be between 1 and the {len(self.block_urls)} block_urls")

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> ClientConfig:
        """Read a ``client.toml``; raises ValueError naming the file when it is not TOML, and
        the bad key on a malformed one."""
        with open(path, "rb") as f:
            try:
                raw = tomllib.load(f)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"{os.fspath(path)!r} is not a valid TOML file: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> ClientConfig:
        """Build from a parsed ``client.toml``: the checks and messages of building it in
        Python, each a ValueError (blobsdk/_settings.py)."""
        return from_table(cls, raw)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientConfig:
        """Build from ``BLOBSDK_CONFIG`` (a toml file), or ``BLOBSDK_API_URL`` (one API
        server, or several comma separated: ``api_urls``) + ``BLOBSDK_BLOCK_URLS`` (comma
        separated) [+ ``BLOBSDK_TOKEN``]."""
        env = os.environ if environ is None else environ
        if env.get("BLOBSDK_CONFIG"):
            return cls.from_toml(env["BLOBSDK_CONFIG"])
        if not env.get("BLOBSDK_API_URL") or not env.get("BLOBSDK_BLOCK_URLS"):
            raise ValueError("set BLOBSDK_CONFIG, or BLOBSDK_API_URL and BLOBSDK_BLOCK_URLS")
        apis = _listed(env["BLOBSDK_API_URL"])
        raw: dict[str, object] = {"api_urls": apis} if len(apis) > 1 else {"api_url": apis[0] if apis else env["BLOBSDK_API_URL"]}
        raw["block_urls"] = _listed(env["BLOBSDK_BLOCK_URLS"])
        if env.get("BLOBSDK_TOKEN"):
            raw["token"] = env["BLOBSDK_TOKEN"]
        return cls.from_dict(raw)

    def to_toml(self) -> str:
        """Render as ``client.toml`` text: the top-level keys, ``[l1]``, and every other
        table whose settings differ from the defaults."""
        keys = [key for key in _TOP_KEYS if getattr(self, key) is not None and (key != "api_urls" or self.api_urls)]
        lines = [f"{key} = {_toml_value(getattr(self, key))}" for key in keys]
        if self.token:
            lines.append(f"token = {_toml_value(self.token)}")
        for table in ("l1", "l2", "l3", "peer", "write", "read", "hedge", "limiter", "timeouts", "repair", "s3"):
            value = getattr(self, table)
            if value is not None and (table == "l1" or value != _DEFAULTS.get(table)):
                lines += ["", f"[{table}]"]
                lines += [f"{k} = {_toml_value(v)}" for k, v in msgspec.structs.asdict(value).items() if v is not None]
        return "\n".join(lines) + "\n"


_TOP_KEYS = ("api_url", "api_urls", "metadata_url", "block_urls", "source_url", "l3_urls", "tracker_urls")
_DEFAULTS: dict[str, object] = {
    "l1": L1Config(),
    "l3": L3Config(),
    "peer": PeerConfig(),
    "write": WriteConfig(),
    "read": ReadConfig(),
    "hedge": HedgeConfig(),
    "limiter": LimiterConfig(),
    "timeouts": Timeouts(),
    "repair": RepairConfig(),
    "s3": S3Config(),
}


def _listed(value: str) -> list[str]:
    """A comma-separated environment value's items."""
    return [item.strip() for item in value.split(",") if item.strip()]


def check_urls(name: str, urls: str | tuple[str, ...] | None) -> None:
    """The servers' URLs (one, or a list): http:// or https://, or a client would fail on
    its first request instead."""
    wanted = "an http:// or https:// URL" if isinstance(urls, str) else "http:// or https:// URLs"
    for url in (urls,) if isinstance(urls, str) else urls or ():
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{name} must be {wanted}, got {url!r}")


def check_write_config(write: WriteConfig) -> None:
    """Raise ValueError for write settings that cannot work."""
    if write.chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {write.chunk_size}")
    if write.block_size < write.chunk_size:
        raise ValueError(f"block_size {write.block_size} is smaller than chunk_size {write.chunk_size}")
    if write.parallel_blocks < 1:
        raise ValueError(f"parallel_blocks must be positive, got {write.parallel_blocks}")
    check_quorum(write.write_quorum)


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(_toml_value, value)) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
