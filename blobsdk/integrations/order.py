"""Which samples a dataset of blobsdk.torch reads, and in which order: the list of blob
paths (a caller's list or a listed prefix) and its fingerprint, the rank and world size, the
permutation of an epoch cut into ranks and workers, and a position within it that a saved
state restores (see blobsdk/torch.py's module docstring)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import xxhash

from .._extras import requires_extra

with requires_extra("torch", "blobsdk.torch"):
    import torch

from ..chunks import validate_path, validate_prefix
from .stores import Store

FINGERPRINT_BATCH = 4096  # paths hashed per update


def resolve_paths(store: Store, paths_or_prefix: object) -> tuple[str, ...]:
    """The dataset's list: a prefix listed once (sorted), or the caller's paths, validated."""
    if isinstance(paths_or_prefix, str):
        if not paths_or_prefix.endswith("/"):
            raise ValueError(f"paths_or_prefix must be a list of blob paths or a prefix ending in '/', got {paths_or_prefix!r}")
        prefix = validate_prefix(paths_or_prefix)
        with store.client() as client:
            paths = tuple(info.path for info in client.list(prefix))
        if not paths:
            raise ValueError(f"no blobs under {prefix!r}")
        return paths
    if not isinstance(paths_or_prefix, Sequence):
        raise TypeError(f"paths_or_prefix must be a list of blob paths or a prefix string, not {type(paths_or_prefix).__name__}")
    if not paths_or_prefix:
        raise ValueError("paths_or_prefix is an empty list")
    return tuple(validate_path(path) for path in paths_or_prefix)


def fingerprint(paths: Sequence[str]) -> str:
    """xxh3-64 of the list (NUL-separated): resuming against another list is refused."""
    digest = xxhash.xxh3_64()
    for i in range(0, len(paths), FINGERPRINT_BATCH):
        digest.update("\0".join(paths[i : i + FINGERPRINT_BATCH]).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_epoch(epoch: object) -> int:
    if not is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return epoch


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else torch.distributed's when it is initialised, else
    the ``RANK`` and ``WORLD_SIZE`` environment variables, else ``(0, 1)``."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}")
    if rank is None or world_size is None:
        rank, world_size = default_rank()
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    return rank, world_size


def default_rank() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world_size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world_size is None:
        return 0, 1
    if rank is None or world_size is None:
        given, missing = ("RANK", "WORLD_SIZE") if world_size is None else ("WORLD_SIZE", "RANK")
        raise ValueError(f"the environment sets {given} but not {missing}")
    return env_int("RANK", rank), env_int("WORLD_SIZE", world_size)


def env_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an int, got {value!r}") from None


@dataclass(frozen=True)
class Sharding:
    """One epoch's order (a permutation of all ``samples`` when ``shuffle``), cut by stride
    into ranks and each rank's share into workers."""

    samples: int
    shuffle: bool
    seed: int
    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"shuffle must be a bool, got {self.shuffle!r}")
        if not is_int(self.seed):
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    def indices(self, epoch: int, worker: int = 0, workers: int = 1) -> list[int]:
        """The sample indices of this rank's ``worker`` of ``workers`` in ``epoch``, in order."""
        order = self.order(epoch)[self.rank :: self.world_size]
        return order[worker::workers].tolist()

    def count(self, worker: int = 0, workers: int = 1) -> int:
        return len(range(self.rank, self.samples, self.world_size)[worker::workers])

    def order(self, epoch: int) -> torch.Tensor:
        """The whole epoch, before the rank cut."""
        if not self.shuffle:
            return torch.arange(self.samples)
        mixed = xxhash.xxh3_64_intdigest(f"{self.seed}:{epoch}".encode()) >> 1  # (seed, epoch) -> a 63-bit seed
        return torch.randperm(self.samples, generator=torch.Generator().manual_seed(mixed))

    def identity(self) -> dict[str, object]:
        """What a saved state must match to be resumed here."""
        return {
            "samples": self.samples,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
        }


@dataclass(frozen=True)
class Generation:
    """How far one shape of the job got through an epoch: its ranks, its workers per rank,
    and how many samples each (rank, worker) handed out, rank-major."""

    world_size: int
    workers: int
    yielded: tuple[int, ...]

    def state(self) -> dict[str, object]:
        return {"world_size": self.world_size, "workers": self.workers, "yielded": list(self.yielded)}

    @property
    def consumed(self) -> int:
        return sum(self.yielded)

    def positions(self) -> torch.Tensor:
        """The positions, in the order this shape cut, of every sample it handed out."""
        counts = torch.tensor(self.yielded, dtype=torch.int64)
        slots = torch.arange(len(self.yielded), dtype=torch.int64)
        offsets = slots // self.workers + self.world_size * (slots % self.workers)  # r + W*k
        starts = torch.cumsum(counts, 0) - counts
        steps = torch.arange(int(counts.sum()), dtype=torch.int64) - torch.repeat_interleave(starts, counts)
        return torch.repeat_interleave(offsets, counts) + self.world_size * self.workers * steps


@dataclass
class Position:
    """Where one iteration is: its epoch and how many of its samples it has handed out (and,
    in an iterable dataset, which worker's samples; in an epoch resumed in another shape, what
    the shapes before handed out, see blobsdk/integrations/elastic.py)."""

    epoch: int
    yielded: int = 0
    worker: tuple[int, int] = (0, 1)  # (id, num_workers)
    consumed: tuple[Generation, ...] = ()


def restore(state: object, expected: Mapping[str, object], what: str, samples: int) -> Position:
    """The position a saved state names, once every identifying key matches ``expected``."""
    state = check_identity(state, expected, what, "epoch", "yielded")
    epoch, yielded = check_epoch(state["epoch"]), state["yielded"]
    if not is_int(yielded) or not 0 <= yielded <= samples:
        raise ValueError(f"cannot resume: yielded={yielded!r} is not in [0, {samples}]")
    return Position(epoch, yielded)


def check_identity(state: object, expected: Mapping[str, object], what: str, *more: str) -> Mapping[str, object]:
    """``state``, once it has every key of ``expected`` (and ``more``) and they match."""
    if not isinstance(state, Mapping):
        raise ValueError(f"a {what} state is a dict, got {type(state).__name__}")
    missing = sorted({*expected, *more} - state.keys())
    if missing:
        raise ValueError(f"not a {what} state: missing {', '.join(missing)}")
    for key, value in expected.items():
        if state[key] != value:
            raise ValueError(f"cannot resume: the state was saved with {key}={state[key]!r}, this {what} has {key}={value!r}")
    return state
