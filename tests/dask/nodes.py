"""Nodes used by the Dask tests, at module level so worker processes import them."""

from __future__ import annotations

import os
import threading
import time

from hypernodes_dist import node
from tests.conformance.graphs import CHAIN, double, fmt, inc  # noqa: F401 - the shared chain


class Unpicklable(Exception):
    """An exception that cannot be rebuilt from its args (pickling round trip fails)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"bad pair {a}/{b}")


@node(output_name="pid")
def where(x: int) -> int:
    return os.getpid()


@node(output_name="size")
def blob_size(x: int, blob: bytes) -> int:
    return len(blob) + x


class Unportable(Exception):
    """An exception holding a lock: neither it nor its state can cross a process."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


@node(output_name="out")
def explode(x: int) -> int:
    if x == 5:
        raise Unpicklable(x, 0)
    return x


@node(output_name="out")
def lock_holder(x: int) -> int:
    if x == 5:
        raise Unportable(f"held lock at {x}")
    return x


@node(output_name="slow")
def slow_square(x: int, delay: float = 0.05) -> int:
    time.sleep(delay)
    return x * x


@node(output_name="late")
def fail_after(x: int, log_dir: str, delay: float = 0.2) -> int:
    """Leaves one file per call in ``log_dir`` (proves whether the call ran), then fails."""
    import uuid

    with open(os.path.join(log_dir, uuid.uuid4().hex), "w") as f:
        f.write(str(x))
    time.sleep(delay)
    raise ValueError(f"item {x} is bad")


@node(output_name="token")
def record_call(x: int, log_dir: str) -> int:
    import uuid

    with open(os.path.join(log_dir, uuid.uuid4().hex), "w") as f:
        f.write(str(x))
    return x


@node(output_name="echo")
def uses_handle(x: int, handle: object) -> int:
    return x


@node(output_name="thread")
def which_thread(x: int) -> int:
    import threading

    time.sleep(0.01)
    return threading.get_ident()
