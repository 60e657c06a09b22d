"""Thin wrappers over ``ip`` and ``tc`` (iproute2) for the testbed of hosts (servers/testbed_hosts.py):
network namespaces, veth pairs, a bridge, root qdiscs, and the sweep that removes what a
testbed made.  Each runs the command and raises :class:`NetnsError` naming the command and
its stderr if it fails.  Kept free of heavy imports: the testbed's crash guard imports it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

IP, TC = "ip", "tc"
NAMESPACE_PREFIX = "blobsdk-tb"  # every testbed namespace is "blobsdk-tb<subnet>-<host>"
KILL_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long


class NetnsError(RuntimeError):
    """An ``ip`` or ``tc`` command failed (its message names the command and its stderr)."""


def run(argv: Sequence[str], *, check: bool = True) -> str:
    """Run ``argv``, return its stdout; NetnsError with its stderr if it fails (``check``)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from None
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why this process cannot make network namespaces here, or None if it can."""
    for tool in (IP, TC):
        if shutil.which(tool) is None:
            return f"the testbed needs iproute2's '{tool}', not found on PATH"
    if os.geteuid() != 0:
        return "the testbed needs root (CAP_NET_ADMIN) to make network namespaces"
    name = f"{NAMESPACE_PREFIX}-probe-{os.getpid()}"
    try:
        run([IP, "netns", "add", name])
    except NetnsError as exc:
        return f"network namespaces cannot be made here: {exc}"
    run([IP, "netns", "del", name], check=False)
    return None


def namespace_prefix(subnet: int) -> str:
    return f"{NAMESPACE_PREFIX}{subnet}-"


def bridge_name(subnet: int) -> str:
    return f"bsb{subnet}"


def veth_names(subnet: int, index: int) -> tuple[str, str]:
    """(namespace-side, bridge-side) names of host ``index``'s veth pair (IFNAMSIZ: <= 15)."""
    return f"bs{subnet}h{index}", f"bs{subnet}n{index}"


def namespaces() -> list[str]:
    """Every named network namespace (``ip netns list``)."""
    return [line.split()[0] for line in run([IP, "netns", "list"]).splitlines() if line.strip()]


def links() -> list[str]:
    """Every interface of the root namespace (``ip -o link show``), without its ``@peer``."""
    names = []
    for line in run([IP, "-o", "link", "show"]).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            names.append(parts[1].strip().split("@")[0])
    return names


def make_bridge(name: str, address: str) -> None:
    """A bridge with ``address`` (a /24) in the root namespace: the driver's way to every host."""
    run([IP, "link", "add", name, "type", "bridge"])
    run([IP, "addr", "add", f"{address}/24", "dev", name])
    run([IP, "link", "set", name, "up"])


def make_host(namespace: str, inner: str, outer: str, bridge: str, address: str) -> None:
    """Namespace ``namespace`` with veth ``inner`` (``address``/24, its only route) whose peer
    ``outer`` is a port of ``bridge``."""
    run([IP, "netns", "add", namespace])
    run([IP, "link", "add", inner, "type", "veth", "peer", "name", outer])
    run([IP, "link", "set", inner, "netns", namespace])
    run([IP, "link", "set", outer, "master", bridge])
    run([IP, "link", "set", outer, "up"])
    run([IP, "-n", namespace, "addr", "add", f"{address}/24", "dev", inner])
    run([IP, "-n", namespace, "link", "set", inner, "up"])
    run([IP, "-n", namespace, "link", "set", "lo", "up"])


def _tc(namespace: str | None) -> list[str]:
    return [TC] if namespace is None else [TC, "-n", namespace]


def shape(dev: str, mbit: float | None, queue_ms: float, namespace: str | None = None) -> None:
    """Limit what leaves ``dev`` to ``mbit`` Mbit/s (tbf, ``queue_ms`` of queue), or
    remove any root qdisc (``mbit`` None: unshaped)."""
    if mbit is None:
        if "qdisc noqueue" not in qdiscs(dev, namespace):
            run([*_tc(namespace), "qdisc", "del", "dev", dev, "root"])
        return
    rate_bytes = mbit * 1e6 / 8
    burst = max(int(rate_bytes / 250), 32 * 1024)  # 4 ms at the rate, at least a few jumbo frames
    tbf = ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", f"{queue_ms:g}ms"]
    run([*_tc(namespace), "qdisc", "replace", "dev", dev, "root", *tbf])


def blackhole(dev: str, namespace: str | None = None) -> None:
    """Drop every packet that leaves ``dev`` (a pfifo queue of length 0)."""
    run([*_tc(namespace), "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "0"])


def qdiscs(dev: str, namespace: str | None = None) -> str:
    """``tc qdisc show dev DEV``."""
    return run([*_tc(namespace), "qdisc", "show", "dev", dev])


def namespace_pids(namespace: str) -> list[int]:
    try:
        out = run([IP, "netns", "pids", namespace])
    except NetnsError:
        return []  # the namespace is gone
    return [int(word) for word in out.split() if word.isdigit()]


def kill_namespace_processes(namespace: str, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM every process in ``namespace``, SIGKILL those left after ``grace`` seconds."""
    _signal_all(namespace_pids(namespace), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := [p for p in namespace_pids(namespace) if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_all(left, signal.SIGKILL)


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sweep(subnet: int) -> None:
    """Remove everything testbed ``subnet`` made: its namespaces' processes, its namespaces,
    veths and bridge.  Only the holder of the subnet's claim may call it."""
    prefix = namespace_prefix(subnet)
    mine = [ns for ns in namespaces() if ns.startswith(prefix)]
    for ns in mine:
        kill_namespace_processes(ns)
    for ns in mine:
        run([IP, "netns", "del", ns], check=False)
    veths = (f"bs{subnet}h", f"bs{subnet}n")
    for name in links():
        rest = name[len(veths[0]) :]
        if name == bridge_name(subnet) or (name.startswith(veths) and rest.isdigit()):
            run([IP, "link", "del", name], check=False)
