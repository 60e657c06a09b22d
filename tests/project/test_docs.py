"""The user docs cannot drift from the code: docs/configuration.md names every client.toml key
(walked from :class:`blobsdk.ClientConfig`'s annotations, whatever module a table's struct
lives in) with its type and default, and every environment variable the code reads; every
module path, dotted ``blobsdk.`` name, test name and relative link in README.md and docs/*.md
exists; the README stays a front door (its order, at most 400 lines, the two make commands and a
first get on its first screen, a link to every page of docs/) and names no internal issue.
tests/project/test_doc_snippets.py runs their code blocks."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
import typing
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest

from blobsdk import ClientConfig
from blobsdk.errors import MissingExtra
from tests.helpers import ROOT, Tenancy, server_process

DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
CONFIG_DOC = ROOT / "docs" / "configuration.md"
TOP = "Top-level keys"


def _page_ids() -> list[str]:
    return [str(page.relative_to(ROOT)) for page in PAGES]


# --- docs/configuration.md against the config structs -----------------------------------------


def render_type(tp: Any) -> str:
    """A field's type as the doc's "type" column writes it."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(render_type(arg) for arg in args if arg is not type(None))
    if origin is typing.Literal:
        return " or ".join(f'`"{arg}"`' for arg in args)
    if origin is tuple and args[1:] == (Ellipsis,):
        return f"list of {render_type(args[0])}s"
    names = {int: "integer", float: "number", bool: "boolean", str: "string"}
    if tp not in names:
        raise AssertionError(f"tests/project/test_docs.py cannot render the type {tp!r}: teach render_type")
    return names[tp]


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return repr(value)


def render_default(value: object) -> str:
    """A field's default as the doc's "default" column begins: ``required``, ``unset`` or the
    TOML value in backticks."""
    if value is msgspec.NODEFAULT:
        return "required"
    return "unset" if value is None else f"`{_toml(value)}`"


def _table_struct(tp: Any) -> type[msgspec.Struct] | None:
    """The struct of a ``client.toml`` table field (``X`` or ``X | None``), else None."""
    candidates = [arg for arg in typing.get_args(tp) if arg is not type(None)] or [tp]
    first = candidates[0]
    return first if isinstance(first, type) and issubclass(first, msgspec.Struct) else None


def _fields(struct: type[msgspec.Struct]) -> dict[str, tuple[str, str]]:
    out = {}
    for field in msgspec.structs.fields(struct):
        default = field.default if field.default_factory is msgspec.NODEFAULT else field.default_factory()
        out[field.name] = (render_type(field.type), render_default(default))
    return out


def config_keys() -> dict[str, dict[str, tuple[str, str]]]:
    """Section -> key -> (type, default) of every setting, walked from ClientConfig."""
    top: dict[str, tuple[str, str]] = {}
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for field in msgspec.structs.fields(ClientConfig):
        struct = _table_struct(field.type)
        if struct is None:
            top[field.name] = (render_type(field.type), render_default(field.default))
        else:
            tables[f"`[{field.name}]`"] = _fields(struct)
    return {TOP: top, **tables}


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row (``\\|`` is a literal bar)."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip().replace("\\|", "|") for cell in cells]


def doc_tables(path: Path) -> dict[str, dict[str, list[str]]]:
    """Section (a ``## `` heading) -> first cell's code span -> the row's other cells."""
    sections: dict[str, dict[str, list[str]]] = {}
    rows: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            rows = sections.setdefault(line[3:].strip(), {})
        elif line.startswith("| `"):
            first, *rest = _cells(line)
            rows[first.strip("`")] = rest
    return sections


def _default_cell(cell: str) -> str:
    """What a default cell begins with: a code span, or its first word."""
    match = re.match(r"`[^`]*`", cell)
    return match.group(0) if match else cell.split(" ")[0]


