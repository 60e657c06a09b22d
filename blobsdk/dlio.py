"""DLIO (MLPerf Storage's harness) with blobsdk as its client library: a reader that reads
every sample file through blobsdk, and a checkpointing mechanism over blobsdk's DCP writer.

In DLIO's config (``++workload.reader.reader_classname=blobsdk.dlio.BlobReader``,
``++workload.checkpoint.checkpoint_mechanism_classname=blobsdk.dlio.BlobCheckpointing``),
with ``BLOBSDK_DLIO_PREFIX`` and the store in the environment (see
:mod:`blobsdk.integrations.dliofiles`, where all the blobsdk logic is; docs/dlio.md).

Only DLIO imports this module, so it imports DLIO at its top; the classes use no more of
DLIO than its 2.0.0 (PyPI) and 3.0.x (MLPerf Storage v3.0) releases share: ``FormatReader``'s
``open``/``close``/``get_sample`` hooks over its own ``next`` and ``read_index``, and
``BaseCheckpointing``'s ``get_tensor``/``save_state``.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import MissingExtra
from .integrations import CheckpointStates, DlioSettings, Lookahead, SampleFiles, dlio_order, worker_batches

try:
    import torch
    from dlio_benchmark.checkpointing.base_checkpointing import BaseCheckpointing
    from dlio_benchmark.common.enumerations import DatasetType, Shuffle
    from dlio_benchmark.reader.reader_handler import FormatReader
except ImportError as exc:  # DLIO is no extra of blobsdk: its own venv (`make dlio`)
    raise MissingExtra(f"blobsdk.dlio runs inside DLIO: install dlio-benchmark (`make dlio`, docs/dlio.md) ({exc})") from exc


class BlobReader(FormatReader):  # type: ignore[misc]  # DLIO ships no type information
    """DLIO's reader of any format: each sample file is read whole, as the blob it stands
    for; DLIO hands the model its own stand-in array, as its readers do.

    It reads ahead: DLIO's PyTorch loader orders a rank's samples by a seeded shuffle and hands
    batch ``k`` to worker ``k % read_threads``, so this worker's next samples are known; their
    reads start with the one asked for (the rest of its batch and its next batch).  If the
    samples asked for are not the ones predicted (another DLIO, another loader), it stops
    guessing and reads one sample at a time."""

    def __init__(self, dataset_type: Any, thread_index: int, epoch: int | None = None) -> None:
        super().__init__(dataset_type, thread_index)
        args = self._args
        self._files = SampleFiles(DlioSettings.from_env(), os.path.join(args.storage_root, args.data_folder))
        self._lookahead = Lookahead(self._predicted(dataset_type, thread_index))
        self._ahead: list[str] = []

    def _predicted(self, dataset_type: Any, thread_index: int) -> list[list[int]]:
        """This worker's batches as DLIO 2.0.0's ``dlio_sampler`` and a DataLoader make them."""
        args = self._args
        try:
            train = dataset_type is DatasetType.TRAIN
            samples = args.total_samples_train if train else args.total_samples_eval
            seed = None if args.sample_shuffle is Shuffle.OFF else args.seed
            order = dlio_order(args.my_rank, args.comm_size, samples, seed)
            return worker_batches(order, self.batch_size, args.read_threads, max(thread_index, 0))
        except (AttributeError, TypeError, ValueError):  # a DLIO without these settings: no guesses
            return []

    def open(self, filename: str) -> bytearray:
        super().open(filename)
        ahead, self._ahead = self._ahead, []
        return self._files.read(filename, ahead)

    def close(self, filename: str) -> None:
        super().close(filename)

    def get_sample(self, filename: str, sample_index: int) -> None:
        super().get_sample(filename, sample_index)

    def next(self) -> Any:
        yield from super().next()

    def read_index(self, global_sample_idx: int, step: int) -> Any:
        index_map = self.global_index_map
        self._ahead = [index_map[i][0] for i in self._lookahead.after(global_sample_idx) if i in index_map]
        return super().read_index(global_sample_idx, step)

    def finalize(self) -> Any:
        self._files.close()
        return super().finalize()

    def is_index_based(self) -> bool:
        return True

    def is_iterator_based(self) -> bool:
        return True


class BlobCheckpointing(BaseCheckpointing):  # type: ignore[misc]  # DLIO ships no type information
    """DLIO's checkpoints as DCP checkpoints through :class:`blobsdk.dcp.BlobStorageWriter`.
    Its tensors are random bytes, not DLIO's zeros: zeros would compress and deduplicate to
    nothing, and the figure would say nothing about a real model's state."""

    _instance: BlobCheckpointing | None = None

    @classmethod
    def get_instance(cls) -> BlobCheckpointing:
        if cls._instance is None:  # DLIO's factory asks the class for its one instance
            cls._instance = cls()
        return cls._instance

    def __init__(self) -> None:
        self._states = CheckpointStates(DlioSettings.from_env())
        self.bytes_written = 0
        super().__init__("dcp")

    def get_tensor(self, size: int) -> torch.Tensor:
        return torch.randint(-128, 128, (size,), dtype=torch.int8)

    def save_state(self, suffix: str, state: dict[str, Any]) -> None:
        self.bytes_written += self._states.save(suffix, state)

    def checkpoint(self, epoch: int, step_number: int) -> None:
        super().checkpoint(epoch, step_number)

    def finalize(self) -> None:
        super().finalize()
