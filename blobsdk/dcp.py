"""PyTorch Distributed Checkpoint (DCP) storage over blobsdk's delta checkpoints:
``dcp.save(state, storage_writer=BlobStorageWriter(config, prefix))`` and ``dcp.load(state,
storage_reader=BlobStorageReader(config, prefix))``; also importable from ``blobsdk.torch``.

Each DCP save is one checkpoint of :mod:`blobsdk.write.checkpoint` under ``prefix``: its state is
every write item DCP hands over (tensors, and the pickled objects DCP writes as bytes), by a
key made of the item's fully qualified name and shard offsets, plus DCP's own ``Metadata``.
So the chunk-level deduplication applies: a second save of a nearly unchanged model names
the unchanged chunks of the previous checkpoint under the same prefix and writes almost
nothing new, and a save is committed atomically or not at all.

Ranks: in ``write_data`` every rank writes the changed chunks of its own items durably, as a
:class:`~blobsdk.write.checkpoint.Part` (``Checkpoints.write_part``: nothing committed), and hands
the part to the coordinator inside its write results, which DCP gathers; the coordinator's
``finish`` writes the metadata and commits every rank's part as one checkpoint
(``Checkpoints.commit``).  A rank that dies before then leaves only orphan blocks, which gc
collects; the previous checkpoint stays the latest.  On load, each rank reads the manifest
and only the items its own plan asks for.

``checkpoint_id`` is the checkpoint's step: an int, or a string of digits; None saves as the
step after the newest kept one, and loads the latest.  ``finish`` returns once the checkpoint
is committed (DCP expects ``finish`` to be durable); with ``dcp.async_save`` (thread mode)
that happens in DCP's thread.

Like the datasets, a writer or reader is built from a ``ClientConfig`` or a ``client.toml``
path, or over an embedded store with ``.local(dir, prefix)``; it opens its client on first
use, in each process, and closes it with ``close()`` or at exit.
"""

from __future__ import annotations

from .integrations import BlobStorageReader, BlobStorageWriter

__all__ = ["BlobStorageReader", "BlobStorageWriter"]
