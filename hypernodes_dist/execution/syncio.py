"""One execution path for sync and async callers, and one event loop per process.

Every executor is written once, as a coroutine. A coroutine that awaits nothing that
suspends (a graph of sync nodes) is driven by a single ``send(None)``: no event loop, no
per-call overhead. Anything else runs on **the process loop**: one event loop per process,
running in a daemon thread (``hypernodes-loop``) and started on first use. Every async node
call of the process runs there, whoever asks (successive ``map()``s, Dask threads, Daft's
async UDFs, a ``map()`` inside a running loop as in Jupyter, ``arun()``), so a loop-bound
client (an ``httpx``/``openai`` async client, an ``aiohttp`` session) built once is valid
for every later call. A forked child starts its own loop on first use.

Other threads touch that loop without asking: an ``openai`` client's finalizer closes its
connections from whichever loop runs the garbage collection (a notebook's), resolving the
process loop's futures and scheduling its transport callbacks with plain ``call_soon``.
asyncio's loop does not wake for those: it sleeps in ``select`` with them queued until some
I/O comes, for ever if its callers wait on them. The process loop (``_ProcessLoop``) wakes
whenever a callback or timer is scheduled from another thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Coroutine, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from hypernodes_dist.perprocess import PROCESS

__all__ = ["run_sync", "on_process_loop", "process_loop", "started_loop", "in_process_loop",
           "call_on_loop", "gather_tasks"]

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def run_sync(coro: Coroutine[Any, Any, T], needs_loop: bool = True) -> T:
    """Run ``coro`` to completion from synchronous code and return its result.

    ``needs_loop=False``: the caller knows ``coro`` never suspends (driven without a loop).
    Otherwise it runs on the process loop and this thread waits; Ctrl-C cancels it and
    waits for it to unwind (executors flush finished work to the cache there), then raises
    ``KeyboardInterrupt``. Called from the process loop's own thread (a sync node running
    a graph), it cannot wait on its own loop: ``coro`` then runs on a helper thread's loop.
    """
    if not needs_loop:
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        raise RuntimeError(
            "internal error: a coroutine planned as loop-free suspended; please report it"
        )
    if in_process_loop():
        with ThreadPoolExecutor(1, thread_name_prefix="hypernodes-sync") as pool:
            return pool.submit(asyncio.run, coro).result()
    return _wait_for(coro)


async def on_process_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the process loop from any event loop (``arun()`` from a user's
    loop, Daft's async UDFs); cancelling the caller cancels it there."""
    if in_process_loop():
        return await coro
    handle = _submit(coro)
    try:
        return await asyncio.wrap_future(handle.future)
    except asyncio.CancelledError:
        handle.cancel()
        raise


async def gather_tasks(aws: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run ``aws`` as tasks and gather their results; when one fails (or the caller is
    cancelled) the others are cancelled and awaited before the error goes on."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def process_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop (started on first use, in a daemon thread)."""
    global _loop, _thread
    loop = _loop
    if loop is not None and not loop.is_closed():
        return loop
    with _lock:
        if _loop is None or _loop.is_closed():
            ready = threading.Event()
            _loop = _ProcessLoop()
            _thread = threading.Thread(target=_serve, args=(_loop, ready), daemon=True,
                                       name="hypernodes-loop")
            _thread.start()
            ready.wait()
        return _loop


def started_loop() -> asyncio.AbstractEventLoop | None:
    """The process loop if it runs, without starting one."""
    loop = _loop
    return loop if loop is not None and loop.is_running() else None


def in_process_loop() -> bool:
    """Whether the caller runs on the process loop's thread."""
    return _thread is not None and threading.current_thread() is _thread


def call_on_loop(awaitable: Awaitable[T], timeout: float | None = None) -> T:
    """Wait (from another thread) for ``awaitable`` run on the process loop."""
    async def wrap() -> T:
        return await awaitable

    return _wait_for(wrap(), timeout)


def _wait_for(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the process loop and wait for its result in this thread. Ctrl-C (or
    SystemExit) here, wherever it lands, cancels it and waits for it to unwind; past
    ``timeout`` it is left to finish there (``TimeoutError``)."""
    handle = _Handle(process_loop())
    try:
        _schedule(handle, coro)
        return handle.future.result(timeout)
    except FutureTimeout:
        raise
    except BaseException:
        if not handle.future.done():
            handle.unwind()
        raise


class _ProcessLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, woken when another thread schedules a callback or a timer
    with the non-threadsafe ``call_soon``/``call_at`` (a future resolved there, a transport
    closed there): asyncio would leave it asleep in ``select`` until some I/O came."""

    # asyncio's stubs type these with a TypeVarTuple; the runtime signature is the same
    def call_soon(  # type: ignore[override]  # same call, typed narrower by typeshed
            self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        handle = super().call_soon(callback, *args, context=context)
        self._wake_from_elsewhere()
        return handle

    def call_at(  # type: ignore[override]  # same call, typed narrower by typeshed
            self, when: float, callback: Any, *args: Any,
            context: Any = None) -> asyncio.TimerHandle:
        timer = super().call_at(when, callback, *args, context=context)
        self._wake_from_elsewhere()
        return timer

    def _wake_from_elsewhere(self) -> None:
        running = self._thread_id  # type: ignore[attr-defined]  # BaseEventLoop internals, not in typeshed
        if running is not None and running != threading.get_ident():
            self._write_to_self()  # type: ignore[attr-defined]  # BaseEventLoop internals, not in typeshed


class _Handle:
    """A coroutine scheduled on the process loop: its ``future`` and a way to cancel it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: Future[Any] = Future()
        self.task: asyncio.Task[Any] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.loop.call_soon_threadsafe(self._cancel)

    def unwind(self) -> None:
        """Cancel the task and wait until it has unwound (its ``finally`` blocks give back
        the limits' units and flush finished work), however many Ctrl-Cs come meanwhile:
        a task left running would hold what it holds and starve the next map."""
        asked = False
        while not self.future.done():
            try:
                if not asked:
                    self.cancel()
                    asked = True
                wait([self.future])
            except KeyboardInterrupt:  # noqa: PERF203 - another Ctrl-C: still unwinding
                continue

    def _cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()
        elif not self.future.done():  # never started: nothing runs, nothing to unwind
            self.future.cancel()


def _submit(coro: Coroutine[Any, Any, Any]) -> _Handle:
    """Schedule ``coro`` on the process loop in a copy of the caller's context (context
    variables such as the parent run of nested graphs travel with it)."""
    handle = _Handle(process_loop())
    _schedule(handle, coro)
    return handle


def _schedule(handle: _Handle, coro: Coroutine[Any, Any, Any]) -> None:
    """Start ``coro`` as ``handle``'s task (unless it was cancelled first: then closed)."""
    ctx = contextvars.copy_context()

    def start() -> None:
        if handle.cancelled or not handle.future.set_running_or_notify_cancel():
            coro.close()
            handle.future.cancel()
            return
        handle.task = ctx.run(handle.loop.create_task, coro)
        handle.task.add_done_callback(lambda t: _settle(handle.future, t))

    handle.loop.call_soon_threadsafe(start)


def _settle(future: Future[Any], task: asyncio.Task[Any]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.set_exception(asyncio.CancelledError())
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def _forget_after_fork() -> None:
    global _loop, _thread, _lock
    _loop, _thread, _lock = None, None, threading.Lock()


PROCESS.register("execution.syncio", _forget_after_fork)  # forgotten in a forked child
