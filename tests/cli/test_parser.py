"""blobsdk/cli/parser.py: every command line of the project refuses abbreviations, and an
unknown option is its first error, naming the nearest known one (not ``invalid choice`` for
the value after it, nor ``required: --dir``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import pytest

from benchmarks.__main__ import main as benchmarks_main
from blobsdk.cli import build_parser
from blobsdk.cli import main as blobsdk_main
from blobsdk.cli.parser import ArgumentParser
from servers.blockstore import _parser as blockstore_parser
from servers.cluster import parse_cli
from tests.helpers import ROOT


def usage(parser: argparse.ArgumentParser, *subcommands: str) -> str:
    for name in subcommands:
        (chooser,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = chooser.choices[name]
    return parser.format_usage()


def refused(capsys: pytest.CaptureFixture[str], command: Callable[[Sequence[str]], object], argv: list[str]) -> str:
    """``command(argv)``'s stderr, once it exited 2 with nothing on stdout."""
    with pytest.raises(SystemExit) as exc:
        command(argv)
    out, err = capsys.readouterr()
    assert (exc.value.code, out) == (2, "")
    return err


CLI_CASES = [
    (["--confg", "x", "ls", "/b"], (), "blobsdk: error: unrecognized argument --confg; did you mean --config?"),
    (["--local", "x", "ls", "--lon", "/b"], ("ls",), "blobsdk ls: error: unrecognized argument --lon; did you mean --long?"),
    (["--loc", "x", "ls", "/b"], (), "blobsdk: error: unrecognized argument --loc; did you mean --local?"),
    (["--cr", "--local", "x", "ls", "/b"], (), "blobsdk: error: unrecognized argument --cr; did you mean --create?"),
    (["--config=x", "stat", "--jsn", "/b/k"], ("stat",), "blobsdk stat: error: unrecognized argument --jsn"),
    (["ckpt", "ls", "--bogus", "/b/ckpt"], ("ckpt", "ls"), "blobsdk ckpt ls: error: unrecognized argument --bogus"),
    (["--local", "x", "prefetch", "/b/", "--tier=l2", "--pin-second", "5"], ("prefetch",), None),
    (
        ["get", "/b/k", "--config", "c.toml"],
        ("get",),
        "blobsdk get: error: --config is an option of blobsdk, before the subcommand: blobsdk --config FILE get ...",
    ),
    (
        ["ckpt", "ls", "/b/ckpt", "--local=x"],
        ("ckpt", "ls"),
        "blobsdk ckpt ls: error: --local is an option of blobsdk, before the subcommand: blobsdk --local DIR ckpt ls ...",
    ),
    (
        ["--local", "x", "ls", "--create", "/b"],
        ("ls",),
        "blobsdk ls: error: --create is an option of blobsdk, before the subcommand: blobsdk --create ls ...",
    ),
]


@pytest.mark.parametrize(("argv", "where", "error"), CLI_CASES, ids=[" ".join(argv) for argv, _, _ in CLI_CASES])
def test_the_cli_refuses_an_unknown_option_first_naming_the_nearest(
    capsys: pytest.CaptureFixture[str], argv: list[str], where: tuple[str, ...], error: str | None
) -> None:
    if error is None:
        error = f"blobsdk {' '.join(where)}: error: unrecognized argument --pin-second; did you mean --pin-seconds?"
    assert refused(capsys, blobsdk_main, argv) == usage(build_parser(), *where) + error + "\n"


def cluster_usage(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        parse_cli(["--help"])
    return capsys.readouterr().out.split("\n\n")[0] + "\n"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--dirr", "x"], "unrecognized argument --dirr; did you mean --dir?"),  # not "required: --dir"
        (["--dir", "x", "--block-server", "3"], "unrecognized argument --block-server; did you mean --block-servers?"),
        (["--dir", "x", "--l3", "2"], "unrecognized argument --l3"),  # a prefix of three options
        (["--dir", "x", "--seaweed"], "unrecognized argument --seaweed; did you mean --seaweedfs?"),
        (["--dir", "x", "--no-r"], "unrecognized argument --no-r; did you mean --no-restart?"),
        (["--dir=x", "--l3-node=2"], "unrecognized argument --l3-node; did you mean --l3-nodes?"),
    ],
)
def test_the_cluster_refuses_an_unknown_option_first_naming_the_nearest(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    expected = cluster_usage(capsys) + f"python -m servers.cluster: error: {error}\n"
    assert refused(capsys, parse_cli, argv) == expected


def test_a_server_refuses_an_unknown_option_before_a_missing_required_one(capsys: pytest.CaptureFixture[str]) -> None:
    parser = blockstore_parser()
    error = f"{parser.prog}: error: unrecognized argument --dirr; did you mean --dir?\n"
    assert refused(capsys, parser.parse_args, ["--dirr", "/tmp/x"]) == parser.format_usage() + error


def test_the_benchmarks_refuse_an_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, benchmarks_main, ["scale", "--quikc"])
    assert err.endswith("\npython -m benchmarks: error: unrecognized argument --quikc; did you mean --quick?\n")


# --- the scan itself: what it must let through -------------------------------------------------


def toy(kind: type[argparse.ArgumentParser] = ArgumentParser) -> argparse.ArgumentParser:
    parser = kind(prog="toy", allow_abbrev=False) if kind is argparse.ArgumentParser else kind(prog="toy")
    parser.add_argument("--name")
    parser.add_argument("--many", nargs="*")
    parser.add_argument("--maybe", nargs="?", const="c")
    parser.add_argument("--pair", nargs=2)
    parser.add_argument("-p", "--port", type=int)
    parser.add_argument("-v", action="count", default=0)
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run")
    run.add_argument("--fast", action="store_true")
    run.add_argument("number", type=float, nargs="?")
    run.add_argument("rest", nargs="*")
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--name", "run", "run", "--fast"],  # a value named like the subcommand
        ["--many", "a", "b", "--name=--x", "run"],
        ["--maybe", "--name", "x", "run"],
        ["--maybe", "m", "run", "1"],
        ["--pair", "a", "b", "run", "-5"],  # a negative number is a value
        ["-p8080", "-vv", "run", "1", "--", "--not-an-option"],
        ["run", "1", "-", "x"],
        ["-v", "--hidden", "h"],
    ],
    ids=" ".join,
)
def test_what_argparse_takes_is_read_the_same(argv: list[str]) -> None:
    assert vars(toy().parse_args(argv)) == vars(toy(argparse.ArgumentParser).parse_args(argv))


def test_a_hidden_option_is_never_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, toy().parse_args, ["--hiden", "x"]).endswith("toy: error: unrecognized argument --hiden\n")
    nearest = "toy: error: unrecognized argument --nme; did you mean --name?\n"
    assert refused(capsys, toy().parse_args, ["--nme", "x"]).endswith(nearest)


def test_every_command_line_of_the_project_uses_the_shared_parser() -> None:
    """No abbreviations anywhere: the CLI's, each server's and the benchmarks' parsers are
    this class (argparse makes subparsers of their parent's class)."""
    plain = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("blobsdk", "servers", "benchmarks")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "blobsdk" / "cli" / "parser.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "argparse.ArgumentParser(" in line
    ]
    assert plain == []
    (chooser,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert not build_parser().allow_abbrev and not any(p.allow_abbrev for p in chooser.choices.values())
