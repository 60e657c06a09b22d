"""No class of blobsdk is a mixin: each part gets what it uses by its constructor, so no class
names an attribute of ``self`` that it never sets, the mark of a mixin reading state its host
set (the disk cache's parts, blobsdk/cache/_diskstate.py, are the model; a wrapper's base
class takes what it wraps, metadata/base.py's ``PassThrough``)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path
from types import ModuleType

import msgspec

from tests.helpers import ROOT


def holds_state(cls: type) -> bool:
    """Whether ``cls`` is a class whose annotations are its own attributes' (not fields of a
    struct, a dataclass, a named tuple, a typed dict or a protocol)."""
    return not (
        issubclass(cls, msgspec.Struct | tuple)
        or dataclasses.is_dataclass(cls)
        or typing.is_typeddict(cls)
        or getattr(cls, "_is_protocol", False)
    )


def borrowed(node: ast.ClassDef) -> list[str]:
    """The attributes a class declares in its body (annotated, with no value) but never sets
    on ``self`` in its own code."""
    declared = [
        s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and s.value is None and isinstance(s.target, ast.Name)
    ]
    targets = [t for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets]
    targets += [n.target for n in ast.walk(node) if isinstance(n, ast.AnnAssign | ast.AugAssign)]
    targets += [e for t in list(targets) if isinstance(t, ast.Tuple) for e in t.elts]
    mine = {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return [name for name in declared if name not in mine]


def test_no_class_of_blobsdk_reads_state_another_set() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {', '.join(names)}"
        for path in sorted((ROOT / "blobsdk").rglob("*.py"))
        if path.name != "__main__.py" and path.name != "dlio.py"  # a command; what runs only inside DLIO
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef) and holds_state(getattr(_module(path), node.name))
        if (names := borrowed(node))
    ]
    assert not wrong, "classes that declare attributes of self they never set (mixins):\n" + "\n".join(wrong)


def _module(path: Path) -> ModuleType:
    return importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))


def test_the_check_finds_a_mixin() -> None:
    source = """
class Host:
    def __init__(self):
        self.index, self.count = {}, 0

class Mixin:
    index: dict
    count: int
    own: int
    kept: int = 0

    def __init__(self):
        self.own = 1
"""
    host, mixin = (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    assert borrowed(mixin) == ["index", "count"] and borrowed(host) == []
