"""Where a server's stores are, from its flags: ``--metadata`` (a SQLite file, or a Redis URL)
for the API server, ``--source`` (an ``s3://`` location, with the ``--s3-*`` flags) for an
L3 node or a cluster whose L4 is an object store.  Credentials for S3 come from the standard
AWS environment and files, never from flags (they would show in ``ps``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from blobsdk.config import S3Config

if TYPE_CHECKING:
    from blobsdk.metadata import RedisMetadataStore, SqliteMetadataStore


def metadata_store_of(location: str) -> RedisMetadataStore | SqliteMetadataStore:
    """A Redis store for a URL (``redis://``, ``rediss://``, ``redis+sentinel://``: ValueError
    for another scheme), else SQLite in that file."""
    if "://" in location:
        from blobsdk.metadata import RedisMetadataStore

        return RedisMetadataStore(location)
    from blobsdk.metadata import SqliteMetadataStore

    return SqliteMetadataStore(location)


def add_s3_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3-endpoint", default=None, metavar="URL", help="S3 API endpoint (MinIO, Ceph RGW; default AWS)")
    parser.add_argument("--s3-region", default=None, metavar="R", help="S3 region")
    parser.add_argument("--s3-allow-http", action="store_true", help="the S3 endpoint is plain http")


def s3_config_of_args(args: argparse.Namespace) -> S3Config:
    return S3Config(endpoint=args.s3_endpoint, region=args.s3_region, allow_http=args.s3_allow_http)


def s3_args_of(config: S3Config) -> list[str]:
    """The ``--s3-*`` flags that give another server ``config`` (its credentials excepted)."""
    args = []
    if config.endpoint:
        args += ["--s3-endpoint", config.endpoint]
    if config.region:
        args += ["--s3-region", config.region]
    if config.allow_http:
        args.append("--s3-allow-http")
    return args
