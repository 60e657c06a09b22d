"""The import graph of blobsdk/, servers/ and benchmarks/: blobsdk's modules in layers that
import only down (the table ``LAYERS``), no cycle anywhere, and blobsdk never importing servers/.

Every ``import`` statement counts, also one inside a function: a lazy import only hides a
cycle from the import machinery, the two modules still cannot be understood, tested or
changed one without the other.  Imports under ``if TYPE_CHECKING:`` count too: they never
run, but a module that names a type of one above it cannot be read without it.  Two layers
describe each other by a protocol in the lower one, which the upper one satisfies.

An edge goes to the module an import names: ``from pkg import mod`` is an edge to
``pkg.mod`` when that is a module, else to ``pkg``; relative imports are resolved.  The
parent packages Python also runs on the way (``pkg/__init__.py``) are not edges: they are
already in ``sys.modules`` by the time their submodules import anything.
"""

from __future__ import annotations

import ast
import importlib
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


# --- the checks on this repository --------------------------------------------------------


def test_every_package_is_seen():
    names = module_names(ROOT)
    assert {"blobsdk.client", "blobsdk.cache.base", "servers._common.http", "benchmarks.put_get"} <= names.keys()
    assert len(import_edges(ROOT)) > 100  # the parser did find the imports


# The layer table: the law of blobsdk's import graph (docs/architecture.md draws it).  Every
# module is in one layer, named by itself or by its package (the longest name that matches
# wins; ``blobsdk`` alone names only the package face), and every import, typing-only ones
# included, points to its own layer or one below.  A module in no layer fails: a new module
# takes its place here when it is written.
LAYERS: dict[int, tuple[str, ...]] = {
    # the floor: the exception tree, the rules of numbers, arguments and ids
    0: (
        "blobsdk.errors",
        "blobsdk._numbers",
        "blobsdk._arguments",
        "blobsdk._redisurl",
        "blobsdk._version",
        "blobsdk._extras",
        "blobsdk._lazy",
        "blobsdk.chunks.names",
    ),
    # what travels: the wire structs and the rules of a plan, the base of every config struct
    1: ("blobsdk.wire", "blobsdk._settings"),
    # every table of client.toml, the structs of the modules with behaviour too
    2: ("blobsdk.config",),
    # the ground package: the chunk model and the contracts of one call (its name rules, in layer 0)
    3: ("blobsdk.chunks",),
    # process plumbing, keys and tokens, counters
    4: ("blobsdk.runtime", "blobsdk.auth", "blobsdk.stats"),
    # the cache engines
    5: ("blobsdk.cache",),
    # the HTTP data path, and each server's concurrency limit
    6: ("blobsdk.net",),
    # the block stores: each one copy of L4, which no hedger or health rule reaches into
    7: ("blobsdk.sources",),
    # tail control over candidates, and the replicated read engine that hedges a block store's replicas
    8: ("blobsdk.tail",),
    # the metadata stores and a peer's sharing side (they rank their servers and trackers by health)
    9: ("blobsdk.metadata", "blobsdk.peer"),
    # writes
    10: ("blobsdk.write",),
    # the tiers (they report blocks to mend; the composition root starts the repairer)
    11: ("blobsdk.tiers",),
    # operations on a whole store
    12: ("blobsdk.ops",),
    # the read path over the tiers
    13: ("blobsdk.read",),
    # the composition root
    14: ("blobsdk.assembly",),
    # the async API, and what reads it
    15: ("blobsdk.client", "blobsdk.metrics"),
    # the blocking API and the demo, made over the async one
    16: ("blobsdk.sync", "blobsdk.demo"),
    # what users import for their frameworks and their backends' tests, and the command line
    17: (
        "blobsdk.integrations",
        "blobsdk.torch",
        "blobsdk.dcp",
        "blobsdk.fsspec",
        "blobsdk.dlio",
        "blobsdk.testing",
        "blobsdk.cli",
    ),
    # the package face
    18: ("blobsdk", "blobsdk.__main__"),
}


