"""Execution trace: a pure reducer from the events of any engine to an execution graph.

``reduce_event(trace, event) -> trace`` never changes ``trace``; reducing the same events
from ``empty()`` always gives an equal trace. The graph it builds has

- one ``TraceNode`` per node execution, id ``"{run_id}:{node_id}:{iteration}"``; one per run
  (id ``run_id``) and one per map call (id ``"map:{run prefix}"``);
- edges ``Edge(src, dst, kind)``: ``"seq"`` from a run to its first execution and from each
  execution to the next one of the same run (arrival order), ``"map"`` from a map to each
  item run, ``"nested"`` from the nesting execution (or, when the events do not tell which,
  the parent run) to each inner run (events with ``parent_run_id``);
- a status per execution derived from its lifecycle (``pending`` -> ``running`` ->
  ``complete`` | ``error`` | ``interrupted`` | ``skipped``), streaming chunks appended to
  the execution that produced them, gate decisions, attempts, worker and timing.

A plain map batch (``BatchEvent``: top-level runs, node columns only) stays columns:
``summary`` and ``timeline`` read them, records are built when something reads them.
Modules: ``records`` (the vertex types), ``fold`` (events -> records), ``log`` (the
immutable ``Trace``: an append-only event log and its memoised fold), ``collector``,
``views`` (``summary``, ``dag``) and ``timeline`` (PNG / self-contained HTML).
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
