"""The import graph of blobsdk/, servers/ and benchmarks/ has no cycle, and blobsdk/ never
imports servers/.

Every ``import`` statement counts, also one inside a function: a lazy import only hides a
cycle from the import machinery, the two modules still cannot be understood, tested or
changed one without the other.  Imports under ``if TYPE_CHECKING:`` are left out of the
cycle check: they never run, and naming a type of a module that depends on this one is
how two layers describe each other without depending on each other at run time.  The
layering check (blobsdk never imports servers) counts them too: the SDK must not even
name a server type.

An edge goes to the module an import names: ``from pkg import mod`` is an edge to
``pkg.mod`` when that is a module, else to ``pkg``; relative imports are resolved.  The
parent packages Python also runs on the way (``pkg/__init__.py``) are not edges: they are
already in ``sys.modules`` by the time their submodules import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

PACKAGES = ("blobsdk", "servers", "benchmarks")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # file:line of the import
    typing_only: bool


def module_names(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted name -> file for every module under the ``packages`` directories of ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_edges(root: Path, packages: Iterable[str] = PACKAGES) -> list[Edge]:
    """Every import from one of these modules to another."""
    modules = module_names(root, packages)
    edges: list[Edge] = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, typing_only in _imports(tree):
            for target in _targets(node, name, is_package, modules):
                where = f"{path.relative_to(root)}:{node.lineno}"
                edges.append(Edge(name, target, where, typing_only))
    return edges


def _imports(tree: ast.AST, typing_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, typing_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(ast.Module(body=node.body, type_ignores=[]), True)
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]), typing_only)
        else:
            yield from _imports(node, typing_only)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    base = _absolute(node, module, is_package)
    targets = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}" if base else alias.name
        if submodule in modules:
            targets.append(submodule)
        elif base in modules:
            targets.append(base)
    return targets


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def find_cycles(edges: Iterable[Edge]) -> list[list[Edge]]:
    """One cycle (as the edges that close it) per strongly connected component that has one."""
    graph: dict[str, dict[str, Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    return [_cycle_in(component, graph) for component in _components(graph) if _is_cyclic(component, graph)]


def _components(graph: dict[str, dict[str, Edge]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, {})))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
    return components


def _is_cyclic(component: set[str], graph: dict[str, dict[str, Edge]]) -> bool:
    if len(component) > 1:
        return True
    (only,) = component
    return only in graph.get(only, {})  # a module that imports itself


def _cycle_in(component: set[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target, edge in sorted(graph.get(node, {}).items()):
                if target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, parent[path[0].source])
                    return path
                if target in component and target not in parent:
                    parent[target] = edge
                    nxt.append(target)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a cyclic component always has one


def describe(cycle: list[Edge]) -> str:
    return " -> ".join([cycle[0].source, *(f"{e.target} ({e.where})" for e in cycle)])


def arrows_up(edges: Iterable[Edge], module: str, allowed: Iterable[str]) -> list[str]:
    """The modules ``module`` reaches (directly or through others, typing-only imports
    included) that are not in ``allowed``, each with the import path that reaches it."""
    graph: dict[str, list[Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    path_to: dict[str, list[Edge]] = {module: []}
    frontier = [module]
    while frontier:
        node = frontier.pop(0)
        for edge in graph.get(node, []):
            if edge.target not in path_to:
                path_to[edge.target] = [*path_to[node], edge]
                frontier.append(edge.target)
    wrong = sorted(set(path_to) - {module, *allowed})
    return [describe(path_to[target]) for target in wrong]


# --- the checks on this repository --------------------------------------------------------


def test_every_package_is_seen():
    names = module_names(ROOT)
    assert {"blobsdk.client", "blobsdk.cache.base", "servers._common.http", "benchmarks.put_get"} <= names.keys()
    assert len(import_edges(ROOT)) > 100  # the parser did find the imports


def test_no_import_cycles():
    cycles = find_cycles(e for e in import_edges(ROOT) if not e.typing_only)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c) for c in cycles)


# The ground floor: modules that everything may import, and that import only these leaves
# (with what those leaves import).  Config structs live in blobsdk.config, not beside the
# behaviour they configure; the hedged attempt a block store marks, and the demand it carries,
# live in leaves of their own.
LEAVES = {
    "blobsdk._arguments",
    "blobsdk._numbers",
    "blobsdk._redisurl",
    "blobsdk._settings",
    "blobsdk.errors",
    "blobsdk.chunks.ids",
    "blobsdk.wire",
}
GROUND_FLOOR = {
    "blobsdk.config": LEAVES,
    "blobsdk.chunks.demand": set(),
    "blobsdk.chunks.attempt": {"blobsdk.chunks.demand"},
    "blobsdk.sources.base": LEAVES | {"blobsdk.chunks.attempt", "blobsdk.chunks.demand"},
}


def test_the_ground_floor_imports_only_leaves():
    edges = import_edges(ROOT)
    for module, allowed in GROUND_FLOOR.items():
        wrong = arrows_up(edges, module, allowed)
        assert not wrong, f"{module} imports upward:\n" + "\n".join(wrong)


def test_blobsdk_never_imports_servers_or_benchmarks():
    wrong = [e for e in import_edges(ROOT) if e.source.split(".")[0] == "blobsdk" and e.target.split(".")[0] != "blobsdk"]
    assert not wrong, "blobsdk imports: " + ", ".join(f"{e.target} ({e.where})" for e in wrong)


# What servers/ may use of blobsdk: the wire types and limits, the errors, auth, config, the
# storage protocols and their backends, the serving and data-path helpers a server shares with
# the client, and the command-line parser of every command.  docs/architecture.md lists the
# same modules; a server that needs another one makes it public there first, so a change to
# the SDK's internals never breaks a server.
SERVER_IMPORTS = {
    "blobsdk",
    "blobsdk._extras",
    "blobsdk.auth",
    "blobsdk.cache.base",
    "blobsdk.cache.disk",
    "blobsdk.cli.parser",
    "blobsdk.config",
    "blobsdk.errors",
    "blobsdk.metadata.base",
    "blobsdk.metadata.redis",
    "blobsdk.metadata.sqlite",
    "blobsdk.net.rpc",
    "blobsdk.net.serving",
    "blobsdk.paths",
    "blobsdk.chunks.codec",
    "blobsdk.chunks.ids",
    "blobsdk.runtime.singleflight",
    "blobsdk.sources.base",
    "blobsdk.sources.http",
    "blobsdk.sources.local",
    "blobsdk.sources.replicated",
    "blobsdk.sources.s3",
    "blobsdk.tail.limiter",
    "blobsdk.tiers.l4",
    "blobsdk.wire",
}


def test_servers_import_only_the_modules_made_for_them():
    used = {e.target for e in import_edges(ROOT) if e.source.split(".")[0] == "servers" and e.target.split(".")[0] == "blobsdk"}
    assert used <= SERVER_IMPORTS, "servers import blobsdk modules not made for them: " + ", ".join(sorted(used - SERVER_IMPORTS))


def server_imports() -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement in servers/, with its file:line."""
    for path in sorted((ROOT / "servers").rglob("*.py")):
        for node, _ in _imports(ast.parse(path.read_text(), filename=str(path))):
            yield node, f"{path.relative_to(ROOT)}:{node.lineno}"


