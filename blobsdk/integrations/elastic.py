"""Elastic resume: an epoch stopped in one shape (ranks and DataLoader workers) finishes in
another, each of its samples handed out exactly once (see blobsdk/torch.py's module docstring).

An epoch's order is a pure function of ``(seed, epoch, list)``; a shape of ``W`` ranks of ``K``
workers cuts it by stride, so (rank ``r``, worker ``k``) owns positions ``r + W*(k + K*j)`` and,
having handed out ``y`` samples, has handed out exactly those with ``j < y``.  The states of
every (rank, worker) of a shape thus name the set it consumed with ``W*K`` counts: a
:class:`Generation`.  What is left of the epoch is its order minus that set, kept in order; a
new shape cuts the rest the same way, and if it stops too, its own generation is taken out of
that rest, and so on.  A state of a resumed epoch carries the generations before it (the same
in every rank and worker of the new shape): a few counts per old (rank, worker), whatever the
length of the list, where carrying the set itself would cost a bit or an index per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from .._extras import requires_extra

with requires_extra("torch", "blobsdk.torch"):
    import torch

from .order import Generation, Position, Sharding, check_epoch, check_identity, is_int, restore

T = TypeVar("T")


class Resumable:
    """A dataset or sampler of blobsdk.torch whose ``load_state_dict`` takes the list of a whole
    job's states (BlobIterableDataset, BlobSampler): what ``DataState`` resumes (declared by
    subclassing, so blobsdk/integrations/datastate.py need not import blobsdk.torch, which
    imports it)."""

    def state_dict(self) -> dict[str, object]:
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, object] | Sequence[Mapping[str, object]]) -> None:
        raise NotImplementedError


SLOT_KEYS = ("rank", "world_size")
WORKER_KEYS = ("worker", "workers")


def share(total: int, rank: int, world_size: int, worker: int = 0, workers: int = 1) -> int:
    """How many of ``total`` positions (rank, worker) of a shape owns."""
    return len(range(rank, total, world_size)[worker::workers])


def remaining(order: torch.Tensor, consumed: Sequence[Generation]) -> torch.Tensor:
    """``order`` without the samples each generation handed out, in order."""
    for generation in consumed:
        kept = torch.ones(len(order), dtype=torch.bool)
        kept[generation.positions()] = False
        order = order[kept]
    return order


def left(samples: int, consumed: Sequence[Generation]) -> int:
    return samples - sum(generation.consumed for generation in consumed)


def indices(sharding: Sharding, position: Position) -> list[int]:
    """The sample indices ``position``'s (rank, worker) owns in its epoch, in order: of the
    whole epoch, or of what the generations before it left."""
    if not position.consumed:
        return sharding.indices(position.epoch, *position.worker)
    rest = remaining(sharding.order(position.epoch), position.consumed)
    worker, workers = position.worker
    return rest[sharding.rank :: sharding.world_size][worker::workers].tolist()


def count(sharding: Sharding, position: Position) -> int:
    total = left(sharding.samples, position.consumed)
    return share(total, sharding.rank, sharding.world_size, *position.worker)


def is_states(value: object) -> bool:
    """A (non-empty) list of states of every (rank, worker), rather than one state (an empty
    list is neither: it is refused as a state that is not a dict)."""
    return isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) > 0


def shared(identity: Mapping[str, object]) -> dict[str, object]:
    """The identifying keys every rank and worker shares: the list, the seed, the shuffle."""
    return {key: value for key, value in identity.items() if key not in (*SLOT_KEYS, *WORKER_KEYS)}


def position_state(position: Position) -> dict[str, object]:
    """A state's position keys (``consumed`` only in a resumed epoch: older states lack it)."""
    state: dict[str, object] = {"epoch": position.epoch, "yielded": position.yielded}
    if position.consumed:
        state["consumed"] = [generation.state() for generation in position.consumed]
    return state


def restore_one(
    state: object, expected: Mapping[str, object], what: str, sharding: Sharding, worker: tuple[int, int]
) -> Position:
    """The position a state of this very (rank, worker) names, in a resumed epoch or not."""
    checked = check_identity(state, expected, what, "epoch", "yielded")
    consumed = parse_consumed(checked.get("consumed", []), sharding.samples)
    total = left(sharding.samples, consumed)
    position = restore(checked, expected, what, share(total, sharding.rank, sharding.world_size, *worker))
    return Position(position.epoch, position.yielded, worker, consumed)


