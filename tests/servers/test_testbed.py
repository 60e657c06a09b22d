"""servers/testbed_hosts.py (through servers/testbed.py): hosts in network namespaces, their shaped links (read back from ``tc
qdisc show``, never timed), partitions and heals (a TCP connect that times out, then
succeeds), flaps, several testbeds at once, and the crash guard.  Skipped, with the reason,
where namespaces cannot be made (the ``testbed`` fixture, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servers._common import netns
from servers._common.tbclaim import CLAIM_DIR
from servers.testbed import Link, Testbed, check_address
from tests.helpers import ROOT
from tests.servers.test_cluster import _alive, _wait_for

CONNECT_TIMEOUT_S = 0.5  # a partitioned connect: dropped SYNs, so always this long
HEALED_TIMEOUT_S = 10.0  # a healed one answers at once; generous for a loaded machine


def listen(bed: Testbed, host: str) -> int:
    """A TCP server in ``host`` that accepts and closes; its port."""
    address = bed.host(host).address
    code = (
        "import socket\n"
        f"s = socket.create_server(({address!r}, 0))\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True: s.accept()[0].close()\n"
    )
    proc = bed.popen(host, [sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return int(proc.stdout.readline())


def connects(address: str, port: int, timeout: float) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def leftovers(subnet: int) -> list[str]:
    """Namespaces, links and the claim file of ``subnet`` still there."""
    names = [ns for ns in netns.namespaces() if ns.startswith(netns.namespace_prefix(subnet))]
    names += [name for name in netns.links() if name == f"bsb{subnet}" or name.startswith((f"bs{subnet}h", f"bs{subnet}n"))]
    return names + [str(p) for p in [CLAIM_DIR / f"{subnet}.lock"] if p.exists()]


def test_links_are_shaped_per_direction_and_changed_live(testbed):
    a = testbed.add_host("a", Link(up=200, down=50))
    up, down = testbed.qdiscs(a)
    assert " tbf " in up and "rate 200Mbit" in up
    assert " tbf " in down and "rate 50Mbit" in down
    testbed.set_link(a, up=None, down=10)
    up, down = testbed.qdiscs(a)
    assert "qdisc noqueue" in up and "rate 10Mbit" in down
    assert a.link == Link(up=None, down=10)


def test_hosts_get_addresses_in_the_testbeds_subnet_and_only_their_own_route(testbed):
    a, b = testbed.add_host("a"), testbed.add_host("b")
    assert (a.address, b.address) == (str(testbed.network[1]), str(testbed.network[2]))
    assert testbed.driver_address == str(testbed.network[254])
    routes = netns.run(["ip", "-n", a.namespace, "route", "show"])
    assert routes.strip() == f"{testbed.network} dev {a.inner} proto kernel scope link src {a.address}"


def test_partition_drops_one_direction_or_both_and_heal_restores_the_shaped_link(testbed):
    a = testbed.add_host("a", Link(up=100, down=100))
    port = listen(testbed, "a")
    assert connects(a.address, port, HEALED_TIMEOUT_S)
    for direction in ("in", "out", "both"):
        testbed.partition(a, direction)
        assert not connects(a.address, port, CONNECT_TIMEOUT_S), direction
        testbed.heal(a)
        assert connects(a.address, port, HEALED_TIMEOUT_S), direction
    assert ["rate 100Mbit" in side for side in testbed.qdiscs(a)] == [True, True]


def test_a_partition_is_per_host_and_hosts_reach_each_other(testbed):
    testbed.add_host("a")
    b = testbed.add_host("b")
    port = listen(testbed, "b")
    probe = f"import socket; socket.create_connection(({b.address!r}, {port}), timeout={HEALED_TIMEOUT_S}).close()"
    assert testbed.popen("a", [sys.executable, "-c", probe]).wait() == 0
    testbed.partition("a", "out")
    assert connects(b.address, port, HEALED_TIMEOUT_S)  # from the driver: b is untouched
    probe = probe.replace(str(HEALED_TIMEOUT_S), str(CONNECT_TIMEOUT_S))
    assert testbed.popen("a", [sys.executable, "-c", probe], stderr=subprocess.DEVNULL).wait() == 1


def test_set_link_on_a_partitioned_host_takes_effect_when_it_heals(testbed):
    a = testbed.add_host("a", Link(up=100))
    testbed.partition(a, "both")
    testbed.set_link(a, up=30, down=None)
    assert ["limit 0p" in side for side in testbed.qdiscs(a)] == [True, True]
    testbed.heal(a)
    up, down = testbed.qdiscs(a)
    assert "rate 30Mbit" in up and "qdisc noqueue" in down


def test_a_flap_partitions_and_heals_until_stopped_and_leaves_the_link_up(testbed):
    a = testbed.add_host("a", Link(up=100))
    seen: set[bool] = set()

    def toggled_twice() -> bool:
        seen.add("limit 0p" in testbed.qdiscs(a)[0])
        return flap.cycles >= 2 and seen == {True, False}

    with testbed.flap(a, down_s=0.1, up_s=0.1) as flap:
        _wait_for(toggled_twice, 30, "the flap went down twice and was seen both down and up")
    assert a.partitioned is None and "rate 100Mbit" in testbed.qdiscs(a)[0]


def test_testbeds_at_once_claim_distinct_subnets(testbed):
    with Testbed() as other:
        assert other.subnet != testbed.subnet
        assert other.network != testbed.network and other.bridge != testbed.bridge
        assert other.add_host("a").address != testbed.add_host("a").address


def test_stop_removes_processes_namespaces_links_and_the_claim(testbed_unavailable, tmp_path):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    with Testbed(dir=tmp_path) as bed:
        bed.add_host("a", Link(up=10))
        stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
        proc = bed.popen("a", [sys.executable, "-c", stubborn], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"\n"  # ignores SIGTERM from now on
        assert (tmp_path / "testbed.json").exists()
        subnet = bed.subnet
        assert subnet is not None and leftovers(subnet)
    assert proc.returncode == -signal.SIGKILL
    assert leftovers(subnet) == [] and not (tmp_path / "testbed.json").exists()


CREATOR = textwrap.dedent(
    """
    import json, sys
    from servers.testbed import Link, Testbed
    bed = Testbed().start()
    pids = [bed.popen(bed.add_host(name, Link(up=100)), [sys.executable, "-c", "import time; time.sleep(600)"]).pid
            for name in ("a", "b")]
    print(json.dumps({"subnet": bed.subnet, "pids": pids, "guard": bed._claim.guard.pid}), flush=True)
    sys.stdin.read()
    """
)


def _creator() -> tuple[subprocess.Popen[str], dict[str, int]]:
    proc = subprocess.Popen([sys.executable, "-c", CREATOR], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def _kill(proc: subprocess.Popen[str]) -> None:
    with proc:  # closes its pipes
        proc.kill()


def test_the_guard_removes_everything_when_the_creator_is_killed(testbed_unavailable):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    proc, made = _creator()
    assert leftovers(made["subnet"])
    _kill(proc)
    gone = lambda: leftovers(made["subnet"]) == [] and not any(_alive(p) for p in [*made["pids"], made["guard"]])  # noqa: E731
    _wait_for(gone, 30, "the guard removed the killed creator's testbed")


def test_a_new_testbed_sweeps_one_whose_creator_and_guard_both_died(testbed_unavailable):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    proc, made = _creator()
    os.kill(made["guard"], signal.SIGKILL)
    _wait_for(lambda: not _alive(made["guard"]), 30, "the guard died")
    _kill(proc)
    assert leftovers(made["subnet"]) != []  # nobody cleaned up
    with Testbed() as bed:  # takes the first free subnet: the dead one's, most likely
        assert [ns for ns in netns.namespaces() if ns.startswith(netns.namespace_prefix(made["subnet"]))] == []
        assert not any(_alive(p) for p in made["pids"])
        assert bed.subnet == made["subnet"] or leftovers(made["subnet"]) == []


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Link(up=0), ValueError, "Link.up must be a positive rate in Mbit/s or None, got 0"),
        (lambda: Link(down="10"), TypeError, "Link.down must be a number of Mbit/s or None, got str"),
        (lambda: Link(queue_ms=0), ValueError, "Link.queue_ms must be positive, got 0"),
        (
            lambda: check_address("10.0.0.1"),
            ValueError,
            "testbed addresses must be in 198.18.0.0/15 (reserved for such tests), got 10.0.0.1",
        ),
        (lambda: check_address("nowhere"), ValueError, "not an IP address: 'nowhere'"),
    ],
)
def test_bad_links_and_addresses_are_refused(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value) == message


def test_bad_hosts_and_directions_are_refused(testbed):
    testbed.add_host("a")
    cases = [
        (lambda: testbed.add_host("A_1"), ValueError, "host name must be 1-32 of a-z, 0-9 and '-' (not first), got 'A_1'"),
        (lambda: testbed.add_host("a"), ValueError, "host 'a' exists already"),
        (lambda: testbed.add_host("b", 100), TypeError, "link must be a Link, got int"),
        (lambda: testbed.partition("a", "sideways"), ValueError, "direction must be one of both, in, out, got 'sideways'"),
        (lambda: testbed.heal("c"), KeyError, "\"no host 'c' in this testbed (hosts: a)\""),
        (lambda: testbed.heal(3), TypeError, "host must be a Host or a host name, got int"),
        (lambda: testbed.flap("a", 0, 1), ValueError, "flap needs positive down_s and up_s, got 0 and 1"),
    ]
    for make, error, message in cases:
        with pytest.raises(error) as raised:
            make()
        assert str(raised.value) == message


def test_a_tampered_state_file_is_refused(testbed):
    testbed.add_host("a")
    path = testbed.dir / "testbed.json"
    state = json.loads(path.read_text())
    state["hosts"][0]["address"] = "10.0.0.5"
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError) as raised:
        Testbed.attach(testbed.dir)
    assert str(raised.value) == (
        f"{path}: not a testbed state file: testbed addresses must be in 198.18.0.0/15 (reserved for such tests), got 10.0.0.5"
    )
    state["hosts"][0].update(address=str(testbed.network[1]), namespace="init")
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError) as raised:
        Testbed.attach(testbed.dir)
    assert str(raised.value) == f"{path}: not a testbed state file: host 'a': bad name or namespace 'init'"


def test_attach_to_no_testbed(tmp_path: Path):
    with pytest.raises(ValueError) as raised:
        Testbed.attach(tmp_path)
    assert str(raised.value) == f"no testbed runs in {tmp_path} (no testbed.json)"


def test_stopping_the_testbed_stops_a_flap_left_running(testbed_unavailable):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    with Testbed() as bed:
        flap = bed.flap(bed.add_host("a"), down_s=0.05, up_s=0.05)
        subnet = bed.subnet
    assert not flap._thread.is_alive() and flap._error is None
    assert subnet is not None and leftovers(subnet) == []
