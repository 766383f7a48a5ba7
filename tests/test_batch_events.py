"""Map batches report in columns (``BatchEvent``): callbacks without ``on_batch`` see the same
per-item events as before, and the trace folds a batch to the same graph as its expansion."""

from __future__ import annotations

import gc
import weakref

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, node
from hypernodes_dist.events import BatchEvent, NodeEndEvent, NodeStartEvent, RunEndEvent, expanded
from hypernodes_dist.trace import TraceCollector, empty, reduce_events, summary, timeline
from tests.conformance.graphs import BRANCH, double, fmt, fragile, inc
from tests.conformance.nested_graphs import OUTER


class Blocks:
    """Keeps the batch events as they arrive."""

    def __init__(self) -> None:
        self.batches: list[BatchEvent] = []

    def on_batch(self, event: BatchEvent) -> None:
        self.batches.append(event)


class PerItem:
    def __init__(self) -> None:
        self.ends: list[NodeEndEvent] = []
        self.starts: list[NodeStartEvent] = []

    def on_node_start(self, event: NodeStartEvent) -> None:
        self.starts.append(event)

    def on_node_end(self, event: NodeEndEvent) -> None:
        self.ends.append(event)


def _map(case: str, tmp_path) -> tuple[list, dict, dict]:
    chain = [inc, double, fmt]
    cache = DiskCache(tmp_path / "c")
    return {
        "chain": (chain, {"x": list(range(7))}, {}),
        "errors": ([fragile], {"x": list(range(6)), "bad": (1, 4)}, {"on_error": "collect"}),
        "branch": (BRANCH, {"data": [{"valid": v % 2 == 0, "v": v} for v in range(6)]}, {}),
        "nested": (OUTER, {"document": ["ab|a", "", "aaa|b|c"]}, {}),
        "cached": (chain, {"x": [1, 2, 2, 3]}, {"cache": cache}),
    }[case]


@pytest.mark.parametrize("case", ["chain", "errors", "branch", "nested", "cached"])
def test_a_batch_folds_to_the_trace_of_its_expansion(tmp_path, case):
    nodes, inputs, options = _map(case, tmp_path)
    cache = options.pop("cache", None)
    over = next(iter(inputs))
    if cache is not None:
        Graph(nodes, cache=cache).map(inputs, map_over=over)  # the map below is all hits
    blocks = Blocks()
    Graph(nodes, cache=cache, callbacks=[blocks]).map(inputs, map_over=over, **options)
    assert blocks.batches and all(isinstance(b, BatchEvent) for b in blocks.batches)
    folded = reduce_events(empty(), blocks.batches)
    assert folded == reduce_events(empty(), list(expanded(blocks.batches)))
    runs = [r for r in folded.runs() if r.item_index is not None and r.parent_run_id is None]
    assert len(runs) == len(inputs[over])
    if case == "cached":
        assert all(e.cached for e in folded.executions())


def test_per_item_callbacks_see_every_execution_with_its_time_and_outputs():
    per_item, blocks = PerItem(), Blocks()
    Graph([inc, double, fmt], callbacks=[per_item, blocks]).map({"x": [1, 2, 3]}, map_over="x")
    assert len(blocks.batches) == 1  # the block went to on_batch only
    assert [(e.node_id, e.item_index) for e in per_item.starts] == [
        (n, i) for n in ("inc", "double", "fmt") for i in range(3)]
    ends = {(e.node_id, e.item_index): e for e in per_item.ends}
    assert ends[("fmt", 2)].outputs == {"c": "8-y"}
    for e in per_item.ends:
        assert e.started_at > 0 and e.duration_ms >= 0 and not e.cached
        assert e.timestamp == pytest.approx(e.started_at + e.duration_ms / 1e3)
    for n in ("inc", "double", "fmt"):  # calls of a node run one after the other
        spans = sorted((e.started_at, e.timestamp) for e in per_item.ends if e.node_id == n)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))


