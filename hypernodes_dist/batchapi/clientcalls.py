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
from collections.abc import Callable
from typing import Any

__all__ = ["ClientCalls", "http_status"]


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
