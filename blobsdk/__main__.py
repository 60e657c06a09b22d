"""``python -m blobsdk``: the ``blobsdk`` command."""

from .cli import main

raise SystemExit(main())
