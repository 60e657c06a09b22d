"""Deep prefetch (DESIGN §2): warm a tier with the data a job will read over the next minutes.

``client.prefetch(paths_or_prefixes, tier=...)`` returns a :class:`Prefetch` handle at once
and works in the background:

1. **Resolve.** A string ending in ``/`` is a prefix (every blob under it, listed); any other
   string is one path.  A prefix with no blob under it goes to ``handle.failed`` as
   ``BlobNotFound``.  Plans are looked up in batches of 1000 through the client's plan
   cache, which this also pre-warms.  A missing path goes to ``handle.failed`` as
   ``BlobNotFound``, a batch or prefix the metadata store refuses (``Forbidden``,
   ``Unavailable``) as that error; the rest proceeds.
2. **Warm**, by tier:

   - ``"l3"``: hydrate jobs posted to the L3 nodes that own each chunk (the read path's
     rendezvous placement and replicas), pinned for ``pin_seconds`` (None: the nodes'
     default), progress polled from the nodes at once, then after a wait of ``POLL_S`` that
     doubles after each ask up to ``POLL_MAX_S`` (a long job is asked about once a second,
     not ten times: each ask is a request the node and the client pay CPU for).  Progress counts chunk
     *copies*: with 2 L3 replicas each chunk counts twice, its bytes as stored (``dataset_chunks``
     and ``dataset_bytes`` are the distinct chunks' count and raw bytes).  A chunk fails (its paths go to
     ``failed``) only when every node it was sent to failed it.
   - ``"l1"`` / ``"l2"``: every chunk not already held is fetched through the read path at
     prefetch priority (each endpoint's limiter queues foreground reads first) by
     ``read.parallel_chunks`` workers, and the target tier and the ones between it and the
     source ``keep`` it (no write-behind drop).  A byte budget (``max_bytes``, default half
     the target tier's capacity) bounds what one prefetch fetches, so it never evicts what
     it just prefetched nor most of what the training loop is reading; chunks past it are
     counted as skipped.

Chunks shared by several paths are warmed once.  ``cancel()`` stops it (L3 jobs are
cancelled on their nodes too); the client cancels and awaits whatever prefetch is still
running when it closes, so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .._arguments import check_number, wrong
from .._numbers import non_negative
from ..chunks import bucket_of, validate_path, validate_prefix
from ..errors import BadRequest, BlobError, BlobNotFound, Unavailable
from ..metadata import PlanLister, PlanReader
from ..tiers import HydrateJob, L3Tier
from ..wire import ChunkRef, HydrateStatus, ReadPlan
from .readpath import ReadPath

TierName = Literal["l1", "l2", "l3"]
PLAN_BATCH = 1000  # paths per plan lookup (the API server's bound)
POLL_S = 0.1  # the first wait before an L3 prefetch asks the nodes how far their jobs are
POLL_MAX_S = 1.0  # the wait doubles after each ask, up to this
CANCEL_TIMEOUT_S = 5.0  # how long a cancelled L3 prefetch waits for its nodes to stop


@dataclass(frozen=True, slots=True)
class PrefetchProgress:
    """How far a prefetch is.  ``chunks_done`` counts chunks now in the tier (fetched, or
    held already); ``chunks_skipped`` those left out for the byte budget or that the tier
    would not keep (full, over a quota); chunks that failed count in neither.  Into L3 the
    chunk and byte counts are of chunk *copies* (one per replica), the bytes as stored (lz4
    where it saved space), as the nodes copy them; ``dataset_chunks`` and ``dataset_bytes``
    are always the distinct chunks' count and raw bytes."""

    chunks_done: int = 0
    chunks_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    chunks_skipped: int = 0
    dataset_chunks: int = 0
    dataset_bytes: int = 0


