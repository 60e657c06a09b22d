def prog(module: str) -> str:
    """A server's name in its usage line: the console script that runs it (``blobsdk-api``),
    else ``python -m PACKAGE.MODULE`` (``servers.api`` in a checkout, ``blobsdk_servers.api``
    installed)."""
    import os
    import sys

    script = os.path.basename(sys.argv[0])
    return script if script.startswith("blobsdk-") else f"python -m {module}"


def install_hint(extra: str) -> str:
    """How to install an extra of blobsdk's, installed or in a checkout."""
    return f"pip install 'blobsdk[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
