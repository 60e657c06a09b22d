"""A metadata store whose lookups answer late: the late-answer races of issue 20 item 1,
made deterministic with events (no sleeps)."""

from __future__ import annotations

import asyncio

from blobsdk.metadata import SqliteMetadataStore


class LateAnswers(SqliteMetadataStore):
    """A store whose lookups read the state when they are asked (``asked`` is set) but
    answer only once ``release`` is set: a slow network between asking and answering."""

    def __init__(self, path: object) -> None:
        super().__init__(path)  # type: ignore[arg-type]
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def get_plan(self, path: str):
        plan = await super().get_plan(path)
        return await self._late(plan)

    async def get_plans(self, paths):
        plans = await super().get_plans(paths)
        return await self._late(plans)

    async def _late(self, answer):
        self.asked.set()
        await self.release.wait()
        return answer
