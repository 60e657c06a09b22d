"""The Mosaic Streaming rows of benchmarks/ingest_s3.py, run by the interpreter of its own venv
(``make venv-mosaic``: mosaicml-streaming 0.13.0 pins numpy < 2.2 and xxhash < 4, which the
project's venv does not meet; that venv sees the project's other packages through a ``.pth``).

``python -m benchmarks._ingest_mosaic write WORKLOAD.pkl OUT SIZE_MB...``: the dataset as MDS
shards (its ``MDSWriter``, columns ``index: int``, ``data: bytes``), one directory
``OUT/mosaic-NNmb`` per shard size.  ``python -m benchmarks._ingest_mosaic play IN.pkl
OUT.pkl``: play the pickled ``(row, context)`` as every other row is played, and pickle its
:class:`~benchmarks._ingest_job.JobResult`.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

from ._ingest_workload import Samples


def write(workload_pickle: Path, out: Path, sizes_mb: Sequence[int]) -> None:
    from streaming import MDSWriter

    samples = Samples(pickle.loads(workload_pickle.read_bytes()))
    for mb in sizes_mb:
        with MDSWriter(out=str(out / f"mosaic-{mb}mb"), columns={"index": "int", "data": "bytes"}, size_limit=mb * 10**6) as sink:
            for i in range(len(samples)):
                sink.write({"index": i, "data": bytes(samples.data(i))})


def play(spec: Path, result: Path) -> None:
    from ._ingest_rows import play_here

    row, context = pickle.loads(spec.read_bytes())
    result.write_bytes(pickle.dumps(play_here(row, context)))


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) >= 3 and args[0] == "write":
        write(Path(args[1]), Path(args[2]), [int(mb) for mb in args[3:]])
    elif len(args) == 3 and args[0] == "play":
        play(Path(args[1]), Path(args[2]))
    else:
        sys.exit("usage: python -m benchmarks._ingest_mosaic write WORKLOAD.pkl OUT SIZE_MB... | play IN.pkl OUT.pkl")


if __name__ == "__main__":
    main()
