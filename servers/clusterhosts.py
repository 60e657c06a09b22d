"""A local cluster on hosts (``ClusterOptions(hosts=True)``, ``blobsdk-cluster --hosts``): each
server in a testbed host of its own (servers/testbed.py), named as the server (``api``,
``block-0``, ``l3-1``, ``tracker``), binding that host's address with a link of the rate
``ClusterOptions.links`` gives its name or else its kind (default unshaped); and client hosts,
each with its own directory, L2 cache and client.toml, whose peer server binds the host's
address.

The testbed's state file is the cluster's directory's ``testbed.json``, so ``python -m
servers.testbed partition --dir DIR block-1`` drives a running cluster's links.  Clients in
the root namespace (the process that started the cluster) reach every server through the
testbed's driver address; their peer server binds that address.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from blobsdk.config import ClientConfig, L2Config

from ._common import netns
from .supervisor import ClusterError
from .testbed import parse_link
from .testbed_hosts import Host, Link, NetnsError, Testbed


@dataclass
class ClientHost:
    """A client host of a cluster on hosts: ``config`` (also at ``config_path``) is the
    cluster's client config with this host's L2 directory and a peer server on its address."""

    host: Host
    dir: Path
    config: ClientConfig
    testbed: Testbed

    @property
    def config_path(self) -> Path:
        return self.dir / "client.toml"

    @property
    def address(self) -> str:
        return self.host.address

    def popen(self, argv: Sequence[str], **kw: Any) -> Any:
        """Run ``argv`` in this host (see :meth:`Testbed.popen`)."""
        return self.testbed.popen(self.host, argv, **kw)


class Placement:
    """Where a cluster's servers run: ``testbed``'s hosts, one per server."""

    def __init__(self, dir: Path, links: Mapping[str, Link]) -> None:
        self.testbed = Testbed(dir=dir)
        self.links = dict(links)

    def start(self) -> None:
        try:
            self.testbed.start()
        except NetnsError as exc:
            raise ClusterError(f"the servers cannot run on hosts: {exc}") from None

    def host_of(self, name: str, kind: str) -> Host:
        """Server ``name``'s host, made the first time (a restart keeps it)."""
        if name in self.testbed.hosts:
            return self.testbed.hosts[name]
        return self.testbed.add_host(name, self.links.get(name, self.links.get(kind, Link())))

    def argv(self, host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` run in ``host``'s namespace (the process keeps the Popen's pid)."""
        return [netns.IP, "netns", "exec", host.namespace, *argv]

    def root_config(self, config: ClientConfig) -> ClientConfig:
        """The cluster's client config for clients in the root namespace."""
        return _on(config, self.testbed.driver_address, str(self.testbed.network))

    def client_host(self, cluster_dir: Path, config: ClientConfig, name: str, link: Link | None) -> ClientHost:
        """A new client host ``name`` with its directory ``cluster_dir/clients/NAME`` (its L2
        cache in ``l2``, its ``client.toml``)."""
        host = self.testbed.add_host(name, link)
        dir = cluster_dir / "clients" / name
        (dir / "l2").mkdir(parents=True, exist_ok=True)
        own = msgspec.structs.replace(_on(config, host.address, str(self.testbed.network)), l2=L2Config(dir=str(dir / "l2")))
        client = ClientHost(host=host, dir=dir, config=own, testbed=self.testbed)
        tmp = dir / ".client.toml.tmp"
        tmp.write_text(own.to_toml())
        os.replace(tmp, client.config_path)
        return client

    def stop(self) -> None:
        self.testbed.stop()


def _on(config: ClientConfig, address: str, network: str) -> ClientConfig:
    """``config`` with its peer server on ``address`` and peers taken in ``network`` (the
    testbed's /24 is not among the default private networks)."""
    networks = (*[n for n in config.peer.allowed_networks if n != network], network)
    peer = msgspec.structs.replace(config.peer, host=address, allowed_networks=networks)
    return msgspec.structs.replace(config, peer=peer)


# --- blobsdk-cluster's --hosts and --link -----------------------------------------------


def add_hosts_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", action="store_true", help="each server in a testbed host of its own (needs root)")
    parser.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="NAME=UP:DOWN",
        help="with --hosts: the link of a server (block-1) or a kind (block), Mbit/s; empty: unshaped (repeatable)",
    )


def links_of_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Link]:
    """The ``--link`` specs by server or kind name (argparse's error for a bad one)."""
    if args.link and not args.hosts:
        parser.error("--link needs --hosts")
    links = {}
    for spec in args.link:
        try:
            name, link = parse_link(spec)
        except ValueError as exc:
            parser.error(f"--link {exc}")
        links[name] = link
    return links


def check_links(parser: argparse.ArgumentParser, options: Any, table: Sequence[tuple[str, str]], kinds: Iterable[str]) -> None:
    """argparse's error if a ``--link`` names neither a server of ``table`` nor a kind."""
    servers = [name for name, _ in table]
    if unknown := sorted(set(options.links) - set(kinds) - set(servers)):
        parser.error(f"--link {unknown[0]}: no such server or kind (servers: {', '.join(servers)})")
