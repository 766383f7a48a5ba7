"""``run_sync``: sync callers of coroutines; Ctrl-C cancels the running task, lets it unwind
(its ``finally`` blocks run: executors flush finished work there), then raises; the process
loop wakes for callbacks other threads schedule on it."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from concurrent.futures import Future

import pytest

from hypernodes_dist import Graph, node
from hypernodes_dist.execution.syncio import process_loop, run_sync


def test_results_and_errors_pass_through():
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    assert run_sync(add(1, 2)) == 3
    with pytest.raises(ValueError, match="boom"):
        run_sync(fail())


async def _ctrl_c() -> None:
    """What a terminal's Ctrl-C does once the main thread waits for the loop: SIGINT to
    the main thread (``raise_signal`` from the loop's thread would signal that thread and
    never wake the main one)."""
    main = threading.main_thread().ident
    while sys._current_frames()[main].f_code.co_name != "wait":
        await asyncio.sleep(0.001)
    signal.pthread_kill(main, signal.SIGINT)


@pytest.mark.timeout(60)  # a Ctrl-C that does not reach the main thread waits for ever
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers live in the main thread")
def test_ctrl_c_cancels_the_task_lets_it_unwind_then_raises():
    unwound: list[str] = []

    async def long_batch() -> None:
        try:
            await _ctrl_c()
            await asyncio.Event().wait()  # never set: only the Ctrl-C ends it
        finally:
            await asyncio.sleep(0)  # the unwind may still await (flushes do)
            unwound.append("flushed")

    with pytest.raises(KeyboardInterrupt):
        run_sync(long_batch())
    assert unwound == ["flushed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    assert run_sync(asyncio.sleep(0, result="next call works")) == "next call works"


@pytest.mark.timeout(60)
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers live in the main thread")
def test_a_second_ctrl_c_while_the_task_unwinds_still_waits_for_it():
    """What the task holds (a concurrency slot) is given back before ``KeyboardInterrupt``
    reaches the caller, even when Ctrl-C comes again during the unwind: a task left
    running would starve the next call."""
    slot = asyncio.Semaphore(1)

    async def holder() -> None:
        async with slot:
            try:
                await _ctrl_c()
                await asyncio.Event().wait()
            finally:
                await _ctrl_c()  # again, while unwinding
                await asyncio.sleep(0.05)

    async def take() -> str:
        async with slot:
            return "free"

    with pytest.raises(KeyboardInterrupt):
        run_sync(holder())
    assert not slot.locked(), "run_sync returned before its task let go of its slot"
    assert run_sync(take()) == "free"


@pytest.mark.timeout(60)
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers live in the main thread")
def test_ctrl_c_during_a_map_and_a_run_raises_in_the_main_thread():
    started: list[int] = []

    @node(output_name="y")
    async def stuck(x: int) -> int:
        started.append(x)
        if len(started) == 1:
            await _ctrl_c()
        await asyncio.Event().wait()
        return x

    graph = Graph([stuck])
    with pytest.raises(KeyboardInterrupt):
        graph.map({"x": [1, 2, 3]}, map_over="x")
    started.clear()
    with pytest.raises(KeyboardInterrupt):
        graph.run({"x": 1})
    assert run_sync(asyncio.sleep(0, result="next call works")) == "next call works"


def test_callbacks_scheduled_from_another_thread_wake_the_process_loop():
    """Plain ``call_soon``/``call_at`` and a future resolved from another thread (what an
    ``openai`` client's finalizer does from a notebook's loop) run at once, not when some
    I/O next wakes the loop (issue 34's map that never returned)."""
    loop = process_loop()
    run_sync(asyncio.sleep(0))  # the loop now sleeps in select, nothing scheduled
    ran: Future[str] = Future()
    loop.call_soon(ran.set_result, "call_soon")
    assert ran.result(timeout=10) == "call_soon"

    timer: Future[str] = Future()
    loop.call_later(0.01, timer.set_result, "call_later")
    assert timer.result(timeout=10) == "call_later"

    async def make() -> asyncio.Future[str]:
        return loop.create_future()

    fut = run_sync(make())
    waiter: Future[str] = Future()
    thread = threading.Thread(target=lambda: waiter.set_result(run_sync(_wait(fut))))
    thread.start()
    while not fut._callbacks:  # the waiter's task awaits it
        time.sleep(0.01)
    fut.set_result("resolved here")
    assert waiter.result(timeout=10) == "resolved here"
    thread.join()


async def _wait(fut: asyncio.Future[str]) -> str:
    return await fut
