"""What a trace is made of: ``TraceNode`` vertices, ``Edge`` s and streamed ``Chunks``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, NamedTuple

from hypernodes_dist.execution.invoke import join_chunks


@dataclass(slots=True)
class TraceNode:
    """One vertex of the trace: a node execution, a run, or a map call (a snapshot)."""
    id: str
    kind: str  # "node" | "run" | "map"
    run_id: str = ""
    node_id: str = ""  # the graph node's name ("node" vertices)
    iteration: int = 0
    status: str = "pending"
    session_id: str = ""
    item_index: int | None = None
    parent_run_id: str | None = None
    node_type: str = ""
    step_index: int = -1
    started_at: float | None = None  # wall clock, seconds
    duration_ms: float | None = None
    cached: bool = False
    worker: str = ""
    attempts: int = 0
    error: str | None = None
    decision: Any = None
    chunks: Chunks | None = None  # streamed chunks (None: not a streaming execution)
    tags: tuple[str, ...] = ()
    items: int = 0  # map: item runs ended so far
    failed: int = 0  # map: item runs that ended in error

    @property
    def ended_at(self) -> float | None:
        done = self.started_at is not None and self.duration_ms is not None
        return self.started_at + self.duration_ms / 1000.0 if done else None  # type: ignore[operator]

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


values = attrgetter(*(f.name for f in fields(TraceNode)))  # a record's fields, as a tuple


class Edge(NamedTuple):
    src: str
    dst: str
    kind: str  # "seq" | "map" | "nested"


class Chunks(list):  # type: ignore[type-arg]
    """The chunks a streaming execution yielded, in order."""

    def joined(self) -> Any:
        """The chunks joined like a streaming node's value ("".join, b"".join, merged dicts)."""
        return join_chunks(list(self))
