"""How an injected fault damages a response body (servers/_common/faults.py decides which
requests): one byte flipped, or the body cut short and the connection closed, with the
Content-Length of the whole body.  :class:`Damage` applies to a ``web.Response`` body before
it is sent, or wraps a StreamResponse's writes as it is prepared (:class:`_DamagedStream`);
:func:`writes_wrapped` tells a handler that sends around ``write`` (sendfile) to write
through them instead.
"""

from __future__ import annotations

from collections import Counter

from aiohttp import hdrs, web


def _offset(fraction: float, size: int) -> int:
    return min(int(fraction * size), size - 1)


class Damage:
    """The body damage planned for one request, applied to whichever response it gets:
    ``flip`` and ``cut`` are where, as fractions of the body's length (None: not that)."""

    def __init__(self, flip: float | None, cut: float | None, counts: Counter[str]) -> None:
        self.flip, self.cut, self.counts = flip, cut, counts

    def apply_to_body(self, response: web.Response) -> None:
        """Damage a response whose body is bytes and not sent yet."""
        body = response.body
        if not isinstance(body, (bytes, bytearray)) or not body:
            return
        data = bytearray(body)
        if self.flip is not None:
            data[_offset(self.flip, len(data))] ^= 0xFF
            self.counts["corrupt"] += 1
        if self.cut is None:
            response.body = data
            return
        response.body = data[: _offset(self.cut, len(data))]
        response.headers[hdrs.CONTENT_LENGTH] = str(len(data))  # the whole length: the client waits for more
        response.force_close()
        self.counts["truncate"] += 1

    def wrap_stream(self, request: web.Request, response: web.StreamResponse) -> None:
        """Damage a StreamResponse's writes from now on (called as it is prepared)."""
        size = response.content_length
        if size == 0:
            return
        size = size or 1  # unknown length (chunked): damage its first byte
        flip_at = None if self.flip is None else _offset(self.flip, size)
        cut_at = None if self.cut is None else _offset(self.cut, size)
        _DamagedStream(request, response, flip_at, cut_at, self.counts)


_WRAPPED = web.ResponseKey("blobsdk_faults_wrapped_writes", bool)


def writes_wrapped(response: web.StreamResponse) -> bool:
    """Whether this prepared response's writes are damaged: a handler that would send its
    body around ``response.write`` (sendfile) must write it through them instead."""
    return bool(response.get(_WRAPPED, False))


class _DamagedStream:
    """Stands in for one StreamResponse's ``write``/``write_eof``: flips the body byte at
    ``flip_at``, and after ``cut_at`` bytes closes the connection and drops the rest."""

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        flip_at: int | None,
        cut_at: int | None,
        counts: Counter[str],
    ) -> None:
        self._request, self._response, self._counts = request, response, counts
        self._flip_at, self._cut_at = flip_at, cut_at
        self._sent = 0
        self._hung_up = False
        self._write, self._write_eof = response.write, response.write_eof
        response.write = self.write  # type: ignore[method-assign]
        response.write_eof = self.write_eof  # type: ignore[method-assign]
        response[_WRAPPED] = True

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._hung_up:
            return
        view = memoryview(data).cast("B")
        if self._cut_at is not None:
            view = view[: self._cut_at - self._sent]
        if view.nbytes:
            await self._write(self._flipped(view))
        self._sent += view.nbytes
        if self._sent == self._cut_at:
            self._hang_up()

    async def write_eof(self, data: bytes = b"") -> None:
        if data:
            await self.write(data)
        if not self._hung_up:
            await self._write_eof()

    def _flipped(self, view: memoryview) -> memoryview | bytearray:
        """``view``, or a copy with the byte at ``flip_at`` flipped (never the caller's buffer)."""
        at = self._flip_at
        if at is None or not self._sent <= at < self._sent + view.nbytes:
            return view
        piece = bytearray(view)
        piece[at - self._sent] ^= 0xFF
        self._counts["corrupt"] += 1
        return piece

    def _hang_up(self) -> None:
        self._hung_up = True
        self._counts["truncate"] += 1
        self._response.force_close()
        if (transport := self._request.transport) is not None:
            transport.close()  # sends what is buffered, then closes: the body stays short
