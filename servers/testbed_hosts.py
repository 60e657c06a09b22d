"""A testbed of hosts on one machine: each host a network namespace of its own, with one
address and one link of a given rate per direction to a bridge; and faults at those links.

    with Testbed() as bed:
        a = bed.add_host("a", Link(up=1000, down=1000))
        b = bed.add_host("b", Link(up=100))
        server = bed.popen(a, [sys.executable, "-m", "http.server", "--bind", a.address, "8000"])
        bed.partition(b, "out")      # b's packets are dropped; heal(b) restores its link
        with bed.flap(a, down_s=0.5, up_s=1.0): ...

Every testbed claims one /24 of 198.18.0.0/15 (servers/_common/tbclaim.py) so several
coexist on one machine; its hosts are ``.1`` up, the root namespace is ``.254`` on the bridge
(the *driver* address: the process that made the testbed reaches every host, the hosts reach
each other, and no route leads out of a namespace).  Needs root (CAP_NET_ADMIN) and
iproute2; :func:`unavailable` says why not.  Stopping removes the hosts' processes, the
namespaces, veths, bridge and claim; a guard process does the same if the creator dies.

Links are shaped with tbf: ``up`` (host -> bridge) on the namespace-side veth's egress,
``down`` (bridge -> host) on the bridge-side veth's egress.  Import it from servers/testbed.py
(which is also its command line: ``python -m servers.testbed``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

from ._common import netns
from ._common.netns import NetnsError, unavailable
from ._common.tbclaim import RANGE, Claim, claim, network, sweep_stale

__all__ = ["Direction", "Flap", "Host", "Link", "NetnsError", "Testbed", "unavailable"]

Direction = Literal["both", "in", "out"]
DIRECTIONS: tuple[Direction, ...] = ("both", "in", "out")
STATE_FILE = "testbed.json"
DRIVER_HOST = 254  # the root namespace's address on the bridge: .254
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Link:
    """A host's link to the bridge: rates in Mbit/s, ``up`` host -> bridge, ``down`` bridge ->
    host (None: unshaped, as fast as the CPU moves packets); ``queue_ms``: how long a packet may
    wait in the tbf queue before it is dropped."""

    up: float | None = None
    down: float | None = None
    queue_ms: float = 50.0

    def __post_init__(self) -> None:
        for name in ("up", "down"):
            rate = getattr(self, name)
            if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)):
                raise TypeError(f"Link.{name} must be a number of Mbit/s or None, got {type(rate).__name__}")
            if rate is not None and not rate > 0:
                raise ValueError(f"Link.{name} must be a positive rate in Mbit/s or None, got {rate!r}")
        if not self.queue_ms > 0:
            raise ValueError(f"Link.queue_ms must be positive, got {self.queue_ms!r}")


@dataclass
class Host:
    """One host: its namespace, address, veth pair (``inner`` in the namespace, ``outer`` on
    the bridge), its link, and which directions are partitioned (None: none)."""

    name: str
    namespace: str
    address: str
    inner: str
    outer: str
    link: Link
    partitioned: Direction | None = None

    def url(self, port: int) -> str:
        return f"http://{self.address}:{port}"


class Flap:
    """A host's link going down (both directions) for ``down_s``, up for ``up_s``, again and
    again from the moment it is made, until :meth:`stop` (or the end of its ``with``) heals it.
    ``cycles`` counts the downs so far."""

    def __init__(self, bed: Testbed, host: Host, down_s: float, up_s: float) -> None:
        if not (down_s > 0 and up_s > 0):
            raise ValueError(f"flap needs positive down_s and up_s, got {down_s!r} and {up_s!r}")
        self.host, self.down_s, self.up_s, self.cycles = host, down_s, up_s, 0
        self._bed, self._stop = bed, threading.Event()
        self._error: NetnsError | KeyError | None = None
        self._thread = threading.Thread(target=self._run, name=f"flap-{host.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._bed.partition(self.host, "both")
                self.cycles += 1
                if self._stop.wait(self.down_s):
                    break
                self._bed.heal(self.host)
                self._stop.wait(self.up_s)
        except (NetnsError, KeyError) as exc:  # reported by stop()
            self._error = exc

    def halt(self) -> None:
        """Stop flapping, leaving the link as it is."""
        self._stop.set()
        self._thread.join()

    def stop(self) -> None:
        """Stop flapping and leave the link up (healed); raises what went wrong meanwhile."""
        self.halt()
        if self._error is None:
            self._bed.heal(self.host)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> Flap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Testbed:
    """Hosts in network namespaces on one bridge.  ``with Testbed() as bed`` (or ``async
    with``, or :meth:`start`/:meth:`stop`).  ``dir``: where :meth:`start` writes
    ``testbed.json`` (what ``python -m servers.testbed`` reads); None: nowhere."""

    __test__: ClassVar[bool] = False  # not a test class, for pytest, in the tests that import it

    dir: Path | None = None
    hosts: dict[str, Host] = field(default_factory=dict)
    subnet: int | None = None
    _claim: Claim | None = field(default=None, repr=False)
    _processes: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)
    _flaps: list[Flap] = field(default_factory=list, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The testbed's /24 (for ``PeerConfig.allowed_networks``)."""
        return network(self._subnet())

    @property
    def driver_address(self) -> str:
        """The root namespace's address on the bridge."""
        return str(self.network[DRIVER_HOST])

    @property
    def bridge(self) -> str:
        return netns.bridge_name(self._subnet())

    def _subnet(self) -> int:
        if self.subnet is None:
            raise RuntimeError("the testbed is not started")
        return self.subnet

    def start(self) -> Testbed:
        """Sweep stale testbeds, claim a subnet, start the guard, make the bridge."""
        if (why := unavailable()) is not None:
            raise NetnsError(why)
        sweep_stale()
        self._claim = claim()
        self.subnet = self._claim.subnet
        try:
            self._claim.start_guard(_ROOT)
            netns.make_bridge(self.bridge, self.driver_address)
            self._write_state()
        except BaseException:
            self.stop()
            raise
        return self

    def add_host(self, name: str, link: Link | None = None) -> Host:
        """A new host ``name`` (lowercase letters, digits, '-'; up to 32) with ``link``
        (default: unshaped), at the next free address of the testbed's /24."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"host name must be 1-32 of a-z, 0-9 and '-' (not first), got {name!r}")
        link = Link() if link is None else link
        if not isinstance(link, Link):
            raise TypeError(f"link must be a Link, got {type(link).__name__}")
        with self._lock:
            subnet = self._subnet()
            if name in self.hosts:
                raise ValueError(f"host {name!r} exists already")
            index = len(self.hosts) + 1
            if index >= DRIVER_HOST:
                raise ValueError(f"a testbed holds at most {DRIVER_HOST - 1} hosts")
            inner, outer = netns.veth_names(subnet, index)
            address = str(self.network[index])
            host = Host(name, netns.namespace_prefix(subnet) + name, check_address(address), inner, outer, link)
            netns.make_host(host.namespace, inner, outer, self.bridge, address)
            self.hosts[name] = host
            self._apply(host)
            self._write_state()
            return host

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in this testbed (hosts: {', '.join(self.hosts) or 'none'})") from None

    def popen(self, host: Host | str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``'s namespace (``ip netns exec``: the process is the
        Popen's pid; its children stay in the namespace).  ``kw`` goes to Popen.  Stopped
        with the testbed, which reaps it and closes its pipes."""
        h = self._host(host)
        proc: subprocess.Popen[Any] = subprocess.Popen([netns.IP, "netns", "exec", h.namespace, *argv], **kw)
        with self._lock:
            self._processes.append(proc)
        return proc

    def set_link(self, host: Host | str, up: float | None = None, down: float | None = None) -> Host:
        """Give ``host``'s live link these rates (None: unshaped); on a partitioned host, they
        take effect when it heals."""
        h = self._host(host)
        with self._lock:
            h.link = replace(h.link, up=up, down=down)
            if h.partitioned is None:
                self._apply(h)
            self._write_state()
        return h

    def partition(self, host: Host | str, direction: Direction = "both") -> Host:
        """Drop every packet ``host`` sends (``out``), is sent (``in``), or both, at its link;
        connections time out rather than being refused.  Replaces an earlier partition."""
        h = self._host(host)
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        with self._lock:
            self._apply(h)  # heals the direction a narrower partition leaves open
            if direction in ("both", "out"):
                netns.blackhole(h.inner, h.namespace)
            if direction in ("both", "in"):
                netns.blackhole(h.outer)
            h.partitioned = direction
            self._write_state()
        return h

    def heal(self, host: Host | str) -> Host:
        """End ``host``'s partition: its link is back, shaped as set."""
        h = self._host(host)
        with self._lock:
            self._apply(h)
            h.partitioned = None
            self._write_state()
        return h

    def flap(self, host: Host | str, down_s: float, up_s: float) -> Flap:
        """Start flapping ``host``'s link (see :class:`Flap`); stop it with ``stop()`` or ``with``
        (stopping the testbed stops it too)."""
        flap = Flap(self, self._host(host), down_s, up_s)
        self._flaps.append(flap)
        return flap

    def qdiscs(self, host: Host | str) -> tuple[str, str]:
        """``tc qdisc show`` of ``host``'s (up, down) sides."""
        h = self._host(host)
        return netns.qdiscs(h.inner, h.namespace), netns.qdiscs(h.outer)

    def _apply(self, h: Host) -> None:
        netns.shape(h.inner, h.link.up, h.link.queue_ms, h.namespace)
        netns.shape(h.outer, h.link.down, h.link.queue_ms)

    def _host(self, host: Host | str) -> Host:
        if isinstance(host, Host):
            host = host.name
        if not isinstance(host, str):
            raise TypeError(f"host must be a Host or a host name, got {type(host).__name__}")
        return self.host(host)

    def stop(self) -> None:
        """Remove everything: the hosts' processes (SIGTERM, then SIGKILL), namespaces, veths,
        bridge, the state file and the claim."""
        for flap in self._flaps:
            flap.halt()
        self._flaps.clear()
        with self._lock:
            if self.subnet is not None and self._claim is not None:
                netns.sweep(self.subnet)
            for proc in self._processes:
                if proc.poll() is None:
                    proc.kill()  # not in a namespace of ours any more (it left by setns)
                proc.wait()
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
            self._processes.clear()
            claim, self._claim = self._claim, None
            if claim is not None:
                claim.release()
            if self.dir is not None:
                (self.dir / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Testbed:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)

    # --- the state file: what the command line reads to drive a running testbed ---------

    def _write_state(self) -> None:
        if self.dir is None:
            return
        state = {"subnet": self.subnet, "creator": os.getpid(), "hosts": [asdict(h) for h in self.hosts.values()]}
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.dir / STATE_FILE)

    @classmethod
    def attach(cls, dir: Path) -> Testbed:
        """The running testbed whose state is ``dir/testbed.json``, to drive its links (its
        owner stops it).  The file is checked: ValueError says what is wrong with it."""
        path = Path(dir) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no testbed runs in {dir} (no {STATE_FILE})") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a testbed state file: {exc}") from None
        try:
            subnet = int(state["subnet"])
            network(subnet)
            hosts = [_checked_host(h, subnet) for h in state["hosts"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a testbed state file: {exc}") from None
        return cls(dir=Path(dir), hosts={h.name: h for h in hosts}, subnet=subnet)


def check_address(address: str) -> str:
    """``address`` if it is in 198.18.0.0/15; ValueError otherwise."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"not an IP address: {address!r}") from None
    if ip not in RANGE:
        raise ValueError(f"testbed addresses must be in {RANGE} (reserved for such tests), got {address}")
    return address


def _checked_host(raw: dict[str, Any], subnet: int) -> Host:
    link = raw["link"]
    host = Host(
        name=str(raw["name"]),
        namespace=str(raw["namespace"]),
        address=check_address(str(raw["address"])),
        inner=str(raw["inner"]),
        outer=str(raw["outer"]),
        link=Link(up=link["up"], down=link["down"], queue_ms=link["queue_ms"]),
        partitioned=raw.get("partitioned"),
    )
    if not _NAME.fullmatch(host.name) or host.namespace != netns.namespace_prefix(subnet) + host.name:
        raise ValueError(f"host {host.name!r}: bad name or namespace {host.namespace!r}")
    if ipaddress.ip_address(host.address) not in network(subnet):
        raise ValueError(f"host {host.name!r}: address {host.address} is not in {network(subnet)}")
    index = int(ipaddress.ip_address(host.address)) - int(network(subnet).network_address)
    if (host.inner, host.outer) != netns.veth_names(subnet, index):
        raise ValueError(f"host {host.name!r}: veths {host.inner}/{host.outer} are not the testbed's")
    if host.partitioned not in (None, *DIRECTIONS):
        raise ValueError(f"host {host.name!r}: partitioned must be one of {DIRECTIONS} or null")
    return host
