"""The run a node call belongs to, for nodes that start runs of their own (nested graphs).

Executors set ``PARENT`` around the call of a nesting node when someone listens to events;
the nested graph then reports its inner runs through the parent's event sink, with the
parent's run id as their ``parent_run_id``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, NamedTuple

__all__ = ["Parent", "PARENT"]


class Parent(NamedTuple):
    emit: Callable[[Any], Any]
    session_id: str
    run_id: str


PARENT: ContextVar[Parent | None] = ContextVar("hypernodes_parent_run", default=None)
