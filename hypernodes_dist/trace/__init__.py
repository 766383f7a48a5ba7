"""Execution trace: a pure reducer from the events of any engine to an execution graph.

``reduce_event(trace, event) -> trace`` never changes ``trace``; the same events always give
an equal trace. Vertices (``TraceNode``): one per node execution (id
``"{run_id}:{node_id}:{iteration}"``), per run (``run_id``) and per map (``"map:{prefix}"``).
``Edge`` s: ``"seq"`` from a run to its first execution and on to the next (arrival order),
``"map"`` from a map to each item run, ``"nested"`` from the nesting execution (else the
parent run) to each inner run. Executions carry their status (``pending`` -> ``running`` ->
``complete`` | ``error`` | ``interrupted`` | ``skipped``), streamed chunks, gate decision,
attempts, worker and timing. Plain map batches stay columns: ``summary`` and ``timeline``
read them, records are built when read.
"""

from .collector import TraceCollector
from .log import Trace, empty, reduce_event, reduce_events
from .records import Chunks, Edge, TraceNode
from .timeline import Span, Timeline, timeline
from .views import DagLayout, LaidOutNode, NodeStats, dag, format_summary, summary

__all__ = [
    "Trace", "TraceNode", "Edge", "Chunks", "TraceCollector", "empty", "reduce_event",
    "reduce_events", "summary", "format_summary", "NodeStats", "timeline", "Timeline",
    "Span", "dag", "DagLayout", "LaidOutNode",
]
