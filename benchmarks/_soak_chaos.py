"""The soak's chaos driver: one server fault at a time, and clock steps of the clients.

Every 2–5 s (seeded) it picks a fault (each kind once per round, in a random order) and a
server it applies to:

- ``kill``: SIGKILL, then the server is started again on its port, with its directory
  (servers of servers.cluster by its :class:`~servers.cluster.Supervisor`, Redis by
  :class:`~servers.redisd.RedisServer`); the driver waits until it answers again.
- ``stop``: SIGSTOP for 1–4 s, then SIGCONT: a server that hangs without closing anything.
- ``disk_full``: for 2–6 s every write to that server fails as a full disk makes it fail.  A
  block server is switched by its fault middleware (``/admin/faults``) to answer every block
  PUT with 503 ``unavailable``: what its ``LocalBlockStore`` answers for a real ``ENOSPC``
  (an OSError becomes Unavailable), without filling the machine's disk.  Redis gets
  ``CONFIG SET maxmemory 1``: every write command is refused with its OOM error, as a full
  Redis refuses them.

On a cluster on hosts (``soak --hosts N``) the faults also include ``partition``, ``flap`` and
``slow`` of a target's link (benchmarks/_soak_links.py), in the same rounds.

Independently, every 2–5 s each clock file (one per client run under libfaketime) is set to a
new offset in ``[-skew, +skew]`` seconds: that client's wall clock steps, as an NTP step
would, while its monotonic clock runs on.

:meth:`Chaos.heal` undoes everything (SIGCONT, disks freed, clocks back to 0, every server up);
a cancelled run (Ctrl-C) still sends SIGCONT, heals every link and sets every clock back to 0.
:func:`cluster_targets` and :func:`third_party_targets` make the targets of a soak's servers.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers.cluster import Cluster, ServerProcess, Supervisor
from servers.redisd import RedisServer
from servers.s3d import S3Server

from ._soak_links import LINK_ACTIONS, LinkFaults

HOLD_STOP_S = (1.0, 4.0)
HOLD_DISK_FULL_S = (2.0, 6.0)
GAP_S = (2.0, 5.0)
ACTIONS = ["kill", "stop", "disk_full"]
UP_TIMEOUT_S = 45.0  # a killed server must answer again within this
BLOCK_PUTS_FULL = {"rules": [{"route": "/v1/blocks", "methods": ["PUT"], "error_rate": 1.0}]}

_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Target:
    """A server the chaos may hit."""

    name: str
    pid: Callable[[], int | None]  # its process now (None: not running)
    healthy: Callable[[], bool]
    kill: Callable[[], None] | None = None  # SIGKILL it and start it again (blocking); None: never killed
    fill: Callable[[], None] | None = None  # disk full on
    free: Callable[[], None] | None = None  # and off
    host: str | None = None  # its testbed host, on a cluster on hosts: its link's faults too


@dataclass
class Event:
    at_s: float
    action: str
    target: str
    seconds: float = 0.0
    note: str = ""


@dataclass
class Chaos:
    targets: list[Target]
    clock_files: list[Path]
    skew_s: int
    seed: int
    log: Callable[[str], None]
    links: LinkFaults | None = None  # on hosts: the faults at the targets' links
    events: list[Event] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    _stopped: set[int] = field(default_factory=set)
    _full: set[str] = field(default_factory=set)
    _began: float = field(default_factory=time.monotonic)

    @property
    def actions(self) -> list[str]:
        """The kinds of fault, each once per round."""
        return ACTIONS + (LINK_ACTIONS if self.links is not None else [])

    async def run(self, seconds: float) -> None:
        """Inject faults for ``seconds``; leaves everything healed."""
        deadline = time.monotonic() + seconds
        try:
            await asyncio.gather(self._faults(deadline), self._clocks(deadline))
        finally:
            self._release()  # even when cancelled (Ctrl-C): no server is left stopped
        await self.heal()

    async def _faults(self, deadline: float) -> None:
        rng = random.Random(f"{self.seed}:faults")
        actions: list[str] = []
        while await _sleep_until(rng.uniform(*GAP_S), deadline):
            if not actions:  # every kind of fault once per round, in a random order
                actions = rng.sample(self.actions, len(self.actions))
            action = actions.pop()
            eligible = [t for t in self.targets if _able(t, action)]
            if eligible and action in LINK_ACTIONS:
                await self._link(action, rng.choice(eligible), rng)
            elif eligible:
                await getattr(self, f"_{action}")(rng.choice(eligible), rng)

    async def _kill(self, target: Target, rng: random.Random) -> None:
        assert target.kill is not None
        began = time.monotonic()
        try:
            await asyncio.to_thread(target.kill)
        except (OSError, RuntimeError) as exc:  # not restarted now: the heal waits for it
            self.log(f"kill {target.name}: {exc}")
        up = await _wait_up(target, UP_TIMEOUT_S)
        self._event("kill", target, time.monotonic() - began, "" if up else f"not up after {UP_TIMEOUT_S:g}s")

    async def _stop(self, target: Target, rng: random.Random) -> None:
        pid = target.pid()
        if pid is None:
            return
        hold = rng.uniform(*HOLD_STOP_S)
        self._signal(pid, signal.SIGSTOP)
        self._stopped.add(pid)
        try:
            await asyncio.sleep(hold)
        finally:
            self._signal(pid, signal.SIGCONT)
            self._stopped.discard(pid)
        self._event("stop", target, hold)

    async def _disk_full(self, target: Target, rng: random.Random) -> None:
        assert target.fill is not None and target.free is not None
        hold = rng.uniform(*HOLD_DISK_FULL_S)
        try:
            await asyncio.to_thread(target.fill)
        except OSError as exc:  # down at this moment: nothing to fill
            self.log(f"disk_full {target.name}: {exc}")
            return
        self._full.add(target.name)
        try:
            await asyncio.sleep(hold)
        finally:
            await self._free(target)
        self._event("disk_full", target, hold)

    async def _free(self, target: Target) -> None:
        assert target.free is not None
        with suppress(OSError):  # restarted meanwhile: it came back with an empty disk-full switch
            await asyncio.to_thread(target.free)
        self._full.discard(target.name)

    async def _link(self, action: str, target: Target, rng: random.Random) -> None:
        assert self.links is not None and target.host is not None
        count, seconds, note = await getattr(self.links, action)(target.host, rng)
        self._event(count, target, seconds, note)

    async def _clocks(self, deadline: float) -> None:
        rng = random.Random(f"{self.seed}:clocks")
        if not self.clock_files or self.skew_s <= 0:
            return
        while await _sleep_until(rng.uniform(*GAP_S), deadline):
            for path in self.clock_files:
                offset = rng.randint(-self.skew_s, self.skew_s)
                set_clock(path, offset)
                self.counts["clock_step"] += 1
                self.events.append(Event(self._now(), "clock_step", path.stem, float(offset)))

    def _release(self) -> None:
        """SIGCONT what is stopped, links healed, clocks to 0."""
        if self.links is not None:
            self.links.release()
        for pid in list(self._stopped):
            self._signal(pid, signal.SIGCONT)
        self._stopped.clear()
        for path in self.clock_files:
            set_clock(path, 0)

    async def heal(self) -> None:
        """Everything released, every disk freed, every server up."""
        self._release()
        for target in self.targets:
            if target.name in self._full:
                await self._free(target)
        for target in self.targets:
            if not await _wait_up(target, UP_TIMEOUT_S):
                self.log(f"{target.name} is not up after the chaos ({UP_TIMEOUT_S:g}s)")

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)

    def _event(self, action: str, target: Target, seconds: float, note: str = "") -> None:
        self.counts[action] += 1
        self.events.append(Event(self._now(), action, target.name, seconds, note))
        self.log(f"{action} {target.name} ({seconds:.1f}s){' ' + note if note else ''}")

    def _now(self) -> float:
        return round(time.monotonic() - self._began, 3)


def _able(target: Target, action: str) -> bool:
    if action == "kill":
        return target.kill is not None
    if action == "disk_full":
        return target.fill is not None
    if action in LINK_ACTIONS:
        return target.host is not None
    return True


async def _sleep_until(seconds: float, deadline: float) -> bool:
    """Sleep ``seconds``, or until ``deadline``; whether time is left for something after."""
    await asyncio.sleep(max(0.0, min(seconds, deadline - time.monotonic())))
    return time.monotonic() < deadline - 1.0


async def _wait_up(target: Target, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(target.healthy):
            return True
        await asyncio.sleep(0.2)
    return False


def set_clock(path: Path, offset: int) -> None:
    """libfaketime's FAKETIME_TIMESTAMP_FILE: a relative offset, written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{offset:+d}s\n")
    os.replace(tmp, path)


