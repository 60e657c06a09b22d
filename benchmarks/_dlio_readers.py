"""The DLIO benchmark's peer readers (benchmarks/dlio.py), run inside DLIO (.venv-dlio): the
object-storage client libraries MLPerf Storage v3.0 names, each a DLIO ``FormatReader`` that
reads every sample file whole, as one S3 object, as blobsdk's reader (blobsdk/dlio.py) does.

- ``S3TorchReader``: s3torchconnector's ``S3Client.get_object(...).read()`` (its CRT client,
  made in each process on first use: a fork drops it).
- ``S3dlioReader``: s3dlio's ``get(uri)``, the library MLPerf Storage defaults to.

Where the objects are comes from the environment the benchmark sets: ``DLIO_BENCH_S3_URL``
(``s3://BUCKET/PREFIX``: the object of ``{data_folder}/train/x.npz`` is ``PREFIX/train/x.npz``),
``AWS_ENDPOINT_URL``, ``AWS_REGION`` and the keys.
"""

from __future__ import annotations

import os
from typing import Any

from dlio_benchmark.reader.reader_handler import FormatReader


class _ObjectReader(FormatReader):  # type: ignore[misc]
    def __init__(self, dataset_type: Any, thread_index: int, epoch: int | None = None) -> None:
        super().__init__(dataset_type, thread_index)
        self._folder = os.path.abspath(os.path.join(self._args.storage_root, self._args.data_folder))
        bucket, _, prefix = os.environ["DLIO_BENCH_S3_URL"].removeprefix("s3://").partition("/")
        self._bucket, self._prefix = bucket, prefix.rstrip("/")
        self._client: Any = None
        self._pid = 0

    def _key(self, filename: str) -> str:
        return f"{self._prefix}/{os.path.relpath(os.path.abspath(filename), self._folder)}"

    def _get(self, key: str) -> bytes:
        raise NotImplementedError

    def open(self, filename: str) -> bytes:
        super().open(filename)
        return self._get(self._key(filename))

    def close(self, filename: str) -> None:
        super().close(filename)

    def get_sample(self, filename: str, sample_index: int) -> None:
        super().get_sample(filename, sample_index)

    def next(self) -> Any:
        yield from super().next()

    def read_index(self, global_sample_idx: int, step: int) -> Any:
        return super().read_index(global_sample_idx, step)

    def finalize(self) -> Any:
        return super().finalize()

    def is_index_based(self) -> bool:
        return True

    def is_iterator_based(self) -> bool:
        return True


class S3TorchReader(_ObjectReader):
    def _get(self, key: str) -> bytes:
        if self._client is None or self._pid != os.getpid():
            from s3torchconnector import S3ClientConfig
            from s3torchconnector._s3client import S3Client

            config = S3ClientConfig(force_path_style=True)
            self._client = S3Client(os.environ["AWS_REGION"], endpoint=os.environ["AWS_ENDPOINT_URL"], s3client_config=config)
            self._pid = os.getpid()
        return bytes(self._client.get_object(self._bucket, key).read())


class S3dlioReader(_ObjectReader):
    def _get(self, key: str) -> bytes:
        import s3dlio

        return bytes(s3dlio.get(f"s3://{self._bucket}/{key}"))
