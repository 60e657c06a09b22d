"""The soak's model: which bytes a path may hold, and what a read of it may return.

Every value the soak writes is a pure function of ``(seed, path, seq, size)``
(:func:`value`): a 32-byte header (magic, seq, size, a digest of seed and path) and a
payload drawn from those, so a read is checked without keeping any bytes, and a header
names the write it came from.

Each key belongs to one task of one client process, which runs its ops one at a time, so its
history is exact: a list of writes (a put of ``seq``, or a delete), each ``acked``, or
``failed`` (its outcome unknown: it may or may not have landed).  A read that started after
write ``k`` was acked may return the state of the newest acked write, or of any failed write
after it (they may have landed).  Anything older is **stale** (read-your-writes broken); bytes
that match no write of this path are **wrong**.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import xxhash

MAGIC = b"SOAK"
HEADER = struct.Struct("<4sQQQI")  # magic, seq, size, digest of (seed, path), pad
HEADER_SIZE = HEADER.size  # 32
ABSENT = None  # the state of a path with no live version

State = tuple[int, int] | None  # (seq, size) of a put, or ABSENT


def path_digest(seed: int, path: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{seed}:{path}".encode())


def value(seed: int, path: str, seq: int, size: int) -> bytes:
    """The bytes of write ``seq`` of ``path`` (``size`` >= HEADER_SIZE)."""
    header = HEADER.pack(MAGIC, seq, size, path_digest(seed, path), 0)
    body = size - HEADER_SIZE
    rng = random.Random(xxhash.xxh3_64_intdigest(f"{seed}:{path}:{seq}".encode()))
    if seq % 3 == 0:  # a compressible one now and then: the lz4 path too
        return header + (rng.randbytes(64) * (body // 64 + 1))[:body]
    return header + rng.randbytes(body)


def header_of(data: bytes | bytearray, seed: int, path: str) -> tuple[int, int] | None:
    """(seq, size) that ``data``'s header claims for ``path``; None if it is no header of it."""
    if len(data) < HEADER_SIZE:
        return None
    magic, seq, size, digest, _ = HEADER.unpack_from(data)
    if magic != MAGIC or digest != path_digest(seed, path):
        return None
    return seq, size


@dataclass
class Write:
    seq: int  # unique within the key (a client's counter)
    size: int | None  # None: a delete
    status: str = "pending"  # "acked" | "failed" (unknown outcome)

    @property
    def state(self) -> State:
        return None if self.size is None else (self.seq, self.size)


@dataclass
class KeyModel:
    """One key's history (see the module docstring)."""

    path: str
    writes: list[Write] = field(default_factory=list)

    def begin(self, seq: int, size: int | None) -> Write:
        write = Write(seq, size)
        self.writes.append(write)
        return write

    def _last_acked(self) -> int:
        for i in range(len(self.writes) - 1, -1, -1):
            if self.writes[i].status == "acked":
                return i
        return -1

    def allowed(self) -> list[State]:
        """States a read starting now may return: the newest acked write's and any later
        write's (failed or in flight: it may have landed)."""
        last = self._last_acked()
        base: list[State] = [ABSENT if last < 0 else self.writes[last].state]
        return base + [w.state for w in self.writes[last + 1 :]]

    def written(self) -> dict[int, int]:
        """seq -> size of every put ever issued for this key."""
        return {w.seq: w.size for w in self.writes if w.size is not None}

    def observed(self, state: State) -> None:
        """A read returned ``state``, one of :meth:`allowed`: a failed write it shows has landed,
        so later reads must not go back before it."""
        last = self._last_acked()
        for i in range(len(self.writes) - 1, last, -1):
            if self.writes[i].status != "pending" and self.writes[i].state == state:
                self.writes[i].status = "acked"
                return

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "writes": [[w.seq, w.size, w.status] for w in self.writes]}

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> KeyModel:
        writes = raw["writes"]
        assert isinstance(writes, list) and isinstance(raw["path"], str)
        return cls(raw["path"], [Write(seq, size, status) for seq, size, status in writes])


@dataclass
class Verdict:
    """What one read showed: "ok", "stale" (an older write: read-your-writes broken), or
    "wrong" (bytes no write of this path had, or a header that does not match its bytes)."""

    kind: str
    detail: str = ""


def judge_full(seed: int, key: KeyModel, allowed: list[State], data: bytes | bytearray | None) -> Verdict:
    """A whole-blob read (``data`` None: not found) against ``allowed`` (taken at its start)."""
    if data is None:
        return Verdict("ok") if ABSENT in allowed else Verdict("stale", f"{key.path}: not found, allowed {allowed}")
    head = header_of(data, seed, key.path)
    written = key.written()
    if head is None or written.get(head[0]) != head[1] or len(data) != head[1]:
        return Verdict("wrong", f"{key.path}: {len(data)} bytes with header {head}, written {sorted(written.items())[-5:]}")
    if bytes(data) != value(seed, key.path, *head):
        return Verdict("wrong", f"{key.path}: bytes of seq {head[0]} differ from those written")
    if head not in allowed:
        return Verdict("stale", f"{key.path}: seq {head[0]} read, allowed {allowed}")
    return Verdict("ok")


def judge_range(
    seed: int, key: KeyModel, allowed: list[State], offset: int, length: int, data: bytes | bytearray | None
) -> Verdict:
    """A ranged read ``[offset, offset + length)`` against ``allowed``; the range of an older
    write is stale, one of no write wrong."""
    if data is None:
        return Verdict("ok") if ABSENT in allowed else Verdict("stale", f"{key.path}: not found, allowed {allowed}")

    def holds(state: tuple[int, int]) -> bool:
        return value(seed, key.path, *state)[offset : offset + length] == data

    if any(state is not None and holds(state) for state in allowed):
        return Verdict("ok")
    if matches := [state for state in key.written().items() if holds(state)]:
        return Verdict("stale", f"{key.path}[{offset}:+{length}]: bytes of seqs {matches}, allowed {allowed}")
    return Verdict("wrong", f"{key.path}[{offset}:+{length}]: {len(data)} bytes that no write of it had")
