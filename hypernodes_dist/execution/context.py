"""The run a node call belongs to, for nodes that start runs of their own (nested graphs).

Executors set ``PARENT`` around the call of a nesting node when someone listens to events,
when the run has a cache, or when the nested graph can be interrupted: the nested graph
then reports its inner runs through the parent's event sink (with the parent's run id as
their ``parent_run_id``), shares the parent's cache and session (identical inner items of
one call compute once, as in ``map``), and takes the parent's interrupt responses and
handlers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, NamedTuple

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.perprocess import Memo

__all__ = ["Parent", "PARENT", "worker_id"]

_WORKER: Memo[str] = Memo("execution.context.worker")


def worker_id() -> str:
    """``host:pid`` of this process (computed once per process, also after a fork)."""
    return _WORKER.get("id", lambda: f"{socket.gethostname()}:{os.getpid()}")


class Parent(NamedTuple):
    emit: Callable[[Any], Any] | None  # None: nobody listens to events
    session_id: str
    run_id: str
    cache: Cache | None = None
    responses: dict[str, Any] | None = None  # interrupt name -> response (consumed when used)
    handlers: dict[str, Callable[[Any], Any]] | None = None


PARENT: ContextVar[Parent | None] = ContextVar("hypernodes_parent_run", default=None)