def test_every_config_key_is_documented_with_its_type_and_default():
    documented = doc_tables(CONFIG_DOC)
    problems = []
    for section, keys in config_keys().items():
        rows = documented.get(section)
        if rows is None:
            problems.append(f"no section '## {section}'")
            continue
        for key, (type_, default) in keys.items():
            if key not in rows:
                problems.append(f"{section}: {key} is not documented")
                continue
            doc_type, doc_default, meaning = rows[key]
            if doc_type != type_:
                problems.append(f"{section}: {key} is documented as {doc_type!r}, its type is {type_!r}")
            if _default_cell(doc_default) != default:
                problems.append(f"{section}: {key} is documented with default {doc_default!r}, it is {default}")
            if not meaning:
                problems.append(f"{section}: {key} has no meaning")
        problems += [f"{section}: {key} is documented but is no setting" for key in rows.keys() - keys.keys()]
    assert not problems, "docs/configuration.md is out of date:\n" + "\n".join(problems)


def test_the_doc_has_no_table_of_a_setting_that_is_gone():
    gone = {section for section in doc_tables(CONFIG_DOC) if section.startswith("`[")} - config_keys().keys()
    assert not gone, f"docs/configuration.md documents tables that are gone: {gone}"


def test_render_type_and_default_write_what_the_doc_reads():
    """The two renderings the comparison rests on, checked on types of every shape."""
    assert [render_type(t) for t in (int, float | None, tuple[str, ...], typing.Literal["a", "b"])] == [
        "integer",
        "number",
        "list of strings",
        '`"a"` or `"b"`',
    ]
    assert render_type(int | typing.Literal["all"] | None) == 'integer or `"all"`'
    assert [render_default(v) for v in (msgspec.NODEFAULT, None, 5.0, True, ("x", "y"))] == [
        "required",
        "unset",
        "`5.0`",
        "`true`",
        '`["x", "y"]`',
    ]
    assert _default_cell("`1073741824` (1 GiB)") == "`1073741824`" and _default_cell("unset") == "unset"
    with pytest.raises(AssertionError, match="cannot render the type <class 'bytes'>"):
        render_type(bytes)


_READS = re.compile(r"""(?:environ|env)(?:\.get\(|\[)\s*["']([A-Z][A-Z0-9_]+)["']""")
_OURS = re.compile(r"""["'](BLOBSDK_[A-Z0-9_]+)["']""")


def environment_variables() -> set[str]:
    """Every variable blobsdk reads from the environment, and every ``BLOBSDK_`` name the
    servers use."""
    names: set[str] = set()
    for path in (ROOT / "blobsdk").rglob("*.py"):
        text = path.read_text()
        names |= set(_READS.findall(text)) | set(_OURS.findall(text))
    for path in (ROOT / "servers").rglob("*.py"):
        names |= set(_OURS.findall(path.read_text()))
    return names


def test_every_environment_variable_is_documented():
    documented = set(doc_tables(CONFIG_DOC)["Environment variables"])
    read = environment_variables()
    assert {"BLOBSDK_CONFIG", "BLOBSDK_API_URL", "BLOBSDK_BLOCK_URLS", "BLOBSDK_TOKEN", "BLOBSDK_FAULTS"} <= read
    assert not read - documented, f"read by the code, missing from docs/configuration.md: {sorted(read - documented)}"
    assert not documented - read, f"in docs/configuration.md, read nowhere: {sorted(documented - read)}"


def test_every_client_toml_shown_is_a_valid_config():
    """Each ```toml block of README.md and docs/ (a client.toml) builds a ClientConfig as written."""
    blocks = [block for page in PAGES for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.DOTALL)]
    assert len(blocks) >= 3
    for block in blocks:
        ClientConfig.from_dict(tomllib.loads(block))


# --- names and paths in README.md and docs/ -----------------------------------------------------

