"""Calling a provider client's methods from async code, sync and async clients alike.

The transports are written once, as coroutines (the project's one path for sync and async,
as ``execution/syncio.py``): an async client's call is awaited on the running loop; a sync
client's call runs in a worker thread (``asyncio.to_thread``), so a slow upload never
blocks the loop. An async client is bound to the loop it was first used on: run the
transport there (the process loop, ``syncio.run_sync``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from hypernodes_dist.batchapi.transport import BatchNotFoundError

__all__ = ["ClientCalls", "http_status"]

T = TypeVar("T")


def http_status(exc: BaseException) -> int | None:
    """The HTTP status a client's error carries (``openai``/``anthropic`` ``APIStatusError``)."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


class ClientCalls:
    """Awaitable calls of one client's methods."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.is_async = inspect.iscoroutinefunction(getattr(type(client), "post", None))

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``'s result (a page, for a list method)."""
        if self.is_async:
            out = fn(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def about(self, fn: Callable[[str], Any], batch_id: str, provider: str,
                    read: Callable[[Any], T],
                    over: Callable[[str], Awaitable[T]] | None = None) -> T:
        """``read(fn(batch_id))``, a call about one batch: a 404 raises
        ``BatchNotFoundError``; with ``over``, a 400/409 (the batch is already over, for a
        cancel) returns ``over(batch_id)``."""
        try:
            found = await self(fn, batch_id)
        except Exception as exc:
            status = http_status(exc)
            if status == 404:
                raise BatchNotFoundError(batch_id, provider) from exc
            if over is not None and status in (400, 409):
                return await over(batch_id)
            raise
        return read(found)

    async def pages(self, fn: Callable[..., Any], after: str) -> AsyncGenerator[list[Any], None]:
        """The items of a list method, a page of 100 at a time, newest first; ``after``
        names the method's cursor keyword (the last item's id). Ends at an empty page, at
        ``has_more`` false, or when the server ignores the cursor (the same last id)."""
        last: str | None = None
        while True:
            page = await self(fn, limit=100, **({after: last} if last else {}))
            data = list(page.data)
            if data:
                yield data
            if not data or page.has_more is False or data[-1].id == last:
                return
            last = data[-1].id

    async def first(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The first item of a streamed result (``fn`` returns an iterable decoder),
        closing the stream after it; None when empty."""
        if self.is_async:
            stream = await self(fn, *args, **kwargs)
            try:
                async for item in stream:
                    return item
                return None
            finally:
                await stream.close()
        return await asyncio.to_thread(_first_sync, fn, args, kwargs)


def _first_sync(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    stream = fn(*args, **kwargs)
    try:
        return next(iter(stream), None)
    finally:
        stream.close()
