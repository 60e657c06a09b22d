"""The flash node's hydrate jobs (servers/flash.py): background pulls of chunks into its cache.

Routes (installed by servers/flash.py)::

    POST   /v1/hydrate                  HydrateRequest (msgpack or JSON) -> 202 HydrateStatus
    GET    /v1/hydrate/{job_id}         HydrateStatus;  DELETE cancels the job

A job pulls its chunks from L4 (``concurrency`` chunks at a time across all jobs), verifies,
stores and pins them (``pin_seconds``) for the tenant, through the node's ``chunk`` function;
it ends "done" if every chunk is stored, else "failed".  The last ``max_jobs`` jobs are kept
for status queries; another tenant's job is as unknown as one that never was.  Jobs are owned
tasks: :meth:`Hydrator.aclose` cancels and awaits them.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web

from blobsdk.errors import BadRequest, BlobError, BlobNotFound, Unavailable
from blobsdk.wire import MAX_FAILED_KEYS, ChunkRef, HydrateRequest, HydrateStatus, JobState, validate_ref

from ._common.auth import AUTH_KEY, claims_of
from ._common.http import read_body, reply
from .flashconfig import FlashConfig

_JOB_ERRORS = 5  # failure messages a job keeps

HydrateChunk = Callable[[ChunkRef, str, float], Awaitable[int]]  # (ref, tenant, pin_seconds) -> stored size


class Job:
    """One hydrate job: its refs, counters, and the task that works on them."""

    def __init__(self, refs: list[ChunkRef], tenant: str, pin_seconds: float) -> None:
        self.job_id = os.urandom(8).hex()
        self.refs, self.tenant, self.pin_seconds = refs, tenant, pin_seconds
        self.done = self.failed = self.bytes = 0
        self.errors: list[str] = []
        self.failed_keys: list[str] = []
        self.task: asyncio.Task[None] | None = None

    def failure(self, ref: ChunkRef, exc: BaseException) -> None:
        self.failed += 1
        if len(self.errors) < _JOB_ERRORS:
            self.errors.append(f"chunk {ref.key}: {type(exc).__name__}: {exc}")
        if len(self.failed_keys) < MAX_FAILED_KEYS:
            self.failed_keys.append(ref.key)

    def status(self) -> HydrateStatus:
        return HydrateStatus(
            job_id=self.job_id,
            state=self._state(),
            total=len(self.refs),
            done=self.done,
            failed=self.failed,
            bytes=self.bytes,
            errors=list(self.errors),
            failed_keys=list(self.failed_keys),
        )

    def _state(self) -> JobState:
        if self.task is None or not self.task.done():
            return "running"
        if self.task.cancelled():
            return "cancelled"
        return "failed" if self.failed or self.task.exception() is not None else "done"


class Hydrator:
    """The hydrate routes and the jobs they start.  ``chunk`` stores and pins one chunk for a
    tenant (its stored size); ``check_size`` refuses a chunk over the node's limit (BadRequest);
    ``config`` is the node's (its hydrate_concurrency, max_jobs and pin_seconds)."""

    def __init__(self, chunk: HydrateChunk, check_size: Callable[[ChunkRef], ChunkRef], config: FlashConfig) -> None:
        self._chunk, self._check_size = chunk, check_size
        self._concurrency, self._max_jobs, self._pin_seconds = config.hydrate_concurrency, config.max_jobs, config.pin_seconds
        self._jobs: dict[str, Job] = {}
        self._finished: deque[str] = deque()
        self._slots = asyncio.Semaphore(self._concurrency)

    async def aclose(self) -> None:
        """Cancel every job and wait for them."""
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def post_hydrate(self, request: web.Request) -> web.Response:
        body = await read_body(request, HydrateRequest)
        claims, auth = claims_of(request), request.app[AUTH_KEY]
        for ref in body.refs:
            self._check_size(validate_ref(ref))
            auth.check_grant(claims, ref.grant, ref.block_id, ref.offset, ref.length)
        pin_seconds = self._pin_seconds if body.pin_seconds is None else body.pin_seconds
        if not 0 <= pin_seconds < float("inf"):  # nan compares false: refused too
            raise BadRequest(f"pin_seconds must be a finite number >= 0, got {pin_seconds}")
        job = self._start_job(Job(list({r.key: r for r in body.refs}.values()), claims.tenant, pin_seconds))
        return reply(request, job.status(), status=202)

    async def get_hydrate(self, request: web.Request) -> web.Response:
        return reply(request, self._job_of(request).status())

    async def cancel_hydrate(self, request: web.Request) -> web.Response:
        job = self._job_of(request)
        if job.task is not None and not job.task.done():
            job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)
        return reply(request, job.status())

    def job(self, job_id: str) -> Job | None:
        """A running or recently finished hydrate job."""
        return self._jobs.get(job_id)

    def running_jobs(self) -> int:
        return sum(job.task is not None and not job.task.done() for job in self._jobs.values())

    def kept_jobs(self) -> int:
        return len(self._jobs)

    def _job_of(self, request: web.Request) -> Job:
        """The request's job: another tenant's is as unknown as a job that never was."""
        job = self.job(request.match_info["job_id"])
        claims = claims_of(request)
        if job is None or not (claims.admin or claims.tenant == job.tenant):
            raise BlobNotFound(f"no hydrate job {request.match_info['job_id']!r} (unknown or forgotten)")
        return job

    def _start_job(self, job: Job) -> Job:
        while len(self._jobs) >= self._max_jobs and self._finished:
            self._jobs.pop(self._finished.popleft(), None)
        if len(self._jobs) >= self._max_jobs:
            raise Unavailable(f"{len(self._jobs)} hydrate jobs are running; try again later")
        job.task = asyncio.get_running_loop().create_task(self._run_job(job))
        job.task.add_done_callback(lambda task: self._job_ended(job))
        self._jobs[job.job_id] = job
        return job

    def _job_ended(self, job: Job) -> None:
        self._finished.append(job.job_id)
        if job.task is not None and not job.task.cancelled():
            job.task.exception()  # a bug shows as state "failed", never as an unretrieved error

    async def _run_job(self, job: Job) -> None:
        refs = iter(job.refs)
        async with asyncio.TaskGroup() as workers:
            for _ in range(min(self._concurrency, len(job.refs))):
                workers.create_task(self._worker(job, refs))

    async def _worker(self, job: Job, refs: Iterator[ChunkRef]) -> None:
        for ref in refs:  # shared by the job's workers: each ref is taken once
            async with self._slots:
                try:
                    stored = await self._chunk(ref, job.tenant, job.pin_seconds)
                except BlobError as exc:
                    job.failure(ref, exc)
                    continue
                job.done += 1
                job.bytes += stored  # not `+= await ...`: that would read job.bytes before the await
