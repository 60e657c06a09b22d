"""The replicated read engine: the hedged, verified read of one chunk across a block store's
replicas.  The L4 tier (blobsdk/tiers/_l4.py) and the L3 node's read-through from L4
(servers/flash.py) both read through one.

A chunk's stored bytes are read from each replica of the store in order (the store's
``replicas``), each copy handed to the decoder; the first copy that verifies wins.  A store
of several replicas only writes (blobsdk/sources/_replicated.py): this engine is the one
reader of L4.  It never misses quietly: when every replica failed it raises CorruptData (some
copy was bad), BlockNotFound (every replica said the block is gone) or Unavailable.

A replica that served a bad copy is ranked after the others for a while (bad bytes, kept
with hung in the engine's one :class:`~blobsdk.tail.health.TargetHealth`, which its hedger
shares).  A read that skipped a bad or missing copy and then got a verified one tells its
``report`` (:class:`BlockReport`: the client's repairer, built by blobsdk/assembly.py), so
that the block is mended in the background.

A chunk read straight into the caller's memory (``read_into``, ``read_many_into``) is
verified there, where someone else may write it.  So a failed check there blames nothing yet:
the replica's copy is read again into a buffer of the engine's own and verified (``_recheck``).
If it verifies, the caller's buffer changed under the read: BufferChanged, with nothing
counted corrupt, no replica demoted, no repair; only a copy that fails in the engine's own
memory too is a bad copy.  That costs a second read only when a check fails.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol

from ..chunks import AttemptFn, Call, Decoder, Demand, Piece, Verifier, rank
from ..config import HedgeConfig, RepairConfig
from ..errors import BadCopy, BlobError, BlockNotFound, BufferChanged, CorruptData, HedgeExhausted, SourceChanged, Unavailable
from ..net import LimiterRegistry
from ..runtime import BufferPool
from ..sources import BlockReplica, BlockStore, Span, SpanReader
from ..stats import TierStats
from ..wire import ChunkRef
from .health import Reason, TargetHealth
from .hedge import Hedger

_FAILOVER = (BlockNotFound, Unavailable, CorruptData)  # about one replica: try the next


SLOW_WITHIN_S = 2.0  # a replica's latencies older than this do not rank it


class BlockReport(Protocol):
    """Where a read tells of a block it found a bad or missing copy of, having verified
    another (the client's :class:`~blobsdk.ops.repair.Repairer`)."""

    def report(self, block_id: str) -> None: ...


class ReplicaReader:
    """Verified chunk reads hedged across the replicas of a
    :class:`~blobsdk.sources.base.BlockStore` (not owned: whoever opened the store closes it),
    counted in ``stats``.  ``hedge``, ``limiters``: the hedger's policy and the replicas'
    concurrency limits; ``repair``: how long a replica that served bad bytes is ranked last
    (its ``demote_seconds``); ``report``: told of each block a read skipped a bad or missing
    copy of; ``clock``: the hedger's and the health tracker's (a test's virtual time)."""

    def __init__(
        self,
        blocks: BlockStore,
        stats: TierStats | None = None,
        *,
        hedge: HedgeConfig | None = None,
        limiters: LimiterRegistry | None = None,
        repair: RepairConfig | None = None,
        buffers: BufferPool | None = None,
        report: BlockReport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.blocks = blocks
        self.buffers = buffers if buffers is not None else BufferPool()
        self.stats = stats if stats is not None else TierStats()
        hedge = hedge if hedge is not None else HedgeConfig()
        repair = repair if repair is not None else RepairConfig()
        self.health = TargetHealth(hedge, clock, bad_bytes_seconds=repair.demote_seconds)
        self.hedger = Hedger(hedge, clock=clock, health=self.health)
        self._limiters = limiters if limiters is not None else LimiterRegistry()
        self._report = report
        self._replicas = {r.name: r for r in blocks.replicas}  # a store's replicas are fixed: read once, not per chunk
        self._names = list(self._replicas)
        self._ready = self._has_room  # bound once: a bound method per read is one more object alive in flight

    async def read(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> tuple[memoryview, memoryview]:
        """The verified stored copy of ``ref`` and its raw bytes (a view of that copy for
        an uncompressed chunk), hedged across the replicas in order."""
        read = _CopyRead(self, ref, decode)
        stored, raw = await self._hedged(ref, self.candidates(ref.key), read, demand)
        if read.skipped and self._report is not None:
            self._report.report(ref.block_id)  # a verified copy exists: the others can be mended
        return stored, raw

    async def read_raw(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> memoryview:
        """``read``'s raw bytes alone (its body again, not a call of it: one coroutine less in
        the chain each resumption of the read runs through)."""
        read = _CopyRead(self, ref, decode)
        _, raw = await self._hedged(ref, self.candidates(ref.key), read, demand)
        if read.skipped and self._report is not None:
            self._report.report(ref.block_id)
        return raw

    async def read_into(self, ref: ChunkRef, out: memoryview, decode: Decoder, demand: Demand | None = None) -> bool:
        """``ref``'s verified raw bytes read straight into ``out`` (see DirectTier): only from
        a lone replica, whose one attempt at a time the hedger waits for (patient, in turn), so
        no two reads ever write into ``out``; cancelled, it cancels the read and waits for it
        to end, which a replica's ``read_into`` does only once nothing writes into ``out``
        (BlockReplica's contract): so none writes into it after this returns, and a read
        pausing between tries of a throttled store stops at once."""
        candidates = self.candidates(ref.key)
        if len(candidates) != 1 or ref.codec != "none" or len(out) != ref.raw_length:
            return False
        read = asyncio.ensure_future(self._hedged(ref, candidates, _CopyRead(self, ref, decode, out), demand))
        try:
            await asyncio.shield(read)
        except asyncio.CancelledError:
            read.cancel()
            await asyncio.wait([read])
            raise
        return True

    async def read_many_into(self, pieces: Sequence[Piece], verify: Verifier, demand: Demand | None = None) -> bool:
        """The chunks of ``pieces`` (of one block) read straight into their windows (see
        DirectTier): only from a lone replica, and one that reads spans
        (:class:`~blobsdk.sources.base.SpanReader`: the local store, one open and one
        ``preadv`` per run of adjacent chunks, each verified on the thread that read it), in
        one attempt, counted per chunk.  Other replicas (a block server, S3) answer False
        and their chunks are read one at a time; one multi-range or single-range GET per
        group could serve them later, through the same ``read_spans``."""
        if not pieces:
            return True
        block_id = pieces[0].ref.block_id
        candidates = self.candidates(block_id)
        if len(candidates) != 1 or not isinstance(candidates[0], SpanReader) or not all(_fits(p, block_id) for p in pieces):
            return False
        spans = [Span(p.ref.offset, p.ref.length, p.windows, p.ref.grant) for p in pieces]

        def check(i: int) -> None:
            verify(pieces[i].ref, pieces[i].windows)

        begun = time.perf_counter()
        try:
            outcomes = await self.hedger.run(
                candidates,
                partial(self._read_spans, block_id, spans, check),
                key_of=_name,
                failover=_is_failover,
                ready=self._ready,
                patient=True,
                call=Call(demand),
            )
        except HedgeExhausted as exc:
            self.stats.misses += len(pieces)
            raise give_up(pieces[0].ref, [error for _, error in exc.failures]) from exc
        seconds = time.perf_counter() - begun
        await self._recheck_group(candidates[0], pieces, outcomes, verify)
        self._settle(pieces, outcomes, candidates[0].name, seconds)
        return True

    async def _recheck_group(
        self, replica: BlockReplica, pieces: Sequence[Piece], outcomes: list[BlobError | None], verify: Verifier
    ) -> None:
        """Each chunk of a group that failed its check in the caller's memory: a bad copy, or
        BufferChanged (``_recheck``), in ``outcomes``; the replica failing the second read
        counts and raises as the group's read would."""
        for i, error in enumerate(outcomes):
            if not isinstance(error, BadCopy):
                continue
            try:
                outcomes[i] = await self._recheck(replica, pieces[i].ref, error, partial(_verify_own, verify))
            except _FAILOVER as exc:
                self._count(exc)
                self.stats.misses += len(pieces)
                raise give_up(pieces[i].ref, [exc]) from exc

    async def _read_spans(
        self, block_id: str, spans: list[Span], check: Callable[[int], None], replica: BlockReplica, call: Call
    ) -> list[BlobError | None]:
        """One replica's read of a group's spans (errors about the whole block counted here,
        as ``_read_copy`` counts them)."""
        assert isinstance(replica, SpanReader)
        try:
            return await replica.read_spans(block_id, spans, check=check, call=call)
        except _FAILOVER as exc:
            self._count(exc)
            if isinstance(exc, CorruptData):  # the block shrank under the read
                self.health.mark(replica.name, Reason.BAD_BYTES)
            raise

    def _settle(self, pieces: Sequence[Piece], outcomes: list[BlobError | None], replica: str, seconds: float) -> None:
        """Count each chunk of a group as a hit or a bad copy; the first bad one raises as a
        one-chunk read would (CorruptData), and demotes the replica.  A chunk the caller's
        buffer changed under is counted nowhere, as in ``read_into``: no store is to blame,
        and the read raises BufferChanged."""
        bad: tuple[ChunkRef, BlobError] | None = None
        changed: BufferChanged | None = None
        for piece, error in zip(pieces, outcomes, strict=True):
            if error is None:
                self.stats.hit(piece.ref.raw_length, seconds)
                continue
            if isinstance(error, BufferChanged):
                changed = changed or error
                continue
            self._count(error)
            self.stats.misses += 1
            bad = bad or (piece.ref, error)
        if bad is None:
            self.health.clear(replica, Reason.BAD_BYTES)
            if changed is not None:
                raise changed
            return
        self.health.mark(replica, Reason.BAD_BYTES)
        raise give_up(bad[0], [bad[1]])

    async def _hedged(
        self, ref: ChunkRef, candidates: list[BlockReplica], attempt: AttemptFn[BlockReplica, _Copy], demand: Demand | None
    ) -> _Copy:
        """The first verified copy ``attempt`` reads from ``candidates``, hedged, counted in
        this engine's stats; the telling error if none could be read."""
        begun = time.perf_counter()
        try:
            copy = await self.hedger.run(
                candidates,
                attempt,
                key_of=_name,
                failover=_is_failover,
                ready=self._ready,
                patient=True,
                call=Call(demand, ref.grant),
            )
        except HedgeExhausted as exc:
            self.stats.misses += 1
            raise give_up(ref, [error for _, error in exc.failures]) from exc
        self.stats.hit(ref.raw_length, time.perf_counter() - begun)
        return copy

    def candidates(self, key: str) -> list[BlockReplica]:
        """The replicas in the order to try for chunk ``key``: replicas that served a bad copy
        lately after the others; then the shortest expected wait first, ``(load + 1) x
        typical latency / limit`` (load: requests in flight or queued here; typical: the
        median of the last SLOW_WITHIN_S, a replica without one counted as the fastest;
        limit: its in-flight limit, the reads it serves at once); among equals
        rendezvous order, so the primaries of a batch spread over every replica.

        The least loaded first: on a busy HDD tier the replica whose queue is shortest
        answers first, where rendezvous alone hands each server whatever share of the chunks
        the hash gives it, and the busiest one sets the pace.  In the cold epoch of
        benchmarks/ingest.py (bandwidth-bound, 3 block servers) the stall went from
        1.01-1.26 s to 0.67-0.83 s (two full runs each).

        Weighted by latency, not cut off at a threshold: a replica 10x slower gets a tenth of
        a burst's share, not none.  Ranked last once its p95 was over 3x the
        best, a replica was read no more, so its estimate never changed; and on a loaded
        client the medians of two healthy replicas differ 3x now and then, so a batch's
        100 reads went to one replica through its client-side queue (hedging benchmark,
        ``slow_replica``: batches of 200-290 ms, the p99 ~4x its fault-free one).

        Divided by the limit, the expected wait is load / throughput (Little's law): without
        it, a replica behind a slow link, whose limiter settles low, was ranked as if the fast
        ones served one read at a time too, and got several times the share of a batch its
        link could move in the time the others took.

        The key's rendezvous order is worked out only when two replicas tie (hashing every
        replica's name with the key was a third of this method's cost, on every read)."""
        replicas = self._replicas
        if len(replicas) < 2:
            return list(replicas.values())
        names = self._names
        typical = [self.hedger.latency.typical(name, SLOW_WITHIN_S) for name in names]
        known = [t for t in typical if t is not None]
        fastest = min(known) if known else 1.0
        has, load, limit, bad = self.health.has, self._limiters.load, self._limiters.limit, Reason.BAD_BYTES
        scores: list[tuple[object, ...]] = [
            (has(name, bad), (load(name) + 1) * (fastest if t is None else t) / limit(name))
            for name, t in zip(names, typical, strict=True)
        ]
        if len(set(scores)) < len(scores):  # a tie (idle, or no latencies yet): rendezvous order breaks it
            at = {name: i for i, name in enumerate(rank(key, names))}
            scores = [(*score, at[name]) for score, name in zip(scores, names, strict=True)]
        return [replicas[name] for _, name in sorted(zip(scores, names, strict=True))]

    def _has_room(self, replica: BlockReplica) -> bool:
        """A hedge goes only to a replica whose concurrency limit has a free slot."""
        return self._limiters.has_room(replica.name)

    async def _read_copy(self, read: _CopyRead, replica: BlockReplica, call: Call) -> _Copy:
        """One replica's verified copy of ``read.ref``, in a buffer of its own (or
        ``read.into``, by read_into): a cancelled loser's read may go on in a thread, so no two
        attempts ever share one.  A bad or missing copy goes on ``read.skipped``; a bad one
        demotes its replica, a verified one restores it."""
        ref, decode, into = read.ref, read.decode, read.into
        stored = self.buffers.take(ref.length) if into is None else into
        try:
            await replica.read_into(ref.block_id, ref.offset, stored, call=call)
            try:
                raw = await decode(ref, stored)
            except BadCopy as exc:
                if into is None:
                    raise
                raise await self._recheck(replica, ref, exc, partial(_decode_own, decode)) from None
        except _FAILOVER as exc:
            self._count(exc)
            if isinstance(exc, CorruptData):  # a bad copy, or one too short for the chunk
                self.health.mark(replica.name, Reason.BAD_BYTES)
            if isinstance(exc, CorruptData | BlockNotFound):
                read.skip(exc)
            raise
        self.health.clear(replica.name, Reason.BAD_BYTES)
        return stored, raw

    async def _recheck(
        self, replica: BlockReplica, ref: ChunkRef, error: BadCopy, verify: Callable[[ChunkRef, memoryview], Awaitable[None]]
    ) -> BadCopy | BufferChanged:
        """What a chunk that failed its check in the caller's memory was: ``error`` (a bad
        copy) if the replica's copy, read again into a buffer of this engine's own, fails
        ``verify`` there too; else BufferChanged (the caller's buffer changed under the read).
        An error of the second read (the replica gone) is raised."""
        own = self.buffers.take(ref.length)
        await replica.read_into(ref.block_id, ref.offset, own, call=Call(grant=ref.grant))
        verdict: BadCopy | BufferChanged
        try:
            await verify(ref, own)
        except BadCopy:
            verdict = error
        else:
            verdict = BufferChanged(
                f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: the caller's buffer changed while the read filled"
                " it (the store's copy, read again, is good): write nothing into a buffer until the read that fills it returns"
            )
        self.buffers.give(own)  # read and checked whole (a cancelled or failed read's buffer is dropped)
        return verdict

    def figures(self) -> dict[str, int | float]:
        """The hedger's counters (``hedge_*``) and the replicas demoted now."""
        out: dict[str, int | float] = {f"hedge_{name}": value for name, value in self.hedger.stats().items()}
        out["replicas_demoted"] = self.health.count(Reason.BAD_BYTES)
        return out

    def _count(self, exc: BlobError) -> None:
        if isinstance(exc, BadCopy):
            self.stats.corrupt += 1
        else:
            self.stats.errors += 1


_Copy = tuple[memoryview, memoryview]  # a verified stored copy and its raw bytes


class _CopyRead:
    """The hedger's attempt function of one chunk's read (``ReplicaReader._read_copy`` at a replica),
    and the bad or missing copies its attempts met.  One slotted object per read, where a
    ``partial`` of a bound method and a list were three, each kept alive while the read is in
    flight (and each bringing the cyclic collector's next pass nearer)."""

    __slots__ = ("decode", "engine", "into", "ref", "skipped")

    def __init__(self, engine: ReplicaReader, ref: ChunkRef, decode: Decoder, into: memoryview | None = None) -> None:
        self.engine = engine
        self.ref = ref
        self.decode = decode
        self.into = into  # the caller's memory (read_into), or None: a buffer of the engine's
        self.skipped: list[BlobError] | None = None  # made by the first skip

    def __call__(self, replica: BlockReplica, call: Call) -> Awaitable[_Copy]:
        return self.engine._read_copy(self, replica, call)

    def skip(self, error: BlobError) -> None:
        if self.skipped is None:
            self.skipped = []
        self.skipped.append(error)


def _fits(piece: Piece, block_id: str) -> bool:
    """Whether a piece is a whole uncompressed chunk of ``block_id`` with room for all of it."""
    ref, windows = piece.ref, piece.windows
    if ref.block_id != block_id or ref.codec != "none" or ref.length != ref.raw_length:
        return False
    return (windows[0].nbytes if len(windows) == 1 else sum(w.nbytes for w in windows)) == ref.raw_length


async def _decode_own(decode: Decoder, ref: ChunkRef, own: memoryview) -> None:
    """``_recheck``'s check of a copy ``read_into`` read again: its decoder."""
    await decode(ref, own)


async def _verify_own(verify: Verifier, ref: ChunkRef, own: memoryview) -> None:
    """``_recheck``'s check of a copy ``read_many_into`` read again: its verifier."""
    verify(ref, (own,))


def _name(replica: BlockReplica) -> str:
    return replica.name


def _is_failover(exc: BaseException) -> bool:
    return isinstance(exc, _FAILOVER)


def give_up(ref: ChunkRef, failures: list[BaseException]) -> BlobError:
    """The error for a chunk no replica could serve, most telling first: a bad copy, then a
    block gone from every replica (an indexed object changed, if that is why), else
    Unavailable."""
    if any(isinstance(f, CorruptData) for f in failures):
        return CorruptData(f"chunk {ref.key}: no replica returned bytes matching its checksum ({failures[-1]})")
    if failures and all(isinstance(f, BlockNotFound) for f in failures):
        if changed := [f for f in failures if isinstance(f, SourceChanged)]:
            return SourceChanged(str(changed[-1]))  # says which object, and what to do
        return BlockNotFound(f"block {ref.block_id} is gone from every replica (blob deleted or replaced?)")
    last = failures[-1] if failures else "no replicas"
    return Unavailable(f"chunk {ref.key}: every replica failed; last error: {last}")