_PATH = re.compile(r"(?<![\w/.-])((?:blobsdk|servers|tests|benchmarks|examples|deploy|docs)/[\w./-]*\w)")
_DOTTED = re.compile(r"(?<![\w/.-])(blobsdk(?:\.[A-Za-z_]\w*)+)")
_TEST_FILE = re.compile(r"(?<![\w/.-])((?:tests|blobsdk/testing)/[\w/]+\.py)")  # the shipped suites hold tests too
_TEST_NAME = re.compile(r"::([\w*]+)")
_FILE_SUFFIXES = (".json", ".toml", ".md", ".py", ".png", ".log")  # blobsdk.json is a file, not a name
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def resolves(dotted: str) -> bool:
    """Whether ``blobsdk.a.b.C`` names a module, or an attribute of the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        except MissingExtra:  # blobsdk.dlio imports only inside DLIO's venv: its top-level names, from its source
            source = (ROOT / Path(*parts[:cut])).with_suffix(".py")
            if not source.is_file():
                continue
            return len(parts) == cut or (len(parts) == cut + 1 and parts[cut] in _top_level_names(source))
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)}


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_resolves_tells_names_that_exist_from_names_that_do_not():
    assert resolves("blobsdk.tail.hedge") and resolves("blobsdk.Client.local") and resolves("blobsdk.__version__")
    assert not resolves("blobsdk.hedge") and not resolves("blobsdk.Client.no_such_method")
    if importlib.util.find_spec("dlio_benchmark") is None:  # DLIO's plugins, named without importing DLIO
        assert resolves("blobsdk.dlio.BlobReader") and not resolves("blobsdk.dlio.NoSuchReader")


@pytest.mark.parametrize("page", PAGES, ids=_page_ids())
def test_every_path_named_exists(page: Path):
    text = page.read_text()
    missing = sorted({p for p in _PATH.findall(text) if not (ROOT / p).exists()})
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_page_ids())
def test_every_dotted_blobsdk_name_exists(page: Path):
    names = {name for name in _DOTTED.findall(page.read_text()) if not name.endswith(_FILE_SUFFIXES)}
    missing = sorted(name for name in names if not resolves(name))
    assert not missing, f"{page.name} names what blobsdk does not have: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_page_ids())
def test_every_test_named_exists(page: Path):
    """``tests/x.py::name`` (a glob), and ``::name`` after it on the same line, name a test of x.py."""
    missing = []
    for line in page.read_text().splitlines():
        current: Path | None = None
        for match in re.finditer(f"{_TEST_FILE.pattern}|{_TEST_NAME.pattern}", line):
            if match.group(1):
                current = ROOT / match.group(1)
            elif current is not None and current.is_file():
                pattern = match.group(2)
                if not fnmatch.filter(_test_names(current), pattern):
                    missing.append(f"{current.relative_to(ROOT)}::{pattern}")
    assert not missing, f"{page.name} names tests that do not exist: {missing}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=_page_ids())
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file) if file else page
        if not path.exists() or (anchor and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, f"{page.name} has broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_page_ids())
def test_no_internal_issue_numbers(page: Path):
    found = re.findall(r"(?i)\bissues? \d+|(?<![&\w])#\d+\b", page.read_text())
    assert not found, f"{page.name} refers to internal issues: {found}"


# --- docs/trust.md: the threat model -----------------------------------------------------------

TRUST = ROOT / "docs" / "trust.md"
# Every input another party can write (DESIGN's trust boundaries): each has its section.
UNTRUSTED = (
    "The bucket's namespace",
    "The metadata store's answers",
    "Shared L2 directories and their index files",
    "Peers and trackers",
    "L3 nodes",
    "Block servers",
    "The S3 endpoint",
    "The client's own buffers",
    "A saved loader or checkpoint state",
    "A TOML file",
    "DLIO's data folder and settings",
)


def _trust_rows() -> list[list[str]]:
    """The cells of every row of the page's tables (header and rule rows left out)."""
    lines = [line for line in TRUST.read_text().splitlines() if line.startswith("| ") and not line.startswith("| input |")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]] for line in lines]


def test_the_threat_model_has_a_section_for_every_untrusted_input():
    sections = re.findall(r"^## (.+)$", TRUST.read_text(), re.MULTILINE)
    missing = [name for name in UNTRUSTED if not any(section.startswith(name) for section in sections)]
    assert not missing, f"docs/trust.md has no section for {missing}"


def test_every_row_of_the_threat_model_says_what_is_checked_what_a_failure_does_and_its_test():
    rows = _trust_rows()
    assert len(rows) >= 30, len(rows)
    for cells in rows:
        assert len(cells) == 4 and all(cells), f"docs/trust.md: a row needs input, check, failure and test: {cells}"
        assert "`tests/" in cells[3], f"docs/trust.md: the row on {cells[0]!r} names no test"


