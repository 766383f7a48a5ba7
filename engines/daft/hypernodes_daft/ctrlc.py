"""Ctrl-C stays with Python while Daft's native runner runs a dataset map's steps.

Daft 0.7's native runner waits on ``tokio::signal::ctrl_c`` beside every query it runs
(``ExecutionRuntimeContext::join_next`` in ``daft_local_execution``, compiled into
``daft.abi3.so``; it prints "Received Ctrl-C, shutting down execution engine") and cancels
the query on SIGINT, so the rows of the step in flight would be lost; no option turns that
off (none in ``daft/context.py``, no such environment variable among the binary's
strings). Tokio registers its SIGINT hook
once per process, through ``signal_hook_registry``, when the first query runs a pipeline
(a plain ``from_pydict().collect()`` does not): the hook replaces the process's
``sigaction`` and chains to the handler it found (Python's). It never installs itself
again, so once Python's handler is installed again (``signal.signal`` calls ``sigaction``)
SIGINT reaches Python only.

``keep_ctrl_c_in_python()`` does that before a map's first step: one one-row UDF query
(tokio registers), then ``signal.signal`` with the handler in force. The driver's handler
(``datasets.stop.on_ctrl_c``) then stops the map through ``MapStop``: the step in flight
finishes and is written, as on every engine. Afterwards a Ctrl-C in this process raises
``KeyboardInterrupt`` in Python, where a user's own Daft query is stopped by it as Python
code is, instead of Daft's runner shutting the query down itself.
"""

from __future__ import annotations

import signal
import threading

import daft
from daft import col

__all__ = ["keep_ctrl_c_in_python"]

_done = False


@daft.func
def _one(x: int) -> int:
    return x


def keep_ctrl_c_in_python() -> None:
    """Once per process, in the main thread: let Daft register its SIGINT hook, then give
    SIGINT back to Python's handler (see the module doc)."""
    global _done
    if _done or threading.current_thread() is not threading.main_thread():
        return
    _done = True
    try:
        daft.from_pydict({"x": [0]}).select(_one(col("x"))).collect()
    except Exception:  # noqa: S110 - a Ctrl-C Daft saw during this query: tokio registered
        pass
    finally:
        handler = signal.getsignal(signal.SIGINT)
        if handler is not None:  # None: a handler not set from Python, left as it is
            signal.signal(signal.SIGINT, handler)
