"""Execution trace: a pure reducer from the events of any engine to an execution graph.
``reduce_event(trace, event) -> trace`` never changes ``trace``; the same events always give
an equal trace. Vertices (``TraceNode``): one per node execution (id
``"{run_id}:{node_id}:{iteration}"``), per run (``run_id``) and per map (``"map:{prefix}"``).
``Edge`` s: ``"seq"`` from a run to its first execution and on to the next (arrival order),
``"map"`` from a map to each item run, ``"nested"`` from the nesting execution (else the
parent run) to each inner run. Executions carry their status (``pending`` -> ``running`` ->
``complete`` | ``error`` | ``interrupted`` | ``skipped``), streamed chunks, gate decision,
attempts, worker, timing. Plain map batches stay columns until records are read."""

from .fold import Chunks, Edge, TraceNode
from .log import Trace, TraceCollector, empty, reduce_event, reduce_events
from .views import dag, format_summary, summary, timeline  # their types: in ``views``

__all__ = ["Trace", "TraceNode", "Edge", "Chunks", "TraceCollector", "empty", "reduce_event",
           "reduce_events", "summary", "format_summary", "timeline", "dag"]
