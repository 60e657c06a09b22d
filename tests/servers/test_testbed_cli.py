"""``python -m servers.testbed``: its argument errors (exact, exit 2), and driving a running
testbed's links from the command line; and ``blobsdk-cluster --hosts``'s argument errors."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from servers.cluster import parse_cli
from servers.testbed import Link, Testbed, main
from tests.helpers import ROOT
from tests.servers.test_testbed import leftovers

USAGE_ERRORS = [
    (["up", "--dir", "d"], "up needs at least one --host"),
    (["up", "--dir", "d", "--host", "a=100"], "'a=100': rates are UP:DOWN in Mbit/s (e.g. a=1000:1000)"),
    (["up", "--dir", "d", "--host", "a=x:"], "rate 'x' is not a number of Mbit/s"),
    (["up", "--dir", "d", "--host", "a=-5:"], "rate '-5' must be positive"),
    (["partition", "--dir", "d"], "the following arguments are required: host"),
    (
        ["partition", "--dir", "d", "a", "--direction", "up"],
        "argument --direction: invalid choice: 'up' (choose from 'both', 'in', 'out')",
    ),
    (["slow", "--dir", "d", "a", "--up", "0"], "--up must be positive, got 0"),
    (["flap", "--dir", "d", "a", "--down-s", "1"], "the following arguments are required: --up-s"),
    (["flap", "--dir", "d", "a", "--down-s", "1", "--up-s", "1", "--cycles", "0"], "--cycles must be at least 1, got 0"),
    (["heal", "a"], "the following arguments are required: --dir"),
]


@pytest.mark.parametrize(("argv", "message"), USAGE_ERRORS)
def test_bad_arguments_are_one_error_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m servers.testbed {argv[0]}: error: {message}"


def test_a_command_on_no_testbed_says_so_and_exits_1(tmp_path, capsys):
    assert main(["heal", "--dir", str(tmp_path), "a"]) == 1
    assert capsys.readouterr().err == f"python -m servers.testbed: error: no testbed runs in {tmp_path} (no testbed.json)\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--link", "block=1:1"], "--link needs --hosts"),
        (
            ["--hosts", "--link", "blok=1:1"],
            "--link blok: no such server or kind (servers: api, block-0, block-1, block-2, l3-0, l3-1, tracker)",
        ),
        (["--hosts", "--link", "block=abc:1"], "--link rate 'abc' is not a number of Mbit/s"),
    ],
)
def test_bad_cluster_links_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_cli(["--dir", "d", *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m servers.cluster: error: {message}"


def test_cluster_links_by_server_and_kind():
    _, options, _ = parse_cli(["--dir", "d", "--hosts", "--link", "block=1000:1000", "--link", "block-2=50:"])
    assert options.hosts and dict(options.links) == {"block": Link(up=1000, down=1000), "block-2": Link(up=50)}


def test_the_command_drives_a_running_testbed(testbed_unavailable, tmp_path, capsys):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    up = subprocess.Popen(
        [sys.executable, "-m", "servers.testbed", "up", "--dir", str(tmp_path), "--host", "a=100:50", "--host", "b"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with up:
        assert up.stderr is not None and up.stderr.readline() == f"testbed ready in {tmp_path}; Ctrl-C or SIGTERM removes it\n"
        bed = Testbed.attach(tmp_path)
        a, b = bed.host("a"), bed.host("b")
        assert main(["hosts", "--dir", str(tmp_path)]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"a\t{a.address}\t{a.namespace}\tup=100mbit\tdown=50mbit\tup",
            f"b\t{b.address}\t{b.namespace}\tup=unshaped\tdown=unshaped\tup",
        ]
        assert main(["partition", "--dir", str(tmp_path), "a", "--direction", "out"]) == 0
        assert ["limit 0p" in side for side in bed.qdiscs("a")] == [True, False]
        assert Testbed.attach(tmp_path).host("a").partitioned == "out"
        assert main(["heal", "--dir", str(tmp_path), "a"]) == 0
        assert ["rate 100Mbit" in bed.qdiscs("a")[0], "rate 50Mbit" in bed.qdiscs("a")[1]] == [True, True]
        assert main(["slow", "--dir", str(tmp_path), "b", "--up", "10"]) == 0
        assert "rate 10Mbit" in bed.qdiscs("b")[0] and "qdisc noqueue" in bed.qdiscs("b")[1]
        handlers = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
        assert main(["flap", "--dir", str(tmp_path), "b", "--down-s", "0.05", "--up-s", "0.05", "--cycles", "2"]) == 0
        assert "rate 10Mbit" in bed.qdiscs("b")[0]
        # The caller's process is left as it was: with SIGTERM left ignored, every child it
        # started later (which inherits that across exec) outlived its terminate().
        assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == handlers
        assert main(["heal", "--dir", str(tmp_path), "c"]) == 1
        assert capsys.readouterr().err == "python -m servers.testbed: error: no host 'c' in this testbed (hosts: a, b)\n"
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
    assert bed.subnet is not None and leftovers(bed.subnet) == []
    assert not (tmp_path / "testbed.json").exists()