# --- what a fault does to each kind of server ----------------------------------------------


def http_healthy(url: str) -> bool:
    try:
        with _direct.open(f"{url}/healthz", timeout=2.0) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def admin_faults(url: str, token: str, config: dict[str, object] | None) -> None:
    """PUT ``config`` to the server's /admin/faults (None: DELETE, faults off)."""
    body = None if config is None else json.dumps(config).encode()
    request = urllib.request.Request(f"{url}/admin/faults", data=body, method="DELETE" if config is None else "PUT")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    with _direct.open(request, timeout=5.0) as response:
        response.read()


def redis_command(port: int, *words: str) -> str:
    """One inline Redis command; its reply's first line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as conn:
        conn.sendall((" ".join(words) + "\r\n").encode())
        reply = conn.recv(4096).decode(errors="replace")
    if not reply.startswith("+"):
        raise OSError(f"redis said {reply.strip()!r} to {' '.join(words)}")
    return reply.strip()


def child_pid(pid: int | None) -> int | None:
    """The one child of ``pid`` (the server a lifeline wrapper runs); None if there is none."""
    if pid is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


# --- the servers of a soak, as targets ------------------------------------------------------


class SupervisorThread:
    """servers.cluster's Supervisor, polled on a thread: a killed server is started again on its port."""

    def __init__(self, cluster: Cluster, log: Callable[[str], None]) -> None:
        self._supervisor = Supervisor(cluster.processes, cluster.restart, lambda m: log(f"cluster: {m}"))
        self._stop = threading.Event()
        self.lock = threading.Lock()  # held while polling: a kill waits, so no death goes unseen mid-poll

    @contextmanager
    def running(self) -> Iterator[None]:
        thread = threading.Thread(target=self._loop, name="soak-supervisor", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            with self.lock:
                self._supervisor.poll(time.monotonic())


def cluster_targets(cluster: Cluster, admin: str, supervisor: SupervisorThread, *, api: bool = True) -> list[Target]:
    """The cluster's servers as targets (its API servers only with ``api``: with --redis-s3 no
    client uses them)."""
    targets = []
    for proc in cluster.processes:
        if proc.kind == "api" and not api:
            continue
        fill = free = None
        if proc.kind == "block":
            fill = _bound(admin_faults, proc, admin, BLOCK_PUTS_FULL)
            free = _bound(admin_faults, proc, admin, None)
        targets.append(
            Target(
                name=proc.name,
                pid=_bound_pid(proc),
                healthy=_bound_healthy(proc),
                kill=_bound_kill(proc, supervisor),
                fill=fill,
                free=free,
                host=None if cluster.placement is None else proc.name,
            )
        )
    return targets


def _bound(fn: Callable[[str, str, Any], None], proc: ServerProcess, admin: str, config: Any) -> Callable[[], None]:
    return lambda: fn(proc.url, admin, config)


def _bound_pid(proc: ServerProcess) -> Callable[[], int | None]:
    return lambda: proc.pid if proc.popen.poll() is None else None


def _bound_healthy(proc: ServerProcess) -> Callable[[], bool]:
    return lambda: proc.popen.poll() is None and http_healthy(proc.url)


def _bound_kill(proc: ServerProcess, supervisor: SupervisorThread) -> Callable[[], None]:
    def kill() -> None:
        with supervisor.lock:
            proc.popen.kill()  # SIGKILL; the supervisor starts it again on its port
            proc.popen.wait()

    return kill


def third_party_targets(redis: RedisServer | None, s3: S3Server | None) -> list[Target]:
    targets = []
    if redis is not None:
        port = redis.port

        def kill_redis() -> None:
            redis.stop()  # SIGKILL (its lifeline wrapper kills it)
            time.sleep(0.5)
            redis.start()  # same port, same directory: the AOF brings every write back

        targets.append(
            Target(
                name="redis",
                pid=lambda: child_pid(None if redis.process is None else redis.process.pid),
                healthy=lambda: _answers(redis),
                kill=kill_redis,
                fill=lambda: _redis_maxmemory(port, 1),
                free=lambda: _redis_maxmemory(port, 0),
            )
        )
    if s3 is not None:
        targets.append(
            Target(name="s3", pid=lambda: child_pid(None if s3.process is None else s3.process.pid), healthy=lambda: _answers(s3))
        )
    return targets


def _answers(service: RedisServer | S3Server) -> bool:
    try:
        return service.answers(service.port)
    except OSError:
        return False


def _redis_maxmemory(port: int, limit: int) -> None:
    redis_command(port, "CONFIG", "SET", "maxmemory", str(limit))
