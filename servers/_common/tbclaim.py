"""A testbed's claim on one of the 512 /24 subnets of 198.18.0.0/15, and its crash guard.

A testbed claims subnet ``n`` by holding an exclusive ``flock`` on ``CLAIM_DIR/n.lock`` (which
also records the creator's pid, for people); the kernel drops the lock when every holder of
it is gone, so a claim never outlives its holders.  The holders are the testbed's creator
and its *guard*: a small process the creator starts (``python -c GUARD``) that inherits the
lock, watches the creator (a pidfd, and a lifeline pipe: servers/_common/lifeline.py) and, if
the creator dies without stopping the testbed, removes everything of subnet ``n``
(:func:`netns.sweep`) before it lets the lock go.  A clean stop tells the guard to leave.

Whoever takes a subnet's lock owns its names (namespaces ``blobsdk-tb<n>-*``, bridge
``bsb<n>``, veths ``bs<n>h*``/``bs<n>n*``): anything already named so is stale, left by a
testbed whose creator and guard both died, and is swept at once (:func:`claim`,
:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import netns

CLAIM_DIR = Path("/run/blobsdk-testbed")
SUBNETS = 512  # the /24s of 198.18.0.0/15
RANGE = ipaddress.ip_network("198.18.0.0/15")
GUARD = f"from {__package__}.tbclaim import guard_main; guard_main()"
_QUIT = b"q"  # the creator's word to its guard: stopped cleanly, leave


def network(subnet: int) -> ipaddress.IPv4Network:
    """The /24 of ``subnet`` (0..511) inside 198.18.0.0/15."""
    if not 0 <= subnet < SUBNETS:
        raise ValueError(f"subnet must be in 0..{SUBNETS - 1}, got {subnet}")
    first = int(RANGE.network_address) + 256 * subnet
    return ipaddress.IPv4Network((first, 24))


@dataclass
class Claim:
    subnet: int
    fd: int  # the locked claim file (not inherited but by the guard)
    path: Path
    guard: subprocess.Popen[bytes] | None = None
    _lifeline: int | None = None  # the write end: the guard's stdin

    def start_guard(self, package_root: Path) -> None:
        """Start the guard that sweeps this subnet if this process dies holding the claim."""
        read, write = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(package_root), os.environ.get("PYTHONPATH"))))}
        argv = [sys.executable, "-c", GUARD, str(os.getpid()), str(self.subnet), str(self.fd)]
        # A session of its own: a Ctrl-C at the terminal must not kill the guard before the sweep.
        self.guard = subprocess.Popen(argv, stdin=read, pass_fds=(self.fd,), env=env, start_new_session=True)
        os.close(read)
        self._lifeline = write

    def release(self) -> None:
        """Dismiss the guard (the caller swept already), drop the claim file and its lock."""
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.write(self._lifeline, _QUIT)
            os.close(self._lifeline)
            self._lifeline = None
        if self.guard is not None:
            self.guard.wait()
            self.guard = None
        # Unlinked while locked: a claimer that opened it meanwhile sees it is gone (claim()).
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


def _try_lock(path: Path) -> int | None:
    """The fd of ``path``, exclusively locked, or None if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Unlinked (or replaced) by its last holder between our open and our lock: not a claim.
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise OSError("stale claim file")
    except OSError:
        os.close(fd)
        return None
    return fd


def claim() -> Claim:
    """Claim the first free subnet, sweep anything stale named in it, record our pid."""
    CLAIM_DIR.mkdir(parents=True, exist_ok=True)
    for subnet in range(SUBNETS):
        path = CLAIM_DIR / f"{subnet}.lock"
        if (fd := _try_lock(path)) is None:
            continue
        try:
            netns.sweep(subnet)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            path.unlink(missing_ok=True)
            os.close(fd)
            raise
        return Claim(subnet, fd, path)
    raise netns.NetnsError(f"all {SUBNETS} testbed subnets of 198.18.0.0/15 are claimed (see {CLAIM_DIR})")


def sweep_stale() -> list[int]:
    """Sweep every subnet that has namespaces of ours but no live claim; the subnets swept."""
    swept = []
    subnets = {ns[len(netns.NAMESPACE_PREFIX) :].split("-", 1)[0] for ns in netns.namespaces()}
    for subnet in sorted(int(s) for s in subnets if s.isdigit() and int(s) < SUBNETS):
        path = CLAIM_DIR / f"{subnet}.lock"
        CLAIM_DIR.mkdir(parents=True, exist_ok=True)
        if (fd := _try_lock(path)) is None:
            continue
        try:
            netns.sweep(subnet)
            swept.append(subnet)
        finally:
            path.unlink(missing_ok=True)
            os.close(fd)
    return swept


def guard_main() -> None:
    """The guard: ``sys.argv[1:]`` is the creator's pid, the subnet, the claim's fd; stdin
    is the lifeline.  Sweeps the subnet unless the creator says it stopped cleanly."""
    creator, subnet, fd = (int(a) for a in sys.argv[1:])
    if _wait(creator) == _QUIT:
        return
    try:
        netns.sweep(subnet)
    finally:
        (CLAIM_DIR / f"{subnet}.lock").unlink(missing_ok=True)
        os.close(fd)


def _wait(creator: int) -> bytes:
    """What the creator said on the lifeline: _QUIT, or b"" when it is gone."""
    try:
        pidfd = os.pidfd_open(creator)
    except OSError:
        return b""  # gone already
    poller = select.poll()
    poller.register(0, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    while True:
        for fd, _ in poller.poll(None if os.getppid() == creator else 0):
            if fd == pidfd:
                return b""
            with contextlib.suppress(OSError):
                return os.read(0, 1)
            return b""
        if os.getppid() != creator:
            return b""
