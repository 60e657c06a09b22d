"""The one place that words a missing optional extra (pyproject.toml's
``[project.optional-dependencies]``): a module that imports an extra's packages does so
inside :func:`requires_extra`, so a user without them reads what to install instead of a bare
``No module named 'torch'``.

The command named is the one that works where this blobsdk came from: a checkout (its files
in a source tree of blobsdk: an editable install, or the tree on ``sys.path``) takes
``pip install -e '<checkout>[torch]'``, as an index knows no distribution built from a clone;
an install from a local directory takes that directory; anything else, the index's
``pip install 'blobsdk[torch]'``."""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from .errors import MissingExtra


@contextmanager
def requires_extra(extra: str, needed_by: str) -> Iterator[None]:
    """Turn an ImportError of the imports in the block into a :class:`MissingExtra` naming
    ``extra``.  Put only the extra's own imports in the block: any ImportError there (not
    installed, a version too old to have a name imported, a broken install) is what installing
    the extra fixes, and the original reason stays in the message and as ``__cause__``."""
    try:
        yield
    except ImportError as exc:
        message = f"{needed_by} needs the {extra!r} extra: {pip_install(extra)} ({exc})"
        raise MissingExtra(message, name=exc.name) from exc


def pip_install(extra: str) -> str:
    """The ``pip install`` of ``extra`` for the blobsdk running here (see the module docstring)."""
    return install_command(extra, Path(__file__).resolve().parent)


def install_command(extra: str, package: Path) -> str:
    """The ``pip install`` of ``extra`` for the blobsdk package whose directory is ``package``."""
    root = package.parent
    if _is_blobsdk_source(root):
        return f"pip install -e {shlex.quote(f'{root}[{extra}]')}"
    source = _installed_from(root)
    if source is not None:
        return f"pip install {shlex.quote(f'{source}[{extra}]')}"
    return f"pip install {shlex.quote(f'blobsdk[{extra}]')}"


def _is_blobsdk_source(root: Path) -> bool:
    """Whether ``root`` is a source tree of blobsdk: its pyproject.toml names the project."""
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text()).get("project")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(project, dict) and project.get("name") == "blobsdk"


def _installed_from(site: Path) -> str | None:
    """The local directory pip installed the blobsdk in ``site`` from (its dist-info's
    ``direct_url.json``, PEP 610), or None: from an index, an archive, or not pip's."""
    for dist in metadata.distributions(name="blobsdk", path=[str(site)]):
        try:
            origin = json.loads(dist.read_text("direct_url.json") or "null")
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        if not isinstance(origin, dict) or "dir_info" not in origin or not isinstance(origin.get("url"), str):
            return None
        url = urlparse(origin["url"])
        return unquote(url.path) if url.scheme == "file" and url.path else None
    return None