def layer_of(module: str, layers: dict[int, tuple[str, ...]] = LAYERS) -> int | None:
    """The layer of ``module``: that of the longest name in the table that is the module or
    a package holding it (the top package's name holds nothing but itself)."""
    best: tuple[int, int] | None = None
    for layer, names in layers.items():
        for name in names:
            holds = module == name or ("." in name and module.startswith(name + "."))
            if holds and (best is None or len(name) > best[0]):
                best = (len(name), layer)
    return None if best is None else best[1]


def unplaced(modules: Iterable[str], layers: dict[int, tuple[str, ...]] = LAYERS) -> list[str]:
    """The modules no layer names."""
    return sorted(m for m in modules if layer_of(m, layers) is None)


def upward(edges: Iterable[Edge], layers: dict[int, tuple[str, ...]] = LAYERS) -> list[str]:
    """Every import from a layer to a higher one, as ``source (layer) -> target (layer) (file:line)``."""
    wrong = []
    for e in edges:
        source, target = layer_of(e.source, layers), layer_of(e.target, layers)
        if source is not None and target is not None and target > source:
            kind = ", typing only" if e.typing_only else ""
            wrong.append(f"{e.source} ({source}) -> {e.target} ({target}) ({e.where}{kind})")
    return wrong


def test_every_module_of_blobsdk_has_a_layer():
    missing = unplaced(module_names(ROOT, ["blobsdk"]))
    assert not missing, "modules in no layer of LAYERS (tests/project/test_imports.py): " + ", ".join(missing)


def test_every_import_points_to_its_own_layer_or_below():
    wrong = upward(import_edges(ROOT, ["blobsdk"]))
    assert not wrong, "imports that point up a layer:\n" + "\n".join(wrong)


def test_no_import_cycles_typing_only_imports_included():
    cycles = find_cycles(import_edges(ROOT))
    assert not cycles, "import cycles:\n" + "\n".join(describe(c) for c in cycles)


# Python runs a package's face (its ``__init__.py``) before any module in it, and a face
# imports its modules: so two role packages whose modules import each other's, in either
# direction and by any import (a lazy one too), load each other's faces half-made, whatever
# their modules do.  Between roles the graph is a tree of faces: one loop only, documented
# (docs/architecture.md): wire checks ids with chunks/names.py, which imports only errors, and
# the chunks face loads its other modules lazily so that wire can.
ROLE_LOOPS_ALLOWED = [{"blobsdk.wire", "blobsdk.chunks"}]


def role_of(module: str) -> str:
    """The role a module belongs to: its package under blobsdk/ (``blobsdk.cache`` for
    ``blobsdk.cache.disk``), else the module itself."""
    return ".".join(module.split(".")[:2])


def role_edges(edges: Iterable[Edge]) -> list[Edge]:
    """The imports between two roles, each as an edge from role to role."""
    return [
        Edge(role_of(e.source), role_of(e.target), e.where, e.typing_only)
        for e in edges
        if role_of(e.source) != role_of(e.target)
    ]


def test_no_import_loops_between_roles():
    edges = [e for e in import_edges(ROOT, ["blobsdk"]) if {role_of(e.source), role_of(e.target)} not in ROLE_LOOPS_ALLOWED]
    loops = find_cycles(role_edges(edges))
    assert not loops, "import loops between role packages:\n" + "\n".join(describe(c) for c in loops)


# The ground package and config sit below every role, and the block store protocol, which
# third-party backends implement, names only the chunk model: what they import is named here,
# not only bounded by their layer.
GROUND = {
    "blobsdk.chunks": {"blobsdk.errors", "blobsdk.wire", "blobsdk.chunks", "blobsdk._lazy"},
    "blobsdk.sources.base": {"blobsdk.errors", "blobsdk.wire", "blobsdk.chunks"},
    "blobsdk.config": {
        "blobsdk._settings",
        "blobsdk._numbers",
        "blobsdk._arguments",
        "blobsdk._redisurl",
        "blobsdk.errors",
        "blobsdk.wire",
    },
}


