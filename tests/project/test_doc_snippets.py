"""Every ```python and ```sh block of README.md and docs/*.md runs as written (tests/docsnippets.py
says how blocks are marked and run): a chain of blocks per test, in a process of its own, in an
empty directory, with the installed ``blobsdk`` commands on PATH.  A block that does not run is
marked with its reason and listed here, so none is skipped silently."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.docsnippets import Block, MarkerError, blocks, chains, commands, dump
from tests.helpers import ROOT
from tests.project.test_examples import clean_env

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOUND = {page: blocks(page, ROOT) for page in PAGES}
CHAINS = [chain for page in PAGES for chain in chains(FOUND[page])]

# (page, the block's first line) -> why it does not run
NOT_RUN = {
    ("README.md", "pip install -e .                    # the core: the async and blocking clients, the CLI, the servers"): (
        "installs into your environment"
    ),
    ("README.md", "make demo   # a venv in .venv with the core only (pip install -e ., ~50 MB), then the demo:"): (
        "make demo creates .venv and installs into it (tests/test_demo.py runs the demo); make test is the whole suite,"
        " this test among it"
    ),
    ("docs/development.md", "make demo   # creates .venv, installs blobsdk, ingests ~300 MiB of synthetic samples, reads them"): (
        "make demo creates .venv and installs into it; make test is the whole suite, this test among it"
    ),
    ("docs/testing.md", "import pytest"): (
        "tests/servers/test_testing.py runs it with plain pytest in a fresh project, with the pytest.ini below"
    ),
    ("docs/testing.md", "import time"): (
        "tests/servers/test_testing.py runs it with plain pytest in a fresh project, with the test file below and the"
        " pytest.ini above"
    ),
    ("docs/testing.md", "import pytest_asyncio"): (
        "tests/servers/test_testing.py runs it with plain pytest in a fresh project, beside dictplans.py"
    ),
    ("docs/deployment.md", "useradd --system --home /var/lib/blobsdk blobsdk"): (
        "adds a system user and writes /etc as root; tests/project/test_docs.py starts each unit's command line instead"
    ),
    ("docs/dlio.md", "export BLOBSDK_CONFIG=.cluster/client.toml BLOBSDK_DLIO_PREFIX=/bucket/unet3d"): (
        "needs .venv-dlio (make dlio), MPI and a dataset in a store"
    ),
}

# (page, text of the chain's first block) -> what the chain prints
OUTPUT = {
    ("README.md", 'c.put("/bucket/hello.txt"'): ["b'hello world'\n['/bucket/hello.txt']\n", "bytearray(b'world')\n", "a cat\n"],
    ("README.md", 'df.to_parquet("blob://bucket/labels.parquet"'): ["True\n"],
    ("docs/api.md", 'info = await c.put("/bucket/a/b.bin"'): ["/bucket/a/b.bin 11\n"],
    ("docs/integrations.md", 'c.put_many((f"/bucket/train/{i:04}"'): ["176 samples left\n"],
    ("docs/deployment.md", "ClientCollector(client)"): ['blobsdk_client_tier_hits_total{tier="l4"} 1.0\n'],
    ("docs/testbed.md", 'cluster.add_client_host("client-0"'): ["b'hello'\n"],
}


def _first_line(block: Block) -> str:
    return block.code.splitlines()[0]


def _env(tmp: Path) -> dict[str, str]:
    """A user's shell with the venv activated (nothing else of the test run's environment), and
    this checkout importable: the pages are held to the code beside them."""
    return {**clean_env(tmp), "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("chain", CHAINS, ids=[chain[0].where for chain in CHAINS])
def test_the_chain_of_blocks_runs_as_written(chain: list[Block], tmp_path: Path, testbed_unavailable: str | None) -> None:
    if testbed_unavailable is not None and any(block.needs_testbed for block in chain):
        pytest.skip(f"{chain[0].where} needs a testbed: {testbed_unavailable}")
    dump(chain, tmp_path / "chain.json")
    done = _run_chain(tmp_path, "work")
    if _arrow_exit_race(chain, done):
        done = _run_chain(tmp_path, "again")
    assert done.returncode == 0, f"{chain[0].where} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    # an exception in an atexit handler (a client closed there) or a finalizer is printed, and
    # the exit code stays 0
    assert "Exception ignored" not in done.stderr, f"{chain[0].where}:\n{done.stderr[-8000:]}"
    missing = [line for key in _outputs_of(chain) for line in OUTPUT[key] if line not in done.stdout]
    assert not missing, f"{chain[0].where} did not print {missing}:\n{done.stdout[-4000:]}"


def _run_chain(tmp: Path, name: str) -> subprocess.CompletedProcess[str]:
    work = tmp / name
    work.mkdir()
    return subprocess.run(
        [sys.executable, "-m", "tests.docsnippets", str(tmp / "chain.json")],
        cwd=work,
        env=_env(work),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


# pyarrow's own exit race, run once more and never passed: a parquet read through any fsspec
# filesystem (``memory://`` does it too: 1 run in 800 with 6 at once on 2 cores) can leave the
# Python file's last reference to one of pyarrow's pool threads, whose C++ destructor takes the
# GIL after finalization began: CPython ends that thread with pthread_exit, whose unwinding
# through a noexcept destructor is std::terminate (core dump: OwnedRefNoGIL::~OwnedRefNoGIL in
# PyReadableFile's destructor, under take_gil -> PyThread_exit_thread). Everything the chain
# printed was printed; docs/integrations.md says so.
_ARROW_EXIT_RACE = "terminate called without an active exception\n"


def _arrow_exit_race(chain: list[Block], done: subprocess.CompletedProcess[str]) -> bool:
    reads_parquet = any("read_parquet" in block.code or "pq.read_table" in block.code for block in chain)
    return reads_parquet and done.returncode == -signal.SIGABRT and done.stderr.endswith(_ARROW_EXIT_RACE)


def test_every_block_that_does_not_run_says_why_and_is_listed() -> None:
    skipped = {(block.page, _first_line(block)): block.not_run for page in PAGES for block in FOUND[page] if block.not_run}
    assert skipped == NOT_RUN


def _outputs_of(chain: list[Block]) -> list[tuple[str, str]]:
    return [(page, text) for page, text in OUTPUT if page == chain[0].page and text in chain[0].code]


def test_every_expected_output_names_one_chain() -> None:
    named = [key for chain in CHAINS for key in _outputs_of(chain)]
    assert sorted(named) == sorted(OUTPUT)


def test_every_page_with_code_has_its_blocks_run() -> None:
    run = {block.page for chain in CHAINS for block in chain}
    with_code = {block.page for page in PAGES for block in FOUND[page]}
    assert with_code - run <= {"docs/development.md", "docs/testing.md", "docs/dlio.md"}, with_code - run
    assert {"README.md", "docs/api.md", "docs/checkpoints.md", "docs/integrations.md", "docs/cli.md"} <= run


# --- the marker reader ----------------------------------------------------------------------------


def _page(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text))
    return blocks(page, tmp_path)


def test_markers_chain_blocks_and_say_what_does_not_run(tmp_path: Path) -> None:
    found = _page(
        tmp_path,
        """\
        ```python
        a = 1
        ```

        <!-- doc-test: not run: needs root -->
        ```sh
        useradd x
        ```

        - a list item:

          <!-- doc-test: continues -->
          ```python
          print(a)
          ```

        <!-- doc-test: background until .cluster/client.toml -->
        ```sh
        blobsdk-cluster --dir .cluster   # Ctrl-C stops it
        ```

        ```toml
        key = 1
        ```

        <!-- doc-test: needs a testbed -->
        ```python
        bed = 1
        ```

        <!-- doc-test: not run: another test runs it -->
        <!-- plugin-example: test_x.py -->
        ```python
        def test_x(): pass
        ```
        """,
    )
    assert [(b.line, b.lang, b.continues, b.not_run, b.background_until, b.needs_testbed) for b in found] == [
        (1, "python", False, None, None, False),
        (6, "sh", False, "needs root", None, False),
        (13, "python", True, None, None, False),
        (18, "sh", False, None, ".cluster/client.toml", False),
        (27, "python", False, None, None, True),
        (33, "python", False, "another test runs it", None, False),
    ]
    assert found[2].code == "print(a)\n"  # the list item's indent is gone
    assert [[b.line for b in chain] for chain in chains(found)] == [[1, 13], [18], [27]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- doc-test: contineus -->\n```python\npass\n```\n", "page.md:2: unknown doc-test item 'contineus'"),
        (
            "<!-- doc-test: continues -->\n```python\npass\n```\n",
            "page.md:2: 'continues', but no block runs before it on its page",
        ),
        ("<!-- doc-test: not run: -->\n```sh\ntrue\n```\n", "page.md:2: unknown doc-test item 'not run:'"),
        ("<!-- doc-test: not run:  -->\n```sh\ntrue\n```\n", "page.md:2: 'not run' needs its reason"),
        (
            "<!-- doc-test: continues; not run: x -->\n```sh\ntrue\n```\n",
            "page.md:2: a block that does not run takes no other item",
        ),
        (
            "<!-- doc-test: needs a testbed; not run: x -->\n```sh\ntrue\n```\n",
            "page.md:2: a block that does not run takes no other item",
        ),
        (
            "<!-- doc-test: continues -->\n```toml\na = 1\n```\n",
            "page.md:2: a doc-test marker on a ```toml block, which never runs",
        ),
        (
            "<!-- doc-test: background until f -->\n```sh\na &&\nb\n```\n",
            "page.md:2: 'background until' is for a ```sh block of one command",
        ),
        (
            "<!-- doc-test: continues -->\ntext\n\n```python\npass\n```\n",
            "page.md: a doc-test marker that is not on the line above a block's fence",
        ),
    ],
)
def test_a_marker_it_cannot_apply_is_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(MarkerError) as raised:
        chains(_page(tmp_path, text))
    assert str(raised.value) == message


def test_commands_are_one_per_line_with_continuations_joined() -> None:
    assert commands("a b  # c\n\n# d\ne \\\n  f\n") == [["a", "b"], ["e", "f"]]


def test_only_pyarrows_exit_race_on_a_chain_that_reads_parquet_runs_again() -> None:
    parquet = [Block(page="p.md", line=1, lang="python", code='pd.read_parquet("blob://b/t.parquet")')]
    other = [Block(page="p.md", line=1, lang="python", code="print(1)")]
    race = subprocess.CompletedProcess(args=[], returncode=-signal.SIGABRT, stdout="True\n", stderr=_ARROW_EXIT_RACE)
    assert _arrow_exit_race(parquet, race)
    assert not _arrow_exit_race(other, race)
    for returncode, stderr in (
        (-signal.SIGABRT, "free(): invalid pointer\n"),
        (-signal.SIGSEGV, _ARROW_EXIT_RACE),
        (1, _ARROW_EXIT_RACE),
    ):
        assert not _arrow_exit_race(
            parquet, subprocess.CompletedProcess(args=[], returncode=returncode, stdout="", stderr=stderr)
        )