@dataclass
class _Tally:
    chunks_done: int = 0
    chunks_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    chunks_skipped: int = 0
    dataset_chunks: int = 0
    dataset_bytes: int = 0
    failed: dict[str, BlobError] = field(default_factory=dict)
    jobs: dict[int, tuple[int, int]] = field(default_factory=dict)  # L3 job -> (done, bytes) counted

    def count(self, job: int, status: HydrateStatus) -> None:
        """Fold one L3 job's latest status into the totals (its counts only grow)."""
        done, nbytes = self.jobs.get(job, (0, 0))
        self.jobs[job] = (status.done, status.bytes)
        self.chunks_done += status.done - done
        self.bytes_done += status.bytes - nbytes

    def snapshot(self) -> PrefetchProgress:
        return PrefetchProgress(
            self.chunks_done,
            self.chunks_total,
            self.bytes_done,
            self.bytes_total,
            self.chunks_skipped,
            self.dataset_chunks,
            self.dataset_bytes,
        )

    def distinct(self, chunks: dict[str, tuple[ChunkRef, list[str]]]) -> None:
        self.dataset_chunks = len(chunks)
        self.dataset_bytes = sum(ref.raw_length for ref, _ in chunks.values())


class Prefetch:
    """The handle of one running prefetch: ``await handle`` (its final progress),
    ``done``, ``progress``, ``failed`` (path -> error) and ``cancel()``.  The task is the
    :class:`Prefetcher`'s, which started it and cancels it on close; the handle only watches it."""

    def __init__(self, task: asyncio.Task[None], tally: _Tally) -> None:
        self._task = task
        self._tally = tally

    @property
    def done(self) -> bool:
        return self._task.done()

    @property
    def progress(self) -> PrefetchProgress:
        return self._tally.snapshot()

    @property
    def failed(self) -> dict[str, BlobError]:
        return dict(self._tally.failed)

    def cancel(self) -> None:
        """Stop it; ``await`` the handle to wait until nothing of it runs."""
        self._task.cancel()

    async def wait(self) -> PrefetchProgress:
        """Its final progress, once it ended (a cancelled prefetch ends too).  An unexpected
        error (a bug) is raised here, never swallowed."""
        await asyncio.wait([self._task])
        if not self._task.cancelled() and (exc := self._task.exception()) is not None:
            raise exc
        return self.progress

    def __await__(self) -> Generator[object, None, PrefetchProgress]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        p, state = self.progress, "done" if self.done else "running"
        return f"<Prefetch {state}: {p.chunks_done}/{p.chunks_total} chunks, {len(self._tally.failed)} failed>"


class PrefetchPlans(PlanReader, PlanLister, Protocol):
    """What a prefetch asks of the metadata (the client's plan cache): a prefix listed, its plans."""