def test_the_ground_imports_only_what_it_names():
    for package, allowed in GROUND.items():
        wrong = [
            f"{e.source} -> {e.target} ({e.where})"
            for e in import_edges(ROOT, ["blobsdk"])
            if (e.source == package or e.source.startswith(package + "."))
            and not any(e.target == a or e.target.startswith(a + ".") for a in allowed)
        ]
        assert not wrong, f"{package} imports beyond {sorted(allowed)}:\n" + "\n".join(wrong)


# A tier sees a block store through its protocols and reads it through the replicated read
# engine: it names no store class (no isinstance on one), and what a store's writes leave to
# mend is the composition root's to wire.  It takes the protocols from the sources face.
TIER_SOURCES = {"BlockStore", "BlockReplica", "Buffer", "Span", "SpanReader"}


def sources_named_by_tiers(root: Path) -> list[tuple[str, str, str]]:
    """Every (module, name, file:line) a module of tiers/ imports of sources/; the name is
    ``*`` for a whole module (``import blobsdk.sources.x``, ``from blobsdk.sources import x``)."""
    modules = module_names(root, ["blobsdk"])
    named = []
    for name, path in modules.items():
        if not name.startswith("blobsdk.tiers."):
            continue
        for node, _ in _imports(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(root)}:{node.lineno}"
            if isinstance(node, ast.Import):
                named += [(a.name, "*", where) for a in node.names if a.name.startswith("blobsdk.sources")]
                continue
            base = _absolute(node, name, path.name == "__init__.py")
            if base == "blobsdk.sources" or base.startswith("blobsdk.sources."):
                named += [(base, "*" if f"{base}.{a.name}" in modules else a.name, where) for a in node.names]
    return named


def test_tiers_name_no_block_store_class():
    named = sources_named_by_tiers(ROOT)
    assert named, "the tiers import the block store protocols: the check must see those imports"
    wrong = [
        f"{module}.{name} ({where})" for module, name, where in named if module != "blobsdk.sources" or name not in TIER_SOURCES
    ]
    assert not wrong, "tiers import of sources/ more than the protocols, from its face:\n" + "\n".join(wrong)


def below_tail_control(edges: Iterable[Edge]) -> list[str]:
    """The imports of tail control by the block stores or the data path, as ``source -> target (file:line)``."""
    low = ("blobsdk.sources", "blobsdk.net", "blobsdk.chunks")
    return [
        f"{e.source} -> {e.target} ({e.where})"
        for e in edges
        if e.source.startswith(low) and (e.target == "blobsdk.tail" or e.target.startswith("blobsdk.tail."))
    ]


def test_block_stores_and_the_data_path_import_nothing_of_tail_control():
    """A store is one copy of L4 and an endpoint one server: the hedger, the health rules and
    the replicated read engine compose them from above (the concurrency limit is the
    endpoint's own, in net/), so neither names tail control, not even for typing."""
    wrong = below_tail_control(import_edges(ROOT, ["blobsdk"]))
    assert not wrong, "stores or the data path import tail control:\n" + "\n".join(wrong)


def test_blobsdk_never_imports_servers_or_benchmarks():
    wrong = [e for e in import_edges(ROOT) if e.source.split(".")[0] == "blobsdk" and e.target.split(".")[0] != "blobsdk"]
    assert not wrong, "blobsdk imports: " + ", ".join(f"{e.target} ({e.where})" for e in wrong)


# A role package's face is its ``__init__.py``: ``__all__`` names what other roles and the
# servers use of it, and its modules are the package's own.  servers/ imports faces only (a
# role package, or a module at the top of blobsdk), and of those only the ones named here:
# the wire types and limits, the errors, auth, config, the storage protocols and their
# backends, the serving and data-path helpers a server shares with the client, and the
# command-line parser of every command.  docs/architecture.md lists the same faces; a server
# that needs another one makes it public there first, so a change to the SDK's internals never
# breaks a server.
SERVER_IMPORTS = {
    "blobsdk",
    "blobsdk._extras",
    "blobsdk.auth",
    "blobsdk.cache",
    "blobsdk.chunks",
    "blobsdk.cli",
    "blobsdk.config",
    "blobsdk.errors",
    "blobsdk.metadata",
    "blobsdk.net",
    "blobsdk.runtime",
    "blobsdk.sources",
    "blobsdk.tail",
    "blobsdk.wire",
}


