"""pandas and pyarrow reading and writing blobs through fsspec's ``blob://`` protocol.

Installing blobsdk registers ``blob`` with fsspec (extra ``fsspec``: from a clone, ``pip install -e
'.[fsspec]'``); pandas and pyarrow are needed for parquet.  ``storage_options={"local": DIR}`` names an embedded store; with
``{"config": "client.toml"}`` (or nothing: ``BLOBSDK_CONFIG``) the same code reads a cluster.

    python examples/fsspec_pandas.py [DIR]     # default: a temporary directory, removed at the end
"""

from __future__ import annotations

import sys
import tempfile

import fsspec
import pandas as pd
import pyarrow.parquet as pq


def main(root: str) -> None:
    options = {"local": root}
    df = pd.DataFrame({"sample": [f"s{i:03d}" for i in range(1000)], "label": [i % 10 for i in range(1000)]})
    df.to_parquet("blob://datasets/labels/part-0.parquet", storage_options=options)  # one atomic put on close
    back = pd.read_parquet("blob://datasets/labels/part-0.parquet", storage_options=options)
    assert back.equals(df)
    print(f"pandas wrote and read back blob://datasets/labels/part-0.parquet: {len(back)} rows, equal")

    fs = fsspec.filesystem("blob", **options)  # the same store as a filesystem object
    table = pq.read_table("datasets/labels/part-0.parquet", filesystem=fs)
    pq.write_table(table, "datasets/labels/part-1.parquet", filesystem=fs)
    print(f"fs.ls('datasets/labels'): {fs.ls('datasets/labels', detail=False)}")
    print(f"fs.info: {fs.info('datasets/labels/part-1.parquet')['size']} bytes")
    with fs.open("datasets/labels/part-1.parquet", "rb") as f:  # seekable, ranged reads of one version
        f.seek(-4, 2)
        print(f"the file's last 4 bytes: {f.read()!r} (parquet's magic)")
    fs.close()
    print("fsspec_pandas: done")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="blobsdk-fsspec-") as tmp:
        main(sys.argv[1] if len(sys.argv) > 1 else tmp)