class Prefetcher:
    """What a client prefetches with: its plan cache, read path and L3 tier.  Owns the
    prefetches it started: :meth:`aclose` cancels and awaits them."""

    def __init__(
        self,
        plans: PrefetchPlans,
        readpath: ReadPath,
        parallel: int,
        capacities: dict[str, int],
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.plans = plans
        self.readpath = readpath
        self.parallel = parallel
        self.capacities = capacities  # tier name -> bytes, for the default budget
        self.l3 = next((t for t in readpath.tiers if isinstance(t, L3Tier)), None)
        self._running: set[asyncio.Task[None]] = set()
        self._sleep = sleep  # the waits between polls of an L3 prefetch (a fake one in tests)

    def start(
        self,
        targets: str | Iterable[str],
        tier: str = "l3",
        *,
        pin_seconds: float | None = None,
        max_bytes: int | None = None,
    ) -> Prefetch:
        """Check the arguments (ValueError, InvalidPath) and start; see the module docstring."""
        wanted = _targets(targets)
        top = self._tier_index(tier)
        check_number("pin_seconds", pin_seconds, non_negative(optional=True), BadRequest)
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1):
            if not isinstance(max_bytes, int | float):
                raise wrong("max_bytes", "a positive int or None", max_bytes)
            raise BadRequest(f"max_bytes must be a positive int or None, got {max_bytes!r}")
        if tier == "l3":
            if max_bytes is not None:
                raise BadRequest("max_bytes bounds an l1 or l2 prefetch; an l3 prefetch is bounded by the nodes' pins")
            return self._launch(lambda tally: self._into_l3(wanted, tally, pin_seconds), "blobsdk-prefetch-l3")
        if pin_seconds is not None:
            raise BadRequest("pin_seconds applies to an l3 prefetch only")
        budget = max_bytes if max_bytes is not None else self.capacities[tier] // 2
        return self._launch(lambda tally: self._into_cache(wanted, tally, top, budget), f"blobsdk-prefetch-{tier}")

    def _launch(self, work: Callable[[_Tally], Coroutine[object, object, None]], name: str) -> Prefetch:
        """Start ``work`` as a task of this prefetcher's, and its handle."""
        tally = _Tally()
        task = asyncio.get_running_loop().create_task(work(tally), name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return Prefetch(task, tally)

    async def aclose(self) -> None:
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def _tier_index(self, tier: str) -> int:
        names = [t.name for t in self.readpath.tiers]
        configured = [n for n in names if n in ("l1", "l2", "l3")]
        if tier not in ("l1", "l2", "l3"):
            raise ValueError(f"tier must be one of 'l1', 'l2', 'l3', got {tier!r}")
        if tier not in names:
            listed = ", ".join(repr(n) for n in configured) or "none"
            raise ValueError(f"tier {tier!r} is not configured for this client; configured: {listed}")
        return names.index(tier)

    # --- resolve ----------------------------------------------------------------------------

    async def _resolve(self, targets: Sequence[str], tally: _Tally) -> list[ReadPlan]:
        """The plans of every path named or listed (missing ones go to ``failed``)."""
        paths: dict[str, None] = {}
        for target in targets:
            if target.endswith("/"):
                listed = False
                try:
                    async for info in self.plans.list(target):
                        paths[info.path] = None
                        listed = True
                except BlobError as exc:  # e.g. Forbidden: the prefix is reported, the rest goes on
                    tally.failed[target] = exc
                    continue
                if not listed:
                    tally.failed[target] = BlobNotFound(f"no blobs under {target!r}")
            else:
                paths[target] = None
        found: list[ReadPlan] = []
        for batch in _batches_by_bucket(paths):
            try:
                plans = await self.plans.get_plans(batch)
            except BlobError as exc:
                _fail(tally, batch, exc)
                continue
            for path, plan in zip(batch, plans, strict=True):
                if plan is None:
                    tally.failed[path] = BlobNotFound(f"no blob at {path!r}")
                else:
                    found.append(plan)
        return found

    # --- into L1 / L2 -------------------------------------------------------------------------

    async def _into_cache(self, targets: Sequence[str], tally: _Tally, top: int, budget: int) -> None:
        chunks = _chunks_of(await self._resolve(targets, tally))
        tally.distinct(chunks)
        tally.chunks_total = len(chunks)
        tally.bytes_total = sum(ref.raw_length for ref, _ in chunks.values())
        queue = iter(chunks.values())
        left = [budget]
        async with asyncio.TaskGroup() as workers:
            for _ in range(min(self.parallel, len(chunks))):
                workers.create_task(self._cache_worker(queue, tally, top, left))

    async def _cache_worker(self, queue: Iterable[tuple[ChunkRef, list[str]]], tally: _Tally, top: int, left: list[int]) -> None:
        target = self.readpath.tiers[top]
        for ref, paths in queue:  # shared by the workers: each chunk is taken once
            if not await target.finds(ref):  # in L2: also a file another process put there
                if ref.raw_length > left[0]:
                    tally.chunks_skipped += 1
                    continue
                left[0] -= ref.raw_length
                try:
                    await self.readpath.warm(ref, top)
                except BlobError as exc:
                    _fail(tally, paths, exc)
                    continue
                if not target.holds(ref):  # the cache would not keep it (full, over quota)
                    tally.chunks_skipped += 1
                    continue
            tally.chunks_done += 1
            tally.bytes_done += ref.raw_length

    # --- into L3 -----------------------------------------------------------------------------

    async def _into_l3(self, targets: Sequence[str], tally: _Tally, pin_seconds: float | None) -> None:
        assert self.l3 is not None  # _tier_index checked it
        chunks = _chunks_of(await self._resolve(targets, tally))
        tally.distinct(chunks)
        jobs = await self.l3.hydrate([ref for ref, _ in chunks.values()], pin_seconds)
        tally.chunks_total = sum(job.total for job in jobs)
        tally.bytes_total = sum(ref.length for job in jobs for ref in job.refs)  # as stored: what the nodes count
        try:
            statuses = await self._poll(jobs, tally)
        except asyncio.CancelledError:
            with contextlib.suppress(BlobError, TimeoutError):
                async with asyncio.timeout(CANCEL_TIMEOUT_S):
                    await asyncio.gather(*(self.l3.cancel_hydrate(job) for job in jobs))
            raise
        _report_l3_failures(jobs, statuses, chunks, tally)

    async def _poll(self, jobs: Sequence[HydrateJob], tally: _Tally) -> list[HydrateStatus]:
        """Until every job finished: the jobs' statuses (a node that cannot be asked fails
        its job), with ``tally`` kept up to date."""
        assert self.l3 is not None
        final: dict[int, HydrateStatus] = {}
        wait = POLL_S
        while True:
            for i, job in enumerate(jobs):
                if i not in final:
                    status = await _status_of(self.l3, job)
                    if status.finished:
                        final[i] = status
                    tally.count(i, status)
            if len(final) == len(jobs):
                return [final[i] for i in range(len(jobs))]
            await self._sleep(wait)
            wait = min(2 * wait, POLL_MAX_S)


def _targets(targets: str | Iterable[str]) -> list[str]:
    items = [targets] if isinstance(targets, str) else list(targets)
    return [validate_prefix(t) if isinstance(t, str) and t.endswith("/") else validate_path(t) for t in items]


def _batches_by_bucket(paths: Iterable[str]) -> Iterable[list[str]]:
    """``paths`` in lookups of at most PLAN_BATCH, none mixing buckets: a bucket the token
    does not allow fails its own paths only (the API refuses a whole request)."""
    buckets: dict[str, list[str]] = {}
    for path in paths:
        buckets.setdefault(bucket_of(path), []).append(path)
    for group in buckets.values():
        for i in range(0, len(group), PLAN_BATCH):
            yield group[i : i + PLAN_BATCH]


def _chunks_of(plans: Iterable[ReadPlan]) -> dict[str, tuple[ChunkRef, list[str]]]:
    """Each distinct chunk of ``plans`` (by key, in plan order) and the paths that need it."""
    chunks: dict[str, tuple[ChunkRef, list[str]]] = {}
    for plan in plans:
        for ref in plan.chunks:
            chunks.setdefault(ref.key, (ref, []))[1].append(plan.path)
    return chunks


def _fail(tally: _Tally, paths: Iterable[str], exc: BlobError) -> None:
    for path in paths:
        tally.failed.setdefault(path, exc)


async def _status_of(l3: L3Tier, job: HydrateJob) -> HydrateStatus:
    """The job's status; one that was never sent, or whose node cannot be asked, failed
    every chunk."""
    try:
        return await l3.hydrate_status(job)
    except BlobError as exc:
        lost = f"{job.url}: {type(exc).__name__}: {exc}"
        keys: list[str] = [ref.key for ref in job.refs]
        return HydrateStatus(
            job_id=job.job_id or "", state="failed", total=job.total, failed=job.total, errors=[lost], failed_keys=keys
        )


def _report_l3_failures(
    jobs: Sequence[HydrateJob], statuses: Sequence[HydrateStatus], chunks: dict[str, tuple[ChunkRef, list[str]]], tally: _Tally
) -> None:
    """A chunk failed when every node it was sent to failed it: its paths go to ``failed``.
    (A node lists at most MAX_FAILED_KEYS failed chunks per job; beyond that they count
    in the progress only.)"""
    sent: dict[str, int] = {}
    failed: dict[str, list[str]] = {}
    for job, status in zip(jobs, statuses, strict=True):
        for ref in job.refs:
            sent[ref.key] = sent.get(ref.key, 0) + 1
        never_done = job.error is not None or status.state == "cancelled"  # cancelled elsewhere: unknown which
        lost = [ref.key for ref in job.refs] if never_done else status.failed_keys
        reason = job.error or "; ".join(status.errors) or status.state
        for key in lost:
            failed.setdefault(key, []).append(f"{job.url}: {reason}")
    for key, reasons in failed.items():
        if key in chunks and len(reasons) >= sent[key]:
            _fail(tally, chunks[key][1], Unavailable(f"L3 prefetch of chunk {key} failed on every node: {reasons[0]}"))
