"""Nodes of the Dask edge-case tests, at module level so worker processes import them."""

from __future__ import annotations

import threading

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
