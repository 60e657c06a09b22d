"""The one place that words a missing optional extra (pyproject.toml's
``[project.optional-dependencies]``): a module that imports an extra's packages does so
inside :func:`requires_extra`, so a user without them reads what to install instead of a bare
``No module named 'torch'``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
        message = f"{needed_by} needs the {extra!r} extra: pip install 'blobsdk[{extra}]' ({exc})"
        raise MissingExtra(message, name=exc.name) from exc
