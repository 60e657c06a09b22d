"""The code blocks of README.md and docs/*.md, and how they run as a reader runs them.

Every ```python and ```sh block runs unless a marker says why not.  A marker is an HTML
comment above the block's fence, with at most other such comments between (GitHub shows none):

    <!-- doc-test: ITEM; ITEM -->

with these items:

- ``continues``: the block goes on from the run block before it on the same page: the same
  Python names, the same working directory, the same background commands.  A block without
  it starts afresh, in an empty directory of its own.
- ``background until PATH``: a ```sh block of one command that serves until stopped (a local
  cluster): it runs in the background until PATH exists, the blocks that continue it run, and
  then it gets SIGINT (Ctrl-C) and must exit 0.
- ``not run: REASON``: the block does not run; the reason is kept, and tests/project/test_doc_snippets.py
  lists every such block, so none is skipped silently.
- ``needs a testbed``: the block makes network namespaces (servers/testbed.py: root and
  iproute2); its chain runs where a testbed can be made and is skipped, saying why, elsewhere,
  as the suite's testbed tests are.

Python blocks run in one process per chain, as written; a block with a top-level ``await``
runs on the chain's event loop, as in ``python -m asyncio``.  Shell blocks run under ``bash
-e -o pipefail`` with the environment's ``blobsdk`` commands on ``PATH``.  The chain's process
imports blobsdk from this checkout (PYTHONPATH), so the pages are held to the code beside them.

Run as ``python -m tests.docsnippets CHAIN.json`` (what tests/project/test_doc_snippets.py does), it
runs one chain in the current directory.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RUN = ("python", "sh")  # the languages whose blocks run
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"<!-- doc-test: ([^\n]*?) -->\s*(?:<!--[^\n]*-->\s*)*\Z")  # other comments may follow
BACKGROUND_TIMEOUT = 180.0  # a local cluster's servers answer within their 120 s startup timeout
STOP_TIMEOUT = 60.0
SH_TIMEOUT = 300.0


class MarkerError(ValueError):
    """A marker this module cannot read, or one on a block it does not apply to."""


@dataclass(frozen=True, kw_only=True)
class Block:
    page: str  # relative to the repository's root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    continues: bool = False
    background_until: str | None = None
    not_run: str | None = None
    needs_testbed: bool = False

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path, root: Path) -> list[Block]:
    """Every fenced ```python and ```sh block of ``page``, with its marker read."""
    text = page.read_text()
    out, previous_end, marked = [], 0, 0
    for match in _FENCE.finditer(text):
        indent, lang, body = match.groups()
        before = text[previous_end : match.start()]
        previous_end = match.end()
        marker = _MARKER.search(before)
        marked += marker is not None
        line = text.count("\n", 0, match.start()) + 1
        where = f"{page.relative_to(root)}:{line}"
        if lang not in RUN:
            if marker:
                raise MarkerError(f"{where}: a doc-test marker on a ```{lang} block, which never runs")
            continue
        code = textwrap.dedent("".join(row.removeprefix(indent) for row in body.splitlines(True)))
        out.append(Block(page=str(page.relative_to(root)), line=line, lang=lang, code=code, **_items(marker, where)))
    if marked != text.count("<!-- doc-test:"):
        raise MarkerError(f"{page.relative_to(root)}: a doc-test marker that is not on the line above a block's fence")
    for block in out:
        _check(block)
    return out


def _items(marker: re.Match[str] | None, where: str) -> dict[str, object]:
    fields: dict[str, object] = {}
    text = marker.group(1) if marker else ""
    if text.startswith("not run: "):  # the reason runs to the marker's end, "; " and all
        text, fields["not_run"] = "", text.removeprefix("not run: ").strip()
    for item in text.split("; ") if text else []:
        if item == "continues":
            fields["continues"] = True
        elif item == "needs a testbed":
            fields["needs_testbed"] = True
        elif item.startswith("background until "):
            fields["background_until"] = item.removeprefix("background until ").strip()
        elif item.startswith("not run: "):
            fields["not_run"] = item.removeprefix("not run: ").strip()
        else:
            raise MarkerError(f"{where}: unknown doc-test item {item!r}")
    if fields.get("not_run") == "":
        raise MarkerError(f"{where}: 'not run' needs its reason")
    return fields


def _check(block: Block) -> None:
    if block.not_run is not None and (block.continues or block.background_until or block.needs_testbed):
        raise MarkerError(f"{block.where}: a block that does not run takes no other item")
    if block.background_until is not None and (block.lang != "sh" or len(commands(block.code)) != 1):
        raise MarkerError(f"{block.where}: 'background until' is for a ```sh block of one command")


def commands(code: str) -> list[list[str]]:
    """The commands of a shell block, one per line (comments and blank lines left out)."""
    joined = code.replace("\\\n", " ")
    return [argv for argv in (shlex.split(line, comments=True) for line in joined.splitlines()) if argv]


def chains(found: list[Block]) -> list[list[Block]]:
    """The run blocks, cut into chains: a block that ``continues`` joins the chain before it."""
    out: list[list[Block]] = []
    for block in found:
        if block.not_run is not None:
            continue
        if block.continues:
            if not out:
                raise MarkerError(f"{block.where}: 'continues', but no block runs before it on its page")
            out[-1].append(block)
        else:
            out.append([block])
    return out


# --- the child process: one chain, in its working directory --------------------------------------


class BlockFailed(Exception):
    pass


class Chain:
    def __init__(self) -> None:
        self.names: dict[str, object] = {"__name__": "__main__"}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.background: list[tuple[Block, subprocess.Popen[bytes]]] = []

    def run(self, block: Block) -> None:
        print(f"--- doc-test {block.where} ({block.lang})", file=sys.stderr, flush=True)
        if block.lang == "python":
            self._python(block)
        elif block.background_until is not None:
            self._start(block)
        else:
            self._sh(block)

    def _python(self, block: Block) -> None:
        source = "\n" * block.line + block.code  # tracebacks give the page's line numbers
        code = compile(source, block.page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if code.co_flags & inspect.CO_COROUTINE:
            self.loop = self.loop or asyncio.new_event_loop()
            self.loop.run_until_complete(eval(code, self.names))
        else:
            exec(code, self.names)

    def _sh(self, block: Block) -> None:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], timeout=SH_TIMEOUT, check=False)
        if done.returncode != 0:
            raise BlockFailed(f"{block.where}: the shell block exited {done.returncode}")

    def _start(self, block: Block) -> None:
        (argv,) = commands(block.code)
        proc = subprocess.Popen(argv)
        self.background.append((block, proc))
        until = Path(str(block.background_until))
        deadline = time.monotonic() + BACKGROUND_TIMEOUT
        while not until.exists():
            if proc.poll() is not None:
                raise BlockFailed(f"{block.where}: {argv[0]} exited {proc.returncode} before {until} existed")
            if time.monotonic() > deadline:
                raise BlockFailed(f"{block.where}: no {until} after {BACKGROUND_TIMEOUT:.0f} s")
            time.sleep(0.05)  # polls a file another process writes; the deadline bounds it

    def close(self) -> list[str]:
        """Stop the background commands (Ctrl-C) and the event loop; what went wrong."""
        problems = []
        for block, proc in reversed(self.background):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                problems.append(f"{block.where}: exited {code} on Ctrl-C")
        if self.loop is not None:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
        return problems


def main(path: str) -> int:
    chain, problems = Chain(), []
    try:
        for fields in json.loads(Path(path).read_text()):
            chain.run(Block(**fields))
    except BlockFailed as failed:
        problems.append(str(failed))
    finally:
        problems += chain.close()
    for problem in problems:
        print(f"doc-test: {problem}", file=sys.stderr)
    return 1 if problems else 0


def dump(chain: list[Block], path: Path) -> None:
    path.write_text(json.dumps([asdict(block) for block in chain]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
