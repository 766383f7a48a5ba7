"""Nodes of the Dask edge-case tests, at module level so worker processes import them."""

from __future__ import annotations

import os
import threading
import time

from hypernodes_dist import node


class LockedError(Exception):
    """An exception holding a lock: it cannot be pickled."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


@node(output_name="y")
def locked_failure(x: int) -> int:
    if x == 1:
        raise LockedError(f"locked out at {x}")
    return x


@node(output_name="y")
def returns_lock(x: int):
    return threading.Lock() if x == 1 else x


@node(output_name="y")
def factor_of(item: object) -> int:
    """Reads an attribute of a mapped value (the value's class may live anywhere)."""
    return item.factor  # type: ignore[attr-defined]


@node(output_name="y")
def fails_while_another_runs(x: int, log_dir: str) -> int:
    """Item 0 fails once item 1 has started; item 1 finishes only after item 0 failed (each
    in its own partition): item 1 still runs when the first partition raises."""
    started, failing = os.path.join(log_dir, "1-started"), os.path.join(log_dir, "0-failing")
    if x == 0:
        _wait_for(started)
        open(failing, "w").close()
        raise ValueError("item 0 fails")
    open(started, "w").close()
    _wait_for(failing, poll=0.2)  # it ends well after item 0 failed, as a slow call would
    open(os.path.join(log_dir, "1-finished"), "w").close()
    return x


def _wait_for(path: str, deadline: float = 60.0, poll: float = 0.02) -> None:
    end = time.monotonic() + deadline
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} not created within {deadline:.0f} s")
        time.sleep(poll)
