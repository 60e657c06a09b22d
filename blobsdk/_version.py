"""blobsdk's version, read from the installed distribution (pyproject.toml's ``version``) so
that ``blobsdk.__version__``, ``blobsdk --version`` and pip agree; nothing else writes it."""

from __future__ import annotations

from importlib import metadata

UNKNOWN = "0+unknown"


def installed_version(distribution: str = "blobsdk") -> str:
    """The version pip installed, or ``UNKNOWN`` for a checkout put on ``sys.path`` without
    being installed: a PEP 440 version still, so code that parses ``__version__`` keeps working."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return UNKNOWN


__version__ = installed_version()