# --- docs/deployment.md: the systemd units ------------------------------------------------------

DEPLOYMENT = ROOT / "docs" / "deployment.md"
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
_UNIT = re.compile(r"`/etc/systemd/system/([\w-]+\.service)`.*?```ini\n(.*?)```", re.DOTALL)


def units() -> dict[str, str]:
    """File name -> text of every systemd unit in docs/deployment.md."""
    found = dict(_UNIT.findall(DEPLOYMENT.read_text()))
    assert set(found) == {f"blobsdk-{s}.service" for s in ("api", "blockstore", "flash", "tracker")}, sorted(found)
    return found


def exec_start(unit: str) -> list[str]:
    (line,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def _as_in_a_test(argv: list[str], tmp: Path, keys: Path) -> tuple[str, list[str]]:
    """(module, args) of a unit's command line, with the test's paths, keyring and token, and
    no --host or --port (server_process binds a free loopback port)."""
    script, *args = argv
    assert script.startswith("/opt/blobsdk/venv/bin/"), argv
    target = SCRIPTS[script.removeprefix("/opt/blobsdk/venv/bin/")]  # KeyError: not a command the install gives
    module = target.split(":")[0]
    out: list[str] = []
    pairs = iter(args)
    for arg in pairs:
        if arg in ("--host", "--port"):
            next(pairs)
            continue
        arg = arg.replace("/var/lib/blobsdk", str(tmp / "lib")).replace("/var/cache/blobsdk", str(tmp / "cache"))
        arg = arg.replace("/etc/blobsdk/keys.toml", str(keys))
        out.append(re.sub(r"\$\{\w+\}", "a-token", arg))
    return module, out


@pytest.mark.parametrize("name", sorted(units()))
def test_the_systemd_units_start_their_servers(name: str, tmp_path: Path):
    argv = exec_start(units()[name])
    assert "--host" in argv and "--port" in argv, "a deployed server listens on a fixed port of the host"
    (tmp_path / "lib").mkdir()
    (tmp_path / "cache").mkdir()
    keys = Tenancy().write_keys(tmp_path / "keys.toml")
    module, args = _as_in_a_test(argv, tmp_path, keys)
    with server_process(module, *args, tmp=tmp_path) as (url, proc):
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as answer:
            assert answer.status == 200
        proc.terminate()  # what systemd's stop sends
        assert proc.wait(timeout=30) == 0


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_units_verify(tmp_path: Path):
    paths = []
    for name, text in units().items():
        path = tmp_path / name
        path.write_text(text.replace("/opt/blobsdk/venv/bin/", f"{Path(sys.executable).parent}/"))
        paths.append(str(path))
    result = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# --- the README: a user's front door -------------------------------------------------------------

README = ROOT / "README.md"
FRONT_DOOR = [
    "What it is",
    "Install",
    "Quick start",
    "A tour of the integrations",
    "How fast, measured against whom",
    "Extras",
    "Read on",
    "Contributing",
]
MAX_README_LINES = 400  # what it is, how to install it, one screen of quick start, where to read on


def test_the_readme_is_ordered_for_a_user():
    headings = [line[3:] for line in README.read_text().splitlines() if line.startswith("## ")]
    assert headings == FRONT_DOOR


def test_the_readme_is_a_front_door_not_the_manual():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: the manual goes in docs/"


def test_the_readme_gives_the_two_commands_and_a_first_get_on_its_first_screen():
    lines = README.read_text().splitlines()
    first = {
        what: next(i for i, line in enumerate(lines) if line.startswith(what))
        for what in ("pip install", "make demo", "make test")
    }
    first[".get("] = next(i for i, line in enumerate(lines) if ".get(" in line)
    assert first["pip install"] < first["make demo"] < first["make test"] < first[".get("] < 70, first
    said = " ".join(lines[first["make test"] : first["make test"] + 4])
    assert "apt-get" in said and "root" in said, f"make test installs with apt-get, so it needs root: {said}"


def test_the_readme_links_every_page_of_the_docs():
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README.read_text()))
    assert linked == {page.name for page in DOCS}, sorted({page.name for page in DOCS} ^ linked)
