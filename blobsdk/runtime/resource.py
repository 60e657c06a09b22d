"""AsyncResource: the one ``async with`` of every long-lived object (anyio's ``AsyncResource``).

A subclass defines :meth:`aclose` (closing twice, or closing what never opened, is
harmless), and :meth:`_start` if entering it starts something (a thread pool's first job,
tasks, connections).  The base gives ``async with`` on top, once, with one contract:

- entering runs ``_start`` and gives the object itself;
- if ``_start`` fails (or is cancelled), ``aclose`` runs before the error goes on, so nothing
  the object started outlives a failed entry;
- leaving runs ``aclose``, whether the block ended normally or by an exception (which goes
  on: leaving never swallows it).

The hook is private (``_start``, not ``open``) because some subclasses have an ``open`` of
their own that means something else (fsspec's ``open(path)``) or a public API that must not
grow (the Client and its blocking twin); a class whose ``open`` is public calls it from
``_start``.  A leaf: it imports nothing of blobsdk.
"""

from __future__ import annotations

from typing import Self


class AsyncResource:
    """See the module docstring."""

    __slots__ = ()  # a subclass with __slots__ keeps them (no __dict__ from the base)

    async def _start(self) -> None:
        """What entering starts; nothing by default."""

    async def aclose(self) -> None:
        """Stop and close what the object owns; idempotent."""
        raise NotImplementedError(f"{type(self).__name__} must define aclose")

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:  # nothing started may outlive a failed entry
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
