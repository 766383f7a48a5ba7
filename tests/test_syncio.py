"""``run_sync``: sync callers of coroutines; Ctrl-C cancels the running task, lets it unwind
(its ``finally`` blocks run: executors flush finished work there), then raises."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from hypernodes_dist.execution.syncio import run_sync


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


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers live in the main thread")
def test_ctrl_c_cancels_the_task_lets_it_unwind_then_raises():
    unwound: list[str] = []

    async def long_batch() -> None:
        try:
            asyncio.get_running_loop().call_later(0.05, signal.raise_signal, signal.SIGINT)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # the unwind may still await (flushes do)
            unwound.append("flushed")

    with pytest.raises(KeyboardInterrupt):
        run_sync(long_batch())
    assert unwound == ["flushed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    assert run_sync(asyncio.sleep(0, result="next call works")) == "next call works"
