"""Delta checkpoints (DESIGN §3): ``ck = client.checkpoints(prefix, keep=K)``.

``pending = await ck.save(step, state)`` takes a nested dict (str keys) whose leaves are numpy
arrays, CPU torch tensors, bytes-likes and JSON scalars (None, bool, int, float, str, and
lists of them).  What it does before it returns is the only time training waits:

1. flatten and check the state (an unsupported leaf is a TypeError, before anything else);
2. cut every array's bytes into ``chunk_size`` chunks and hash each (xxh3-128, on the
   client's threads: it releases the GIL);
3. compare with the previous checkpoint's manifest: a chunk whose digest, entry name,
   dtype, shape and chunk size match is *reused*: its ChunkRef is taken as is;
4. look the other chunks up in the bucket's chunk index (``dedup=True``, the default;
   blobsdk/write/dedup.py): a chunk any checkpoint of the bucket stored, under any prefix,
   is reused too, once the entry's ref is checked to be that chunk (its length, and its
   checksum against the chunk's xxh3-64: an entry that fails is ignored, the chunk written,
   ``ck.index_entries_refused`` counts it); a chunk repeated within the save is written once;
5. copy only the chunks left into staging buffers (reused from save to save).
(blobsdk/write/stage.py does 2-5.)

Then, in the background: the changed chunks are checksummed, maybe compressed, packed into
new blocks and written durably (``Writer.write_chunks``), and one metadata transaction
(``commit_many``) creates ``PREFIX/<step>/data`` (a blob whose plan lists every chunk of the
checkpoint, new and reused, entry after entry), ``PREFIX/<step>/manifest`` (the entries:
names, kinds, dtypes, shapes, their chunks and digests) and moves ``PREFIX/latest`` with a
compare-and-swap on the version this save started from.  The chunks it stored anew are
then recorded in the bucket's chunk index.  So a crash at any moment leaves
the previous checkpoint intact and the new one absent or complete; its unreferenced blocks
are collected by ``client.gc`` like any write's.  With L3 nodes, the committed data blob is
then prefetched into L3 in the background (the nodes pull the new chunks from L4), so a
restore reads from flash; ``pending.wait()`` does not wait for that.  ``await pending.wait()`` returns once it is
committed; ``pending.done``, ``pending.error``.  At most one save is in flight: a second
``save`` first waits for the first to end.

A reused chunk is named by the new data plan, so every block a kept checkpoint needs stays
referenced by a live plan and gc never deletes it.  A save that reuses a chunk through the
index while gc collects it (its entry swept, nothing else naming it) fails with
BlockCollected, never commits a name of a deleted block.  Retention keeps the last ``keep``
checkpoints: older manifests are deleted first, then their data blobs (a crash between the
two leaves a data blob without a manifest, which the next save's retention deletes).

Distributed saves write *parts*: ``part = await ck.write_part(state)`` writes a state's
changed chunks durably (compared with the latest checkpoint, as a save's are) and commits
nothing; ``await ck.commit(step, parts)`` commits the parts of every rank as one checkpoint,
in the same one transaction, refused if ``latest`` moved since the parts were compared with
it.  A save is a part of its own committed at once.

``await ck.remove(step)`` deletes one (``latest`` moves back first if it named it).
``await ck.load(step=None)`` (None: the latest) reads the data blob through the tiers (chunks
in parallel, every one verified, none filled into L1) straight into one fresh buffer and
rebuilds the state exactly: nesting, dtypes, shapes, scalars; arrays are views of that
buffer.  A chunk saved as patches (``mirror=True``, blobsdk/write/stage.py) is read as its
base, then its patches are applied in order.  ``load(select=...)`` reads only the leaves whose name it accepts.
Every chunk read is then checked against the xxh3-128 digest its manifest holds (on the
client's threads; a mismatch is CorruptData naming the checkpoint and the leaf), so a data
plan that names other bytes than the ones saved (a bad index entry an older build reused, a
plan rewritten) is never returned as the state.
``load(into=state)`` restores in place: each leaf's chunks are read straight into the
caller's array or tensor of that name (one scatter read), refused before anything is read if
one cannot take them (other kind, dtype or shape, not contiguous, read-only); a leaf ``state``
lacks goes into fresh memory and is set in it (blobsdk/write/restore.py has the rule).  ``await
ck.list()`` lists the kept steps.

``trust_version_counters=True`` (off by default) skips hashing a tensor that did not change:
each tensor leaf's stamp (blobsdk/write/leaves.py: its storage by identity, its view of it,
and its version counter, which every in-place op on it or its views bumps) is kept with the
checkpoint this object commits; the next save compared with that same checkpoint reuses, unread, a
tensor whose stamp is the same.  Numpy arrays, inference tensors and any other base are
always hashed.  Unsound for writes that bypass the counter: through ``.data``, a numpy view
(``t.numpy()[...] = x``), the numpy array a tensor was made from, another tensor over the
same memory made outside autograd, or another process: such a change is not saved.
``ck.hashed_bytes`` counts what was hashed.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

import msgspec

from .._arguments import check_callable, check_flag, check_number, check_str, wrong
from .._extras import requires_extra
from .._numbers import integer, positive
from ..chunks import validate_writable
from ..errors import BlobError, BlobNotFound, CorruptData, PreconditionFailed
from ..metadata import PlanLister, PlanReader, PlanWriter
from ..wire import MAX_CHUNK_BYTES, ChunkRef, CommitOp, ReadPlan
from ._compare import Base
from .dedup import ChunkIndex, KnownChunks
from .leaves import Stamp, flatten
from .manifest import Entry, Manifest, Part, check_manifest
from .restore import restore, selected
from .stage import REWRITE_AT, Staged, Stager
from .writer import Writer, plan_of, split

_log = logging.getLogger(__name__)

_HASH_BATCH = 16 << 20  # bytes hashed per executor job
_STEP_DIGITS = 12
_STEP = re.compile(rb"0|[1-9][0-9]{0,%d}" % (_STEP_DIGITS - 1))  # what ``latest`` holds: str(step)


class CheckpointMetadata(PlanReader, PlanWriter, PlanLister, Protocol):
    """What checkpoints ask of the metadata store: their plans read, written and listed."""


class Pending:
    """A save in the background; see the module docstring."""

    def __init__(self, step: int, task: asyncio.Task[Manifest]) -> None:
        self.step = step
        self._task = task

    @property
    def done(self) -> bool:
        return self._task.done()

    @property
    def error(self) -> BaseException | None:
        """Why the save failed (None while it runs or once it succeeded)."""
        if not self._task.done() or self._task.cancelled():
            return None
        return self._task.exception()

    async def wait(self) -> Manifest:
        """The committed manifest, or the error that stopped the save."""
        return await asyncio.shield(self._task)


class Checkpoints:
    """The checkpoints under ``prefix``; made by ``Client.checkpoints``."""

    def __init__(
        self,
        prefix: str,
        *,
        metadata: CheckpointMetadata,
        writer: Writer,
        read: Callable[[ReadPlan], Awaitable[bytearray]],
        read_into: Callable[[ReadPlan, memoryview | Sequence[memoryview], bool], Awaitable[None]],
        executor: Executor,
        keep: int,
        chunk_size: int,
        background: set[asyncio.Task[Any]] | None = None,
        warm: Callable[[str], object] | None = None,
        trust_version_counters: bool = False,
        dedup: bool = True,
        mirror: bool = False,
        rewrite_at: float = REWRITE_AT,
        known: KnownChunks | None = None,
    ) -> None:
        prefix = check_str("checkpoints: prefix", prefix)
        prefix = prefix.removesuffix("/") if prefix != "/" else prefix  # a directory's
        validate_writable(prefix + "/x")
        check_number("keep", keep, integer(1))  # before anything is written (nan once committed, then failed)
        check_number("chunk_size", chunk_size, integer(1, MAX_CHUNK_BYTES))
        check_number("rewrite_at", rewrite_at, positive(), unit=" (a share of a chunk)")
        for name, flag in (("trust_version_counters", trust_version_counters), ("dedup", dedup), ("mirror", mirror)):
            check_flag(f"checkpoints: {name}", flag)
        if mirror:
            with requires_extra("numpy", "checkpoints(mirror=True)"):  # a chunk is compared with its mirror copy by numpy
                import numpy  # noqa: F401
        self.prefix = prefix
        self.keep = keep
        self.chunk_size = chunk_size
        self._metadata, self._writer, self._read, self._executor = metadata, writer, read, executor
        self._read_into = read_into
        self._pending: Pending | None = None
        self._base: Base | None = None  # the last checkpoint this object committed
        self._background = background if background is not None else set()
        self._warm = warm  # starts an L3 prefetch of a path, when the client has L3
        index = ChunkIndex(metadata, prefix, executor, read, known if known is not None else KnownChunks()) if dedup else None
        self._index = index  # the bucket's chunks, by content
        self._stager = Stager(
            chunk_size=chunk_size,
            writer=writer,
            executor=executor,
            index=self._index,
            trust_version_counters=trust_version_counters,
            mirror=mirror,
            rewrite_at=rewrite_at,
        )
        self._unclaimed: list[tuple[Part, dict[tuple[str, ...], Stamp]]] = []  # parts written, their stamps

    @property
    def hashed_bytes(self) -> int:
        """How many bytes this object's saves and parts have hashed while the caller waited (a
        tensor whose version stamp matched is not hashed; with ``mirror``, a chunk compared with
        its mirror copy is not, and a changed one is hashed in the background)."""
        return self._stager.hashed_bytes

    @property
    def index_entries_refused(self) -> int:
        """How many chunk index entries this object's saves found but did not reuse: their ref
        was not the chunk they are named for (blobsdk/write/dedup.py)."""
        return 0 if self._index is None else self._index.refused

    # --- paths -----------------------------------------------------------------------------

    def _step_dir(self, step: int) -> str:
        return f"{self.prefix}/{step:0{_STEP_DIGITS}d}"

    @property
    def _latest_path(self) -> str:
        return f"{self.prefix}/latest"

    # --- save ------------------------------------------------------------------------------

    async def save(self, step: int, state: Mapping[str, Any]) -> Pending:
        """Stage ``state`` as checkpoint ``step`` and return once it is safe to change it."""
        _check_step(step)
        leaves = list(flatten(state, ()))  # TypeError for what cannot be saved, before any work
        await self._idle()
        base = await self._latest()
        staged = await self._stager.stage(leaves, base, copy=True, own=base is not None and base is self._base)
        task = asyncio.get_running_loop().create_task(self._save(step, staged, base), name=f"blobsdk-ckpt-{step}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieved)  # its error belongs to its Pending: never "never retrieved"
        self._pending = Pending(step, task)
        return self._pending

    async def _save(self, step: int, staged: Staged, base: Base | None) -> Manifest:
        return await self._commit_parts(step, [await self._stager.write(staged, base)], base, staged.stamps)

    async def write_part(self, state: Mapping[str, Any]) -> Part:
        """Write ``state``'s changed chunks durably without committing anything, for
        :meth:`commit` to make part of a checkpoint: how each rank of a distributed save
        writes its own share (blobsdk.dcp).  Nothing is staged: it returns once written,
        and ``state`` must not change until then.  Its blocks are orphans, collected by gc,
        unless a commit names them within the write config's ``max_write_seconds``."""
        leaves = list(flatten(state, ()))
        await self._idle()
        base = await self._latest()
        staged = await self._stager.stage(leaves, base, copy=False, own=base is not None and base is self._base)
        part = await self._stager.write(staged, base)
        if staged.stamps:  # valid once this object commits the part
            self._unclaimed = [*self._unclaimed[-3:], (part, staged.stamps)]
        return part

    async def commit(self, step: int, parts: Sequence[Part]) -> Manifest:
        """Commit ``parts`` (from :meth:`write_part`, by any process) as checkpoint ``step``,
        atomically, as a save does; their entry names must not repeat.  PreconditionFailed
        if a checkpoint was saved or removed since the parts were written."""
        _check_step(step)
        _check_parts(parts)
        await self._idle()
        base = await self._latest()
        version = base.latest_version if base is not None else 0
        for part in parts:
            if part.base_version != version:
                raise PreconditionFailed(
                    f"checkpoint {step} under {self.prefix}: a part was compared with version {part.base_version} of"
                    f" latest, now {version}: another writer saved or removed a checkpoint since"
                )
            if part.chunk_size != self.chunk_size:
                raise ValueError(f"a part cut in {part.chunk_size}-byte chunks, this prefix's are {self.chunk_size}")
        stamps = {name: stamp for mine, of in self._unclaimed if any(mine is p for p in parts) for name, stamp in of.items()}
        manifest = await self._commit_parts(step, parts, base, stamps)
        self._unclaimed = []
        return manifest

    async def _idle(self) -> None:
        """Wait for the save in flight, if any, to end (its error is its own)."""
        if self._pending is not None:
            await asyncio.gather(self._pending._task, return_exceptions=True)

    async def _commit_parts(
        self, step: int, parts: Sequence[Part], base: Base | None, stamps: dict[tuple[str, ...], Stamp]
    ) -> Manifest:
        """Commit ``parts`` as checkpoint ``step`` (see :meth:`_commit`), retire old ones, warm L3."""
        self._writer.check_age({block for part in parts for block in part.new_blocks})  # reused: held by live plans
        refs: list[ChunkRef] = []
        entries: list[Entry] = []
        for part in parts:
            entries.extend(msgspec.structs.replace(e, first=e.first + len(refs)) for e in part.entries)
            refs.extend(part.chunks)
        names = [entry.name for entry in entries]
        if len(set(names)) != len(names):
            repeated = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"checkpoint {step}: entry {'/'.join(repeated)!r} is in more than one part")
        new_bytes = sum(e.new_bytes for e in entries)
        manifest = Manifest(
            step=step,
            created=time.time(),
            chunk_size=self.chunk_size,
            entries=tuple(entries),
            new_bytes=new_bytes,
            reused_bytes=sum(e.nbytes for e in entries) - new_bytes,
        )
        await self._commit(step, refs, manifest, base, stamps)
        await self._record(entries, refs, {block for part in parts for block in part.new_blocks})
        await self._retire()
        if self._warm is not None:  # the L3 nodes pull its new chunks from L4 (cached ones are only pinned)
            self._warm(f"{self._step_dir(step)}/data")
        return manifest

    async def _commit(
        self, step: int, refs: list[ChunkRef], manifest: Manifest, base: Base | None, stamps: dict[tuple[str, ...], Stamp]
    ) -> None:
        """One transaction: the data plan and the manifest (create-only) and ``latest``
        (compare-and-swap on the version this save started from)."""
        directory = self._step_dir(step)
        pieces = split(msgspec.msgpack.encode(manifest), self.chunk_size)
        *manifest_refs, latest_ref = await self._writer.write_chunks([*pieces, memoryview(str(step).encode())])
        latest_refs = [latest_ref]
        ops = [
            CommitOp(path=f"{directory}/data", plan=plan_of(f"{directory}/data", refs, self.chunk_size), if_version=0),
            CommitOp(path=f"{directory}/manifest", plan=plan_of(f"{directory}/manifest", manifest_refs), if_version=0),
            CommitOp(
                path=self._latest_path,
                plan=plan_of(self._latest_path, latest_refs),
                if_version=0 if base is None else base.latest_version,
            ),
        ]
        try:
            data, _, latest = await self._metadata.commit_many(ops)
        except PreconditionFailed as exc:
            raise PreconditionFailed(
                f"checkpoint {step} under {self.prefix}: the step exists, or another writer saved or removed a checkpoint"
                f" since this save began ({exc})"
            ) from exc
        self._base = Base(manifest, data, latest.version, stamps)  # the next save's base, without a read

    async def _record(self, entries: Sequence[Entry], refs: Sequence[ChunkRef], new_blocks: set[str]) -> None:
        """Record in the bucket's chunk index the chunks this checkpoint stored anew (any of
        whose refs is in a block it wrote).  Best effort: the checkpoint is committed, so a
        failure only loses later saves' dedup against these chunks, and is logged."""
        if self._index is None:
            return
        chunks = []
        for entry in entries:
            for digest, span, patches in zip(entry.digests, entry.chunk_refs(), entry.patch_counts(), strict=True):
                held = tuple(refs[i] for i in span)
                if not patches and len(held) == 1 and held[0].block_id in new_blocks:  # a patched chunk's refs are no copy
                    chunks.append((digest, held))
        try:
            await self._index.record(chunks)
        except BlobError as exc:
            _log.warning("checkpoints under %s: the chunk index was not updated: %s", self.prefix, exc)

    async def _retire(self) -> None:
        """Delete all but the last ``keep`` checkpoints: manifests first, then their data."""
        steps, data_only = await self._scan()
        for step in steps[: -self.keep]:
            await self._delete_quietly(f"{self._step_dir(step)}/manifest")
            data_only.add(step)
        for step in sorted(data_only):
            await self._delete_quietly(f"{self._step_dir(step)}/data")

    async def remove(self, step: int) -> None:
        """Delete checkpoint ``step`` (BlobNotFound if there is none).  If it is the latest,
        ``latest`` first moves to the newest one left (compare-and-swap), or goes."""
        _check_step(step)
        steps = await self.list()
        if step not in steps:
            raise BlobNotFound(f"no checkpoint {step} under {self.prefix}")
        latest = await self._latest()
        if latest is not None and latest.manifest.step == step:
            rest = [s for s in steps if s != step]
            if rest:
                (ref,) = await self._writer.write_chunks([memoryview(str(rest[-1]).encode())])
                op = CommitOp(path=self._latest_path, plan=plan_of(self._latest_path, [ref]), if_version=latest.latest_version)
                await self._metadata.commit_many([op])
            else:
                await self._metadata.delete(self._latest_path, if_version=latest.latest_version)
            self._base = None
        await self._delete_quietly(f"{self._step_dir(step)}/manifest")
        await self._delete_quietly(f"{self._step_dir(step)}/data")

    async def _delete_quietly(self, path: str) -> None:
        with contextlib.suppress(BlobNotFound):  # gone already (another writer's retention)
            await self._metadata.delete(path)

    # --- read --------------------------------------------------------------------------------

    async def list(self) -> builtins.list[int]:
        """The steps of the kept checkpoints, oldest first."""
        return (await self._scan())[0]

    async def _scan(self) -> tuple[builtins.list[int], set[int]]:
        """The steps with a manifest, sorted; and those with only a data blob."""
        manifests: set[int] = set()
        datas: set[int] = set()
        async for info in self._metadata.list(self.prefix + "/"):
            parts = info.path[len(self.prefix) + 1 :].split("/")
            if len(parts) == 2 and parts[0].isdigit() and len(parts[0]) == _STEP_DIGITS:
                (manifests if parts[1] == "manifest" else datas).add(int(parts[0]))
        return sorted(manifests), datas - manifests

    async def manifest(self, step: int | None = None) -> Manifest:
        """The manifest of ``step`` (None: the latest); BlobNotFound if there is none."""
        _check_step(step, optional=True)
        if step is None:
            base = await self._latest()
            if base is None:
                raise BlobNotFound(f"no checkpoint under {self.prefix}")
            return base.manifest
        return await self._manifest_of(step)

    async def load(
        self,
        step: int | None = None,
        *,
        select: Callable[[tuple[str, ...]], bool] | None = None,
        into: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The state saved as ``step`` (None: the latest), rebuilt exactly; with ``select``,
        only the leaves whose name (their keys from the root) it accepts, and only their
        chunks are read.  With ``into`` (a state shaped like the saved one), its arrays and
        tensors are filled in place and it is returned: see blobsdk/write/restore.py."""
        check_callable("load: select", select)
        manifest = await self.manifest(step)
        plan = await self._metadata.get_plan(f"{self._step_dir(manifest.step)}/data")
        if select is not None:
            manifest, plan = selected(manifest, plan, select)
        state: dict[str, Any] = {} if into is None else into  # {}: every array into one fresh buffer
        # a restore is read once: L1 keeps its working set (fill_memory=False)
        await restore(
            manifest,
            plan,
            state,
            lambda part, outs: self._read_into(part, outs, False),
            executor=self._executor,
            where=f"checkpoint {manifest.step} under {self.prefix}",
        )
        return state

    def _pointed_step(self, raw: bytes) -> int:
        """The step ``latest`` names (a save writes ``str(step)``); it is a blob of the prefix,
        which any writer of the bucket can replace: CorruptData unless it is such a step."""
        if not _STEP.fullmatch(raw):
            raise CorruptData(f"checkpoint pointer {self._latest_path} holds {raw[:40]!r}, not a step")
        return int(raw)

    async def _manifest_of(self, step: int) -> Manifest:
        path = f"{self._step_dir(step)}/manifest"
        try:
            raw = await self._read(await self._metadata.get_plan(path))
        except BlobNotFound:
            raise BlobNotFound(f"no checkpoint {step} under {self.prefix}") from None
        where = f"checkpoint {step} under {self.prefix}"
        try:
            manifest = msgspec.msgpack.decode(raw, type=Manifest)
        except msgspec.DecodeError as exc:
            raise CorruptData(f"{where}: its manifest does not decode: {exc}") from exc
        return check_manifest(manifest, step, where)

    async def _latest(self) -> Base | None:
        """The latest checkpoint (its manifest, its data plan, the version of ``latest``)."""
        try:
            latest = await self._metadata.get_plan(self._latest_path)
        except BlobNotFound:
            return None
        if self._base is not None and self._base.latest_version == latest.version:
            return self._base  # still the one this object saved last
        step = self._pointed_step(bytes(await self._read(latest)))
        manifest = await self._manifest_of(step)
        plan = await self._metadata.get_plan(f"{self._step_dir(step)}/data")
        return Base(manifest, plan, latest.version)


def _check_step(step: object, *, optional: bool = False) -> None:
    """A step to save, or to read (``optional``: None is the latest)."""
    check_number("step", step, integer(0, 10**_STEP_DIGITS - 1, optional=optional))


def _check_parts(parts: object) -> None:
    """commit's ``parts``: a list of what write_part returned."""
    if not isinstance(parts, Sequence) or isinstance(parts, str | bytes):
        raise wrong("commit: parts", "a list of parts (what write_part returned)", parts)
    for part in parts:
        if not isinstance(part, Part):
            raise wrong("commit: each part", "a Part (what write_part returned)", part)


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