def parse_consumed(value: object, samples: int) -> tuple[Generation, ...]:
    """The generations a state names, each checked against what the ones before it left."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"cannot resume: consumed must be a list, got {type(value).__name__}")
    consumed: list[Generation] = []
    for entry in value:
        consumed.append(parse_generation(entry, left(samples, consumed)))
    return tuple(consumed)


def parse_generation(entry: object, total: int) -> Generation:
    bad = f"cannot resume: {entry!r} is not a consumed entry (world_size, workers and yielded counts)"
    if not isinstance(entry, Mapping) or {"world_size", "workers", "yielded"} - entry.keys():
        raise ValueError(bad)
    world_size, workers, yielded = entry["world_size"], entry["workers"], entry["yielded"]
    if not (is_int(world_size) and world_size >= 1 and is_int(workers) and workers >= 1 and isinstance(yielded, list | tuple)):
        raise ValueError(bad)
    if len(yielded) != world_size * workers:
        raise ValueError(bad)
    counts = (check_yielded(y, total, divmod(slot, workers), (world_size, workers)) for slot, y in enumerate(yielded))
    return Generation(world_size, workers, tuple(counts))


# --- gathering every old (rank, worker)'s state ---------------------------------------------------


def gather_states(state: Mapping[str, object] | Sequence[Mapping[str, object]], group: Any = None) -> list[Mapping[str, object]]:
    """Every rank's states, on every rank of a torch.distributed job: pass this rank's state
    (its sampler's) or the list of its workers' states.  The list ``load_state_dict`` takes."""
    gathered: list[object] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(gathered, state, group=group)
    return [one for ranks in gathered for one in (ranks if isinstance(ranks, list) else [cast(Mapping[str, object], ranks)])]


def gather(
    states: object, expected: Mapping[str, object], what: str, samples: int, *, by_worker: bool
) -> tuple[int, tuple[Generation, ...]]:
    """The epoch and the generations of the states of every (rank, worker) of one shape, the
    new one last.  ``expected``: the keys they share with this dataset (not the rank nor the
    worker); ``by_worker``: whether they name their worker (an iterable's do, a sampler's not)."""
    if not isinstance(states, Sequence) or isinstance(states, str) or not states:
        raise ValueError("cannot resume from an empty list of states")
    keys = (*SLOT_KEYS, *WORKER_KEYS) if by_worker else SLOT_KEYS
    checked = [check_identity(state, expected, what, "epoch", "yielded", *keys) for state in states]
    slots = [check_slot(state, by_worker) for state in checked]
    epoch = one_of(sorted(check_epoch(s["epoch"]) for s in checked), "cannot resume: the states are from epochs {} and {}")
    world_size = one_of([w for _, _, w, _ in slots], "cannot resume: the states were saved with world_size={} and {}")
    workers = one_of([k for _, _, _, k in slots], "cannot resume: the states were saved with workers={} and {}")
    before = one_of(
        [parse_consumed(s.get("consumed", []), samples) for s in checked],
        "cannot resume: the states come from different resumes of their epoch: {} before one, {} before another",
        describe,
    )
    yielded = slot_counts(
        [(rank, worker, s["yielded"]) for (rank, worker, _, _), s in zip(slots, checked, strict=True)], (world_size, workers)
    )
    total = left(samples, before)
    counts = tuple(check_yielded(y, total, divmod(slot, workers), (world_size, workers)) for slot, y in enumerate(yielded))
    return epoch, (*before, Generation(world_size, workers, counts))


def describe(consumed: tuple[Generation, ...]) -> str:
    shapes = (f"{g.consumed} samples by {g.world_size}x{g.workers} (ranks x workers)" for g in consumed)
    return ", then ".join(shapes) or "nothing"


def one_of(values: list[T], message: str, shown: Callable[[T], object] = lambda value: value) -> T:
    """The one value all states share, else a ValueError naming two that differ."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) > 1:
        raise ValueError(message.format(shown(distinct[0]), shown(distinct[1])))
    return distinct[0]


def check_slot(state: Mapping[str, object], by_worker: bool) -> tuple[int, int, int, int]:
    """A state's ``(rank, worker, world_size, workers)``, each an int in range."""
    world_size = check_size(state, "world_size")
    workers = check_size(state, "workers") if by_worker else 1
    rank = check_index(state, "rank", world_size)
    worker = check_index(state, "worker", workers) if by_worker else 0
    return rank, worker, world_size, workers


def check_size(state: Mapping[str, object], key: str) -> int:
    value = state[key]
    if not is_int(value) or value < 1:
        raise ValueError(f"cannot resume: a state has {key}={value!r}, not an int >= 1")
    return value


def check_index(state: Mapping[str, object], key: str, size: int) -> int:
    value = state[key]
    if not is_int(value) or not 0 <= value < size:
        raise ValueError(f"cannot resume: a state has {key}={value!r}, not an int in [0, {size})")
    return value


def slot_counts(slots: list[tuple[int, int, object]], shape: tuple[int, int]) -> list[object]:
    """Each (rank, worker)'s ``yielded``, rank-major: exactly one state each."""
    world_size, workers = shape
    counts: dict[tuple[int, int], object] = {}
    for rank, worker, yielded in slots:
        if (rank, worker) in counts:
            raise ValueError(f"cannot resume: two states of {label(rank, worker, (world_size, workers))}")
        counts[rank, worker] = yielded
    for rank in range(world_size):
        for worker in range(workers):
            if (rank, worker) not in counts:
                raise ValueError(f"cannot resume: missing {label(rank, worker, (world_size, workers))}")
    return [counts[divmod(slot, workers)] for slot in range(world_size * workers)]


def check_yielded(yielded: object, total: int, slot: tuple[int, int], shape: tuple[int, int]) -> int:
    bound = share(total, slot[0], shape[0], slot[1], shape[1])
    if not is_int(yielded) or not 0 <= yielded <= bound:
        raise ValueError(f"cannot resume: yielded={yielded!r} of {label(*slot, shape)} is not in [0, {bound}]")
    return yielded


def label(rank: int, worker: int, shape: tuple[int, int]) -> str:
    world_size, workers = shape
    ranked = f"rank {rank} of {world_size}"
    return ranked if workers == 1 else f"worker {worker} of {workers} of {ranked}"
