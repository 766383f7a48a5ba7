"""One execution path for sync and async callers.

Every executor is written once, as a coroutine. A coroutine that awaits nothing that
suspends (a graph of sync nodes) is driven by a single ``send(None)``: no event loop, no
per-call overhead. Anything else runs on a per-thread event loop, or on a helper thread
when the caller is itself inside a running loop (Jupyter, async web handlers).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")
_local = threading.local()


def run_sync(coro: Coroutine[Any, Any, T], needs_loop: bool = True) -> T:
    """Run ``coro`` to completion from synchronous code and return its result."""
    if not needs_loop:
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        raise RuntimeError(
            "internal error: a coroutine planned as loop-free suspended; please report it"
        )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_on(_thread_loop(), coro)
    with ThreadPoolExecutor(1, thread_name_prefix="hypernodes-sync") as pool:
        return pool.submit(asyncio.run, coro).result()


def _run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop``; on Ctrl-C (or any escape) cancel it and let it unwind, so
    its ``finally`` blocks run (executors flush finished work to the cache there)."""
    task = loop.create_task(coro)
    with _sigint_cancels(loop, task) as interrupted:
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        except BaseException:
            if not task.done():
                task.cancel()
                try:
                    loop.run_until_complete(task)
                except BaseException:  # noqa: S110 - the original exception is what matters
                    pass
            raise


@contextmanager
def _sigint_cancels(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> Iterator[list[int]]:
    """In the main thread, Ctrl-C cancels ``task`` (which then unwinds) instead of raising
    ``KeyboardInterrupt`` wherever the loop happens to be: raised inside the loop's own
    bookkeeping, it can lose a task's wake-up and leave the unwinding hanging (this is
    what ``asyncio.run`` does too). A second Ctrl-C raises at once. The list it yields is
    non-empty once Ctrl-C was pressed."""
    hits: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield hits
        return

    def on_sigint(signum: int, frame: Any) -> None:
        hits.append(signum)
        if len(hits) == 1 and not task.done():
            task.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wake a loop blocked in select()
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield hits
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _thread_loop() -> asyncio.AbstractEventLoop:
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop
