"""A job's data state, saved with its model: ``DataState(loader)`` is a ``Stateful`` for
``dcp.save({"model": ..., "data": DataState(loader)})`` on every rank, or for a blobsdk
checkpoint (``{"data": data_state.state_dict()}``), that resumes in any shape (see
blobsdk/torch.py's module docstring and blobsdk/integrations/elastic.py).

``loader`` is this rank's torchdata ``StatefulDataLoader`` over a BlobIterableDataset, or with a
BlobSampler.  Its ``state_dict()`` takes the states the loader saved with the last batch it
handed out (:func:`states_of`: the live dataset and sampler run ahead of the training loop),
gathers every rank's through torch.distributed (a collective: DCP calls it on every rank), and
returns one value, the same on every rank: ``{"states": <bytes: JSON of every (rank, worker)'s
state>}``.  DCP keeps one copy of an entry every rank saved under one key, so per-rank entries
would lose all ranks' but one; this one loses nothing, and a job of any shape loads that same
key.  ``load_state_dict`` hands the list to the dataset's or the sampler's
``load_state_dict``, before the loader is iterated: it resumes the epoch the states name
(``set_epoch`` of that epoch keeps the resume, of another drops it).

Its size, for a 10M-sample list (measured on this machine): a 48x8 job's ~59 KB, ~0.23 MB in
an epoch resumed from 8x8, ~0.9 MB resumed from 48x8 (each state repeats the counts of the
shapes before it); DCP writes it once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from .._extras import requires_extra

with requires_extra("torch", "blobsdk.torch"):
    import torch

from .elastic import Resumable, gather_states

# The keys of a torchdata StatefulDataLoader's state_dict() this reads (torchdata 0.8 to 0.11).
SNAPSHOT, MAIN, WORKERS, STEPS_SINCE = "_snapshot", "_main_snapshot", "_worker_snapshots", "_steps_since_snapshot"
SAMPLER_ITER, INDEX_SAMPLER, SAMPLER, DATASET = "_sampler_iter_state", "_index_sampler_state", "sampler_state", "dataset_state"


def states_of(loader_state: Mapping[str, Any]) -> list[Mapping[str, object]]:
    """The states in a ``StatefulDataLoader.state_dict()``, as of the last batch it handed
    out: its sampler's (a one-state list), else its workers' datasets' (one per worker; the
    dataset's own with ``num_workers=0``).  What ``load_state_dict`` and ``gather_states`` take."""
    snapshot = loader_state.get(SNAPSHOT)
    if snapshot is None:  # num_workers=0: the state of the loader's own process, taken as it was
        main, workers = loader_state, [loader_state]
    else:
        steps = loader_state.get(STEPS_SINCE, 0)
        if steps:
            raise ValueError(
                f"cannot take the data states: the loader handed out {steps} batches since its last snapshot"
                " (make the StatefulDataLoader with snapshot_every_n_steps=1, or take its state at a snapshot)"
            )
        main, by_worker = snapshot[MAIN], snapshot[WORKERS]
        workers = [by_worker[f"worker_{k}"] for k in range(len(by_worker))]
    sampler = sampler_state(main)
    if sampler is not None:
        return [sampler]
    states = [worker.get(DATASET) for worker in workers]
    if not all(isinstance(state, Mapping) for state in states):
        raise ValueError("cannot take the data states: the loader's state holds neither a sampler's state nor its datasets'")
    return cast(list[Mapping[str, object]], states)


def sampler_state(main: Mapping[str, Any]) -> Mapping[str, object] | None:
    """The sampler's state: inside the batch sampler's, or the sampler's own (``batch_size=None``)."""
    batches = main.get(SAMPLER_ITER)
    state = batches.get(SAMPLER) if isinstance(batches, Mapping) else None
    if isinstance(state, Mapping):
        return state
    index = main.get(INDEX_SAMPLER)
    return index if isinstance(index, Mapping) else None


class DataState:
    """This rank's data position in its job, as a ``Stateful``: see the module docstring.
    ``group``: the torch.distributed group its states are gathered over (None: the default;
    without torch.distributed, this process's states are the job's)."""

    def __init__(self, loader: Any, *, group: Any = None) -> None:
        self.loader = loader
        self._resumable = resumable(loader)
        self._group = group

    def state_dict(self) -> dict[str, bytes]:
        """Every rank's states, the same on every rank (a collective under torch.distributed)."""
        states = self._states()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            states = gather_states(states, self._group)
        return {"states": json.dumps(states, separators=(",", ":")).encode()}

    def _states(self) -> list[Mapping[str, object]]:
        """This rank's states.  A loader not iterated yet (its state_dict() would start its
        workers to ask them) starts where the state it was given says, else where its dataset
        or sampler is."""
        if getattr(self.loader, "_iterator", None) is not None:
            return states_of(self.loader.state_dict())
        given = getattr(self.loader, "next_iter_state", None)
        return states_of(given) if given else [self._resumable.state_dict()]

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Resume the epoch the states name, this rank's share of what was left (before the
        loader is iterated).  A ValueError if ``state`` is not a DataState's, and as
        ``load_state_dict`` of the dataset or the sampler refuses states."""
        self._resumable.load_state_dict(decode(state))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._resumable!r}>"


def resumable(loader: Any) -> Any:
    """What ``loader``'s position is kept in: its BlobSampler, else its BlobIterableDataset."""
    sampler, dataset = getattr(loader, "sampler", None), getattr(loader, "dataset", None)
    if not callable(getattr(loader, "state_dict", None)):
        raise TypeError(f"DataState takes a torchdata StatefulDataLoader, got {type(loader).__name__}")
    if isinstance(sampler, Resumable):  # a BlobSampler
        return sampler
    if isinstance(dataset, Resumable):  # a BlobIterableDataset
        return dataset
    raise TypeError(
        "DataState takes a StatefulDataLoader over a BlobIterableDataset or with a BlobSampler,"
        f" got one over {type(dataset).__name__} with {type(sampler).__name__}"
    )


def decode(state: object) -> list[object]:
    """The list of states a DataState's ``state_dict()`` saved."""
    raw = state.get("states") if isinstance(state, Mapping) else None
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise ValueError(f"not a DataState state: expected {{'states': bytes}}, got {describe(state)}")
    try:
        states = json.loads(bytes(raw))
    except ValueError:
        raise ValueError("not a DataState state: its states are not JSON") from None
    if not isinstance(states, list):
        raise ValueError(f"not a DataState state: its states are a JSON {type(states).__name__}, not a list")
    return states


def describe(state: object) -> str:
    if isinstance(state, Mapping):
        return "{" + ", ".join(f"{key!r}: {type(value).__name__}" for key, value in state.items()) + "}"
    return type(state).__name__
