"""What every server shares: its name in usage lines, and how it words a missing extra."""

import os
import sys

from blobsdk._extras import pip_install


def prog(module: str) -> str:
    """A server's name in its usage line: the console script that runs it (``blobsdk-api``),
    else ``python -m PACKAGE.MODULE`` (``servers.api`` in a checkout, ``blobsdk_servers.api``
    installed)."""
    script = os.path.basename(sys.argv[0])
    return script if script.startswith("blobsdk-") else f"python -m {module}"


def install_hint(extra: str) -> str:
    """How to install an extra of blobsdk's: the command that works where blobsdk came from
    (a clone, a directory, an index), as MissingExtra words it."""
    return pip_install(extra)