def test_servers_import_no_private_name_of_blobsdk():
    private = [
        f"{node.module}.{a.name} ({where})"
        for node, where in server_imports()
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("blobsdk")
        for a in node.names
        if a.name.startswith("_")
    ]
    assert not private, "servers import private names: " + ", ".join(private)


# --- the checker itself can fail ------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_lazy_import_through_a_package_closes_a_cycle(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli.py": "def run():\n    from .demo import go\n",
            "pkg/demo.py": "from pkg import cli\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/a.py": "from .. import cli\nimport pkg.sub.b\n",
            "pkg/sub/b.py": "from ..sub import a\n",
        },
    )
    cycles = find_cycles(import_edges(root, ["pkg"]))
    assert sorted(describe(c) for c in cycles) == [
        "pkg.cli -> pkg.demo (pkg/cli.py:2) -> pkg.cli (pkg/demo.py:1)",
        "pkg.sub.a -> pkg.sub.b (pkg/sub/a.py:2) -> pkg.sub.a (pkg/sub/b.py:1)",
    ]


def test_an_arrow_up_from_the_ground_floor_is_found_through_a_leaf(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/config.py": "from . import errors\n",
            "pkg/errors.py": "import typing\nif typing.TYPE_CHECKING:\n    from .tail.hedge import Hedger\n",
            "pkg/tail/__init__.py": "",
            "pkg/tail/hedge.py": "from ..config import X\n",
        },
    )
    edges = import_edges(root, ["pkg"])
    assert arrows_up(edges, "pkg.config", {"pkg.errors"}) == [
        "pkg.config -> pkg.errors (pkg/config.py:1) -> pkg.tail.hedge (pkg/errors.py:3)",
    ]
    assert arrows_up(edges, "pkg.config", {"pkg.errors", "pkg.tail.hedge"}) == []


def test_type_checking_imports_are_typing_only(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import typing\nfrom . import b\n",
            "pkg/b.py": "if typing.TYPE_CHECKING:\n    from .a import X\nelse:\n    import pkg.c\n",
            "pkg/c.py": "",
        },
    )
    edges = import_edges(root, ["pkg"])
    assert {(e.source, e.target, e.typing_only) for e in edges} == {
        ("pkg.a", "pkg.b", False),
        ("pkg.b", "pkg.a", True),
        ("pkg.b", "pkg.c", False),
    }
    assert find_cycles(e for e in edges if not e.typing_only) == []
    assert len(find_cycles(edges)) == 1


def test_servers_import_each_other_relatively():
    """So the same files run as ``servers.X`` in a checkout and as ``blobsdk_servers.X``
    installed (pyproject.toml maps the one onto the other)."""
    between = [e for e in import_edges(ROOT) if e.source.split(".")[0] == e.target.split(".")[0] == "servers"]
    absolute = []
    for node, where in server_imports():
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if isinstance(node, ast.Import) or node.level == 0:
            absolute += [where for n in names if n.split(".")[0] == "servers"]
    assert between, "the servers import each other: the check must see those imports"
    assert not absolute, "absolute imports of servers inside servers/: " + ", ".join(absolute)