def test_failed_item_keeps_its_upstream_outputs_in_events():
    per_item = PerItem()
    res = Graph([fragile], callbacks=[per_item]).map({"x": [1, 3, 5], "bad": (3,)},
                                                     map_over="x", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert sorted(e.item_index for e in per_item.ends) == [0, 2]
    assert all("MISSING" not in repr(e.outputs) for e in per_item.ends)


def test_collector_folds_blocks_when_the_trace_is_read():
    collector = TraceCollector()
    n = 250
    Graph([inc, double, fmt], callbacks=[collector]).map({"x": list(range(n))}, map_over="x")
    stats = summary(collector.trace)
    assert {name: stats[name].executions for name in ("inc", "double", "fmt")} == {
        "inc": n, "double": n, "fmt": n}


def test_an_older_trace_is_unchanged_by_folding_later_batches():
    blocks = Blocks()
    Graph([inc, double, fmt], callbacks=[blocks], engine=GraphEngine(batch_size=2)).map(
        {"x": [1, 2, 3, 4]}, map_over="x")
    first, second = blocks.batches
    older = reduce_events(empty(), [first])
    newer = reduce_events(older, [second])
    assert older == reduce_events(empty(), [first])  # folded anew from its prefix of the log
    assert len(newer) > len(older)
    assert newer == reduce_events(empty(), list(expanded([first, second])))


# -- projections read deferred batches as columns --------------------------------------------


def _batches(case: str, tmp_path) -> list[BatchEvent]:
    nodes, inputs, options = _map(case, tmp_path)
    cache = options.pop("cache", None)
    over = next(iter(inputs))
    if cache is not None:  # half the items are hits: a node reports a hit and a ran part
        Graph(nodes, cache=cache).map({over: inputs[over][::2]}, map_over=over)
    blocks = Blocks()
    Graph(nodes, cache=cache, callbacks=[blocks], engine=GraphEngine(batch_size=3)).map(
        inputs, map_over=over, **options)
    return blocks.batches


def _spans(trace) -> tuple[list[tuple], list[float]]:
    """The timeline's spans, and apart their ends (records keep start + duration: equal
    to the microsecond)."""
    spans = timeline(trace).spans
    return ([(s.node_id, s.run_id, s.item_index, s.iteration, s.worker, s.lane, s.start,
              s.status, s.cached) for s in spans], [s.end for s in spans])


@pytest.mark.parametrize("case", ["chain", "errors", "branch", "nested", "cached"])
def test_summary_and_timeline_of_batches_equal_those_of_their_events(tmp_path, case):
    batches = _batches(case, tmp_path)
    folded = reduce_events(empty(), batches)
    per_event = reduce_events(empty(), list(expanded(batches)))
    assert summary(folded) == summary(per_event)
    (spans, ends), (expected, expected_ends) = _spans(folded), _spans(per_event)
    assert spans == expected and ends == pytest.approx(expected_ends, abs=1e-6, rel=0)
    assert folded == per_event  # reading the records folds the rest: the same trace


def test_a_plain_map_is_summarised_without_building_its_records(tmp_path):
    batches = _batches("cached", tmp_path)
    trace = reduce_events(empty(), batches)
    stats = summary(trace)
    assert stats["inc"].cached + stats["inc"].ran == 4 and stats["inc"].cached >= 1
    assert len(timeline(trace).spans) == 12
    assert not trace._fold().nodes  # still columns
    assert len(trace) > 12  # records on demand


def test_batches_reporting_the_same_runs_twice_fold_like_their_events(tmp_path):
    first = _batches("chain", tmp_path)[0]
    twice = reduce_events(empty(), [first, first])
    per_event = reduce_events(empty(), list(expanded([first, first])))
    assert summary(twice) == summary(per_event)
    assert twice == per_event
    assert {e.attempts for e in twice.executions()} == {2}  # each execution started twice


def test_versions_around_a_fold_on_read_keep_their_content(tmp_path):
    first, second, *_ = _batches("chain", tmp_path)
    one = reduce_events(empty(), [first])
    two = reduce_events(one, [second])
    assert len(two) > 0  # folds ``two``'s batches in place
    run_end = RunEndEvent(run_id="other", session_id="s", status="complete")
    three = reduce_events(two, [run_end])
    assert one == reduce_events(empty(), list(expanded([first])))
    assert two == reduce_events(empty(), list(expanded([first, second])))
    assert three == reduce_events(empty(), [*expanded([first, second]), run_end])
    assert summary(one)["inc"].executions == len(first.parts[0].items)


class Payload:
    """A node output that can be watched for garbage collection."""


@node(output_name="payload")
def make_payload(x: int) -> Payload:
    return Payload()


def test_a_collected_trace_does_not_keep_node_outputs_alive():
    collector = TraceCollector()
    res = Graph([make_payload], callbacks=[collector]).map({"x": list(range(50))}, map_over="x")
    watched = [weakref.ref(r["payload"]) for r in res]
    del res
    gc.collect()
    assert not any(ref() is not None for ref in watched)
    assert summary(collector.trace)["make_payload"].executions == 50
    assert len(collector.trace.executions()) == 50
