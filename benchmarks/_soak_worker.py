"""One client process of the soak: ``python -m benchmarks._soak_worker SPEC_JSON``.

It opens a client of the spec's ``client.toml`` and runs ``tasks`` tasks until its deadline,
each a seeded random mix of put, get, ranged get, delete, list, put_many, checkpoint save and
load, reads of the shared read-only dataset and, now and then, gc, on its own keys (one op at
a time per task, so its model is exact: benchmarks/_soak_model.py).  Every read is checked
against the model as it returns.  At the end it writes its counters, its violations and every
key's history to the spec's ``out`` file (what the final check verifies), and exits.

It exits at once if its stdin reaches EOF: the soak that started it is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import blobsdk
from blobsdk.config import ClientConfig
from blobsdk.errors import BlobError, BlobNotFound, BlockNotFound

from ._soak_model import ABSENT, HEADER_SIZE, KeyModel, State, Verdict, header_of, judge_full, judge_range, value

KEYS_PER_TASK = 12
CKPT_WORDS = 1 << 16  # float32 words of a checkpoint's array: 256 KiB
CKPT_CHUNK = 32 << 10
CKPT_KEEP = 2
GC_EVERY_S = 15.0  # at most one gc per process this often
OPS = {  # op -> weight
    "put": 24,
    "get": 22,
    "range": 14,
    "delete": 6,
    "list": 6,
    "put_many": 7,
    "ckpt_save": 5,
    "ckpt_load": 5,
    "shared": 10,
    "gc": 1,
}
READS = ("get", "range", "ckpt_load", "shared")  # a BlockNotFound of one is a lost write


@dataclass
class Spec:
    config: str
    index: int
    tasks: int
    seed: int
    duration_s: float
    out: str
    shared: list[tuple[str, int, int]]  # path, seq, size of the read-only dataset
    gc_grace_s: float
    op_timeout_s: float


def blob_size(rng: random.Random) -> int:
    """Mostly small, some multi-chunk, a few of several MiB."""
    roll = rng.random()
    if roll < 0.7:
        return rng.randint(HEADER_SIZE, 64 << 10)
    if roll < 0.95:
        return rng.randint(64 << 10, 1 << 20)
    return rng.randint(1 << 20, 3 << 20)


def ckpt_state(seed: int, prefix: str, step: int) -> dict[str, Any]:
    """Checkpoint ``step``'s state: a base array with one eighth of it changed per step (so
    saves are deltas), and the step."""
    words = np.random.default_rng([seed, len(prefix)]).random(CKPT_WORDS, dtype=np.float32)
    part = CKPT_WORDS // 8
    at = (step % 8) * part
    words[at : at + part] = np.random.default_rng([seed, step]).random(part, dtype=np.float32)
    return {"w": words, "step": step, "tag": f"{prefix}:{step}".encode()}


@dataclass
class Tally:
    ops: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    errors_by_op: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)  # error class -> one message
    violations: dict[str, list[str]] = field(default_factory=lambda: {"wrong": [], "stale": [], "lost": []})
    longest_s: float = 0.0
    longest_op: str = ""

    def judge(self, verdict: Verdict) -> None:
        if verdict.kind != "ok":
            self.violations[verdict.kind].append(f"{time.strftime('%H:%M:%S')} {verdict.detail}")


class Task:
    """One task: its own keys, its own checkpoint prefix, one op at a time."""

    def __init__(self, client: blobsdk.Client, spec: Spec, number: int, tally: Tally, gc_lock: asyncio.Lock) -> None:
        self.client, self.spec, self.tally, self.gc_lock = client, spec, tally, gc_lock
        self.rng = random.Random(f"{spec.seed}:{spec.index}:{number}")
        self.prefix = f"/soak/w{spec.index}/t{number}/"
        self.keys = [KeyModel(f"{self.prefix}k{i:02d}") for i in range(KEYS_PER_TASK)]
        self.ckpt_prefix = f"/soak/ckpt/w{spec.index}t{number}"
        self.ckpt = KeyModel(self.ckpt_prefix)
        self.checkpoints = client.checkpoints(self.ckpt_prefix, keep=CKPT_KEEP, chunk_size=CKPT_CHUNK)
        self.seq = 0
        self.last_gc = -GC_EVERY_S

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def run(self, deadline: float) -> None:
        names, weights = list(OPS), list(OPS.values())
        while time.monotonic() < deadline:
            op = self.rng.choices(names, weights)[0]
            if op == "gc" and (time.monotonic() - self.last_gc < GC_EVERY_S or self.gc_lock.locked()):
                continue
            await self.timed(op)

    async def timed(self, op: str) -> None:
        self.tally.ops[op] += 1
        began = time.monotonic()
        try:
            async with asyncio.timeout(self.spec.op_timeout_s):
                await getattr(self, f"op_{op}")()
            self.tally.ok[op] += 1
        except BlockNotFound as exc:
            self._error(op, type(exc).__name__, exc)
            if op in READS:  # the live version of a key only this task writes: committed, so its blocks must be there
                where = self.ckpt_prefix if op == "ckpt_load" else "its key"
                self.tally.violations["lost"].append(f"{time.strftime('%H:%M:%S')} (its clock) {op} of {where}: {exc}")
        except BlobError as exc:
            self._error(op, type(exc).__name__, exc)
        except TimeoutError as exc:  # the soak's own bound on one op
            self._error(op, "SoakOpTimeout", exc)
        except Exception as exc:  # noqa: BLE001 - a foreign exception is a finding: counted, named, and the soak goes on
            self._error(op, f"foreign:{type(exc).__name__}", exc)
        seconds = time.monotonic() - began
        if seconds > self.tally.longest_s:
            self.tally.longest_s, self.tally.longest_op = seconds, op

    def _error(self, op: str, name: str, exc: BaseException) -> None:
        self.tally.errors[name] += 1
        self.tally.errors_by_op[f"{op}:{name}"] += 1
        self.tally.samples.setdefault(name, f"{op}: {exc}"[:300])

    # --- writes: begin in the model, acked or failed by the outcome -----------------------

    async def op_put(self) -> None:
        key = self.rng.choice(self.keys)
        size = blob_size(self.rng)
        write = key.begin(self.next_seq(), size)
        await self._settle([write], self.client.put(key.path, value(self.spec.seed, key.path, write.seq, size)))

    async def op_delete(self) -> None:
        key = self.rng.choice(self.keys)
        allowed = key.allowed()
        write = key.begin(self.next_seq(), None)
        try:
            await self.client.delete(key.path)
        except BlobNotFound:  # nothing live: fine if nothing may be, read-your-writes broken if not
            write.status = "acked"
            if ABSENT not in allowed:
                self.tally.judge(Verdict("stale", f"delete {key.path}: not found, allowed {allowed}"))
            return
        except BaseException:
            write.status = "failed"
            raise
        write.status = "acked"

    async def op_put_many(self) -> None:
        keys = self.rng.sample(self.keys, self.rng.randint(2, 5))
        writes = [key.begin(self.next_seq(), self.rng.randint(HEADER_SIZE, 48 << 10)) for key in keys]
        items = [(key.path, value(self.spec.seed, key.path, w.seq, w.size or 0)) for key, w in zip(keys, writes, strict=True)]
        await self._settle(writes, self.client.put_many(items))

    async def op_ckpt_save(self) -> None:
        step = self.next_seq()
        write = self.ckpt.begin(step, 1)

        async def save() -> None:
            pending = await self.checkpoints.save(step, ckpt_state(self.spec.seed, self.ckpt_prefix, step))
            await pending.wait()

        await self._settle([write], save())

    async def _settle(self, writes: list[Any], work: Any) -> None:
        try:
            await work
        except BaseException:
            for w in writes:
                w.status = "failed"
            raise
        for w in writes:
            w.status = "acked"

    # --- reads: judged against the model taken when they start ----------------------------

    async def op_get(self) -> None:
        key = self.rng.choice(self.keys)
        allowed = key.allowed()
        data = await self._read(key.path)
        self._judge(key, judge_full(self.spec.seed, key, allowed, data), data)

    async def op_range(self) -> None:
        key = self.rng.choice(self.keys)
        allowed = key.allowed()
        sizes = [s[1] for s in allowed if s is not None] or [1 << 16]
        offset = self.rng.randrange(max(sizes))
        length = self.rng.randint(1, 256 << 10)
        data = await self._read(key.path, offset, length)
        verdict = judge_range(self.spec.seed, key, allowed, offset, length, data)
        self.tally.judge(verdict)

    async def _read(self, path: str, offset: int = 0, length: int | None = None) -> bytearray | None:
        try:
            return await self.client.get(path, offset, length)
        except BlockNotFound:
            raise  # a plan naming a block that is gone: counted as an error, never as "absent"
        except BlobNotFound:
            return None

    def _judge(self, key: KeyModel, verdict: Verdict, data: bytearray | None) -> None:
        self.tally.judge(verdict)
        if verdict.kind == "ok":
            key.observed(None if data is None else header_of(data, self.spec.seed, key.path))

    async def op_list(self) -> None:
        allowed = {key.path: key.allowed() for key in self.keys}
        listed = {info.path: info.size async for info in self.client.list(self.prefix)}
        for path, states in allowed.items():
            sizes = {s[1] for s in states if s is not None}
            if path in listed and listed[path] not in sizes:
                self.tally.judge(Verdict("stale", f"list {path}: size {listed[path]}, allowed {states}"))
            elif path not in listed and None not in states:
                self.tally.judge(Verdict("stale", f"list: {path} missing, allowed {states}"))
        for path in set(listed) - set(allowed):
            self.tally.judge(Verdict("wrong", f"list {self.prefix}: {path} was never written"))

    async def op_ckpt_load(self) -> None:
        allowed = self.ckpt.allowed()
        try:
            state = await self.checkpoints.load()
        except BlockNotFound:
            raise
        except BlobNotFound:
            self.tally.judge(
                Verdict("ok") if ABSENT in allowed else Verdict("stale", f"{self.ckpt_prefix}: no checkpoint, allowed {allowed}")
            )
            return
        self.tally.judge(judge_checkpoint(self.spec.seed, self.ckpt, allowed, state))

    async def op_shared(self) -> None:
        path, seq, size = self.rng.choice(self.spec.shared)
        key = KeyModel(path)
        key.begin(seq, size).status = "acked"
        data = await self._read(path)
        self.tally.judge(judge_full(self.spec.seed, key, key.allowed(), data))

    async def op_gc(self) -> None:
        async with self.gc_lock:
            self.last_gc = time.monotonic()
            await self.client.gc(grace=self.spec.gc_grace_s)


def judge_checkpoint(seed: int, model: KeyModel, allowed: list[State], state: dict[str, Any]) -> Verdict:
    """A loaded checkpoint: its arrays must be exactly those of its step, and the step one
    ``allowed`` (the last acked save or a later one)."""
    step = state.get("step")
    if not isinstance(step, int) or step not in model.written():
        return Verdict("wrong", f"{model.path}: loaded step {step!r}, never saved")
    expected = ckpt_state(seed, model.path, step)
    if state.get("tag") != expected["tag"] or not np.array_equal(state.get("w"), expected["w"]):
        return Verdict("wrong", f"{model.path}: step {step} loaded with other bytes than saved")
    if (step, 1) not in allowed:
        return Verdict("stale", f"{model.path}: step {step} loaded, allowed {allowed}")
    model.observed((step, 1))
    return Verdict("ok")


async def main(spec: Spec) -> None:
    config = ClientConfig.from_toml(spec.config)
    tally = Tally()
    go = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_lifeline, args=(lambda: loop.call_soon_threadsafe(go.set),), name="lifeline", daemon=True).start()
    out: dict[str, Any] | None = None
    try:
        async with blobsdk.Client(config) as client:
            gc_lock = asyncio.Lock()
            tasks = [Task(client, spec, n, tally, gc_lock) for n in range(spec.tasks)]
            print("ready", flush=True)
            await go.wait()
            deadline = time.monotonic() + spec.duration_s
            await asyncio.gather(*(t.run(deadline) for t in tasks))
            out = {
                "index": spec.index,
                "ops": tally.ops,
                "ok": tally.ok,
                "errors": tally.errors,
                "errors_by_op": tally.errors_by_op,
                "samples": tally.samples,
                "violations": tally.violations,
                "longest_s": tally.longest_s,
                "longest_op": tally.longest_op,
                "keys": [k.to_json() for t in tasks for k in (*t.keys, t.ckpt)],
            }
    except Exception as exc:  # a failed close is a finding to report, not a reason to lose the model
        if out is None:
            raise
        out["errors"][f"close:{type(exc).__name__}"] += 1
        out["samples"].setdefault(f"close:{type(exc).__name__}", f"{exc}"[:300])
    _write_atomic(Path(spec.out), json.dumps(out))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _lifeline(go: Callable[[], None]) -> None:
    """The first line on stdin starts the ops; EOF (the soak is gone) ends this process."""
    with suppress(OSError):  # the raw fd: a buffered stdin would hold its lock at interpreter exit
        if os.read(0, 64).strip():
            go()
        while os.read(0, 64):
            pass
    os._exit(3)


if __name__ == "__main__":
    raw = json.loads(Path(sys.argv[1]).read_text())
    raw["shared"] = [tuple(s) for s in raw["shared"]]
    asyncio.run(main(Spec(**raw)))
