"""The ingest benchmark's background reader, for its ``memory_l3_busy`` reference row.

``python -m benchmarks._ingest_traffic CLIENT_TOML RATE_BPS``: reads every blob under the
dataset's prefix, in a new shuffled order each pass, through the tiers ``CLIENT_TOML`` names
(blobsdk's variant's: L3, no L1), at no more than ``RATE_BPS`` bytes a second, until it is
terminated.  It prints ``reading`` once its first read returned.  Run while the job trains
from memory, it makes the L3 nodes do what blobsdk's warm epochs make them do, on the same
cores, while the loader waits on none of it.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence

import blobsdk

from ._ingest_workload import PREFIX

DEPTH = 8  # reads in flight, as one blobsdk worker's readahead in the benchmark


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 2:
        sys.exit("usage: python -m benchmarks._ingest_traffic CLIENT_TOML RATE_BPS")
    config, rate = blobsdk.ClientConfig.from_toml(args[0]), float(args[1])
    with blobsdk.SyncClient(config) as client:
        paths = [info.path for info in client.list(PREFIX)]
        order = random.Random(0)
        start, read = time.monotonic(), 0
        while True:
            order.shuffle(paths)
            with client.readahead(paths, depth=DEPTH) as reads:
                for _, data in reads:
                    if not read:
                        print("reading", flush=True)
                    read += len(data)
                    ahead = read / rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)


if __name__ == "__main__":
    main()
