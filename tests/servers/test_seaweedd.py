"""servers/seaweedd.py: a local SeaweedFS on loopback ports of its own, checking signatures,
dying with its starter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import obstore
import pytest
from botocore.exceptions import ClientError
from obstore.exceptions import PermissionDeniedError
from obstore.store import S3Store

from servers import seaweedd
from servers.seaweedd import SeaweedServer, start_seaweed
from tests.helpers import ROOT


def _weed_pid(server: SeaweedServer) -> int:
    """The ``weed`` process under the server's lifeline."""
    assert server.process is not None
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
    [pid] = [int(c) for c in children]
    return pid


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                found.add(("127.0.0.1" if address == "0100007F" else address, int(port, 16)))
    return found


def _until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_two_servers_listen_on_loopback_ports_of_their_own_only(seaweed, tmp_path):
    with start_seaweed(tmp_path / "second") as second:
        sets = []
        for server in (seaweed, second):
            expected = {("127.0.0.1", port) for port in server.ports.values()}
            expected.add(("127.0.0.1", server.ports["admin.port"] + 10000))  # the admin's gRPC port
            pid = _weed_pid(server)
            _until(lambda pid=pid, expected=expected: _listening(pid) == expected)
            sets.append(expected)
        assert not sets[0] & sets[1] and len(sets[0]) == 10


def test_requests_must_be_signed_with_its_keys_and_bucket_names_be_dns_style(seaweed):
    seaweed.make_bucket("signed")
    seaweed.make_bucket("signed")  # kept, as moto does
    with pytest.raises(urllib.error.HTTPError, match=r"HTTP Error 403: Forbidden"):
        urllib.request.urlopen(f"{seaweed.endpoint}/signed/k", timeout=10)  # unsigned
    wrong = S3Store("signed", config={**seaweed.config, "secret_access_key": "nope"}, client_options={"allow_http": True})
    with pytest.raises(PermissionDeniedError, match=r"SignatureDoesNotMatch"):
        obstore.put(wrong, "k", b"x")
    with pytest.raises(ClientError, match=r"InvalidBucketName"):
        seaweed.make_bucket("b1")
    missing = S3Store("never-made", config=seaweed.config, client_options={"allow_http": True})
    with pytest.raises(Exception, match=r"NoSuchBucket"):  # no bucket made on a first upload, as on AWS
        obstore.put(missing, "k", b"x")


def test_it_dies_with_the_process_that_started_it(tmp_path):
    script = (
        "import sys, time\n"
        "from servers.seaweedd import start_seaweed\n"
        "from tests.servers.test_seaweedd import _weed_pid\n"
        f"with start_seaweed({str(tmp_path / 'weed')!r}) as s:\n"
        "    print(_weed_pid(s), flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    starter = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        weed = int(starter.stdout.readline())
        assert Path(f"/proc/{weed}").exists()
        starter.send_signal(signal.SIGKILL)
        starter.wait(10)
        _until(lambda: not Path(f"/proc/{weed}").exists() or _zombie(weed))
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if starter.stdout is not None:
            starter.stdout.close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_ports_picked_are_distinct_when_the_kernel_offers_one_twice(monkeypatch):
    """A port free a moment ago stays free until weed binds it: the kernel may offer the S3
    port again, and the admin's pair may overlap another port; each such offer is passed over."""
    offers = iter([40000, 40001, 40001, 40002, 40003, 40004, 40005, 40003, 40006, 40007])
    admin = iter([(40006, 50006), (30000, 40000), (30001, 40008)])  # clashes: 40006, then 40000
    monkeypatch.setattr(seaweedd, "free_port", lambda: next(offers))
    monkeypatch.setattr(seaweedd, "_admin_ports", lambda: next(admin))
    ports = seaweedd.SeaweedServer._pick_ports(40000)
    assert list(ports.values()) == [40000, 40001, 40002, 40003, 40004, 40005, 40006, 40007, 30001]