def faces(root: Path) -> dict[str, Path]:
    """Every face of blobsdk: the package itself, its role packages, its top-level modules."""
    return {name: path for name, path in module_names(root, ["blobsdk"]).items() if name.count(".") <= 1}


def test_servers_import_only_the_faces_made_for_them():
    used = {e.target for e in import_edges(ROOT) if e.source.split(".")[0] == "servers" and e.target.split(".")[0] == "blobsdk"}
    not_faces = sorted(used - faces(ROOT).keys())
    assert not not_faces, "servers import blobsdk modules that are no face: " + ", ".join(not_faces)
    assert used <= SERVER_IMPORTS, "servers import blobsdk faces not made for them: " + ", ".join(sorted(used - SERVER_IMPORTS))


def role_packages(root: Path) -> list[str]:
    return sorted(name for name, path in faces(root).items() if path.name == "__init__.py" and name != "blobsdk")


def face_names(package: str, root: Path = ROOT) -> list[str]:
    """A role package's ``__all__``, read from its face without importing it."""
    tree = ast.parse(faces(root)[package].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def test_every_role_package_has_a_face():
    packages = role_packages(ROOT)
    assert len(packages) >= 13, packages
    missing = [p for p in packages if not face_names(p)]
    assert not missing, "role packages with no __all__ in their __init__.py: " + ", ".join(missing)
    undocumented = [p for p in packages if not ast.get_docstring(ast.parse(faces(ROOT)[p].read_text()))]
    assert not undocumented, "faces with no docstring: " + ", ".join(undocumented)


def test_every_name_of_a_face_exists():
    """Importing each face and each of its names: a lazy name's module loads (the extras are
    installed here), an eager one is there."""
    missing = [
        f"{package}.{name}"
        for package in role_packages(ROOT)
        for name in face_names(package)
        if not hasattr(importlib.import_module(package), name)
    ]
    assert not missing, "names in __all__ that the face lacks: " + ", ".join(missing)


def test_no_name_of_a_face_hides_one_of_its_modules():
    """A face's name equal to a module of its package would replace the module as the
    package's attribute: ``import pkg.mod as m`` and ``monkeypatch.setattr("pkg.mod.x", ...)``
    would find the name, not the module."""
    modules = module_names(ROOT, ["blobsdk"])
    hiding = [f"{p}.{name}" for p in role_packages(ROOT) for name in face_names(p) if f"{p}.{name}" in modules]
    assert not hiding, "face names that hide a module of the package: " + ", ".join(hiding)


def test_a_private_module_of_a_role_package_is_imported_only_inside_it():
    """In blobsdk and the servers (tests and benchmarks may reach into a package, as a fault
    injection or a measurement of one piece does)."""
    wrong = [
        f"{e.source} -> {e.target} ({e.where})"
        for e in import_edges(ROOT, ["blobsdk", "servers"])
        if e.target.count(".") == 2 and e.target.rsplit(".", 1)[1].startswith("_") and role_of(e.source) != role_of(e.target)
    ]
    assert not wrong, "private modules imported from outside their package:\n" + "\n".join(wrong)


# Inside blobsdk, a module imports another role package through its face (``from ..runtime
# import AsyncResource``, not ``from ..runtime.resource import ...``), so a role's modules can
# be split or renamed without touching another role.  The packages whose modules are held to
# it; another package joins here once its modules import that way.
# Every module of blobsdk: the role packages and the top-level modules (client, torch, ...).
THROUGH_FACES = ("blobsdk",)
# The direct imports kept, each with its reason (docs/architecture.md, "Faces", lists them).
PAST_FACES_ALLOWED = {
    # the name rules, which wire checks ids with while the chunks face (lazy) is half-made
    ("blobsdk.wire", "blobsdk.chunks.names"),
    # the elastic-resume rules, a namespace of names too general for the integrations face
    # (count, indices, shared, restore_one)
    ("blobsdk.torch", "blobsdk.integrations.elastic"),
}


def past_faces(edges: Iterable[Edge], packages: Iterable[str], checked: Iterable[str]) -> list[str]:
    """The imports by a module of a ``checked`` role package (or of any under a ``checked``
    package) of a module of another role
    package (one of ``packages``), not of its face, as ``source -> target (file:line)``."""
    packages, checked = set(packages), tuple(checked)
    return [
        f"{e.source} -> {e.target} ({e.where})"
        for e in edges
        if any(role_of(e.source) == c or role_of(e.source).startswith(c + ".") for c in checked)
        and role_of(e.target) in packages
        and role_of(e.target) != role_of(e.source)
        and e.target != role_of(e.target)
    ]


def test_role_packages_import_other_roles_through_their_faces():
    edges = [e for e in import_edges(ROOT, ["blobsdk"]) if (e.source, e.target) not in PAST_FACES_ALLOWED]
    wrong = past_faces(edges, role_packages(ROOT), THROUGH_FACES)
    assert not wrong, "modules that import another role's module, not its face:\n" + "\n".join(wrong)


def test_every_import_allowed_past_a_face_is_still_made():
    made = {(e.source, e.target) for e in import_edges(ROOT, ["blobsdk"])}
    assert made >= PAST_FACES_ALLOWED, "allowed past a face, no longer imported: " + str(PAST_FACES_ALLOWED - made)


# The faces whose names the check below leaves alone (none now).
FACE_NAMES_NOT_YET_CHECKED: set[str] = set()


def face_names_from_private_modules(root: Path, packages: Iterable[str], skip: Iterable[str] = ()) -> list[str]:
    """The names of a role package's face that a module outside the package imports from one
    of its private modules, not from the face, as ``module.name (file:line)`` (the faces of
    ``skip`` left out)."""
    exported = {p: set(face_names(p, root)) for p in role_packages(root) if p not in set(skip)}
    modules = module_names(root, packages)
    wrong = []
    for name, path in modules.items():
        for node, _ in _imports(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _absolute(node, name, path.name == "__init__.py")
            package, _, module = base.rpartition(".")
            if package in exported and module.startswith("_") and role_of(name) != package:
                where = f"{path.relative_to(root)}:{node.lineno}"
                wrong += [f"{base}.{a.name} ({where})" for a in node.names if a.name in exported[package]]
    return wrong


def test_a_name_of_a_face_is_imported_from_the_face():
    """Everywhere outside its package, tests and benchmarks too: they may reach a private
    module for what no face names, not for what one does."""
    everywhere = ["blobsdk", "servers", "benchmarks", "tests", "examples"]
    wrong = face_names_from_private_modules(ROOT, everywhere, FACE_NAMES_NOT_YET_CHECKED)
    assert not wrong, "names of a face imported from a private module:\n" + "\n".join(wrong)


def test_what_servers_import_from_a_face_is_in_its_all():
    packages = set(role_packages(ROOT))
    wrong = [
        f"{node.module}.{a.name} ({where})"
        for node, where in server_imports()
        if isinstance(node, ast.ImportFrom) and node.module in packages
        for a in node.names
        if a.name not in face_names(node.module)
    ]
    assert not wrong, "servers import names their face does not name in __all__: " + ", ".join(wrong)


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


def test_a_lazy_import_between_two_packages_is_a_loop_of_their_roles(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/top.py": "from .low.x import X\n",
            "pkg/low/__init__.py": "",
            "pkg/low/x.py": "X = 1\n",
            "pkg/low/y.py": "def f():\n    from ..top import X\n",
        },
    )
    edges = import_edges(root, ["pkg"])
    assert find_cycles(edges) == []  # no module imports itself back
    assert [describe(c) for c in find_cycles(role_edges(edges))] == [
        "pkg.low -> pkg.top (pkg/low/y.py:2) -> pkg.low (pkg/top.py:1)"
    ]


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


def test_an_import_past_a_face_is_found(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/top.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/x.py": "from ..b.y import Y\nfrom ..b import Y\nfrom .. import top\nfrom .z import Z\n",
            "pkg/a/z.py": "import pkg.b.y\n",
            "pkg/b/__init__.py": "from .y import Y\n",
            "pkg/b/y.py": "from ..a import z\n",
        },
    )
    edges = import_edges(root, ["pkg"])
    assert past_faces(edges, ["pkg.a", "pkg.b"], ["pkg.a"]) == [
        "pkg.a.x -> pkg.b.y (pkg/a/x.py:1)",
        "pkg.a.z -> pkg.b.y (pkg/a/z.py:1)",
    ]
    assert past_faces(edges, ["pkg.a", "pkg.b"], ["pkg.b"]) == ["pkg.b.y -> pkg.a.z (pkg/b/y.py:1)"]


