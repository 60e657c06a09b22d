"""A package face's names that load their module on first use (PEP 562's module
``__getattr__``): for a face whose modules need an extra (redis, obstore, torch, fsspec), or
load what a process may never use, so importing the face costs neither.  The face also imports
those names under ``if TYPE_CHECKING:``, so type checkers and readers see where each lives."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, modules: Mapping[str, str]) -> Callable[[str], object]:
    """The ``__getattr__`` of the face ``package``: each name of ``modules`` (name -> its module,
    relative to the package) taken from its module, imported if it is not yet.  Nothing is
    kept on the face, so the name is always the module's own, as an import from the module
    would give: a module dropped from ``sys.modules`` (as tests drop one to import it without
    its extra) is imported afresh."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