def test_a_tier_naming_a_store_class_or_module_is_found(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "blobsdk/__init__.py": "",
            "blobsdk/sources/__init__.py": "",
            "blobsdk/sources/base.py": "",
            "blobsdk/sources/_local.py": "",
            "blobsdk/tiers/__init__.py": "",
            "blobsdk/tiers/a.py": (
                "from ..sources import BlockStore, LocalBlockStore\n"
                "from ..sources.base import Span\nfrom ..sources import _local\nimport blobsdk.sources._local\n"
            ),
        },
    )
    assert sources_named_by_tiers(root) == [
        ("blobsdk.sources", "BlockStore", "blobsdk/tiers/a.py:1"),
        ("blobsdk.sources", "LocalBlockStore", "blobsdk/tiers/a.py:1"),
        ("blobsdk.sources.base", "Span", "blobsdk/tiers/a.py:2"),
        ("blobsdk.sources", "*", "blobsdk/tiers/a.py:3"),
        ("blobsdk.sources._local", "*", "blobsdk/tiers/a.py:4"),
    ]


def test_a_name_of_a_face_imported_from_a_private_module_is_found(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "blobsdk/__init__.py": "",
            "blobsdk/a/__init__.py": "from ._x import X\n__all__ = ['X']\n",
            "blobsdk/a/_x.py": "X = 1\n_helper = 2\n",
            "blobsdk/a/y.py": "from ._x import X\n",  # inside its package
            "blobsdk/b/__init__.py": "__all__ = []\n",
            "blobsdk/b/z.py": "from ..a._x import X, _helper\nfrom ..a import X\n",
            "tests/t.py": "from blobsdk.a._x import _helper, X\n",
        },
    )
    wrong = face_names_from_private_modules(root, ["blobsdk", "tests"])
    assert wrong == ["blobsdk.a._x.X (blobsdk/b/z.py:1)", "blobsdk.a._x.X (tests/t.py:1)"]
    assert face_names_from_private_modules(root, ["blobsdk", "tests"], skip=["blobsdk.a"]) == []


def test_a_module_in_no_layer_and_an_import_up_a_layer_are_found(tmp_path: Path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from . import top\n",
            "pkg/top.py": "from .low import x\n",
            "pkg/low/__init__.py": "",
            "pkg/low/x.py": "import typing\nif typing.TYPE_CHECKING:\n    from ..top import T\n",
            "pkg/low/floor.py": "",
            "pkg/stray.py": "",
        },
    )
    layers = {0: ("pkg.low", "pkg.low.floor"), 1: ("pkg.top",), 2: ("pkg",)}
    assert layer_of("pkg.low.x", layers) == 0 and layer_of("pkg.top", layers) == 1
    assert unplaced(module_names(root, ["pkg"]), layers) == ["pkg.stray"]  # "pkg" names only the face
    assert upward(import_edges(root, ["pkg"]), layers) == ["pkg.low.x (0) -> pkg.top (1) (pkg/low/x.py:3, typing only)"]
