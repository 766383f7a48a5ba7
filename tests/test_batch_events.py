"""Map batches report in columns (``BatchEvent``): callbacks without ``on_batch`` see the same
per-item events as before, and the trace folds a batch to the same graph as its expansion."""

from __future__ import annotations

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine
from hypernodes_dist.events import BatchEvent, NodeEndEvent, NodeStartEvent, expanded
from hypernodes_dist.trace import TraceCollector, empty, reduce_events, summary
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
    assert older == reduce_events(empty(), [first])  # rebuilt from the undo journal
    assert len(newer) > len(older)
    assert newer == reduce_events(empty(), list(expanded([first, second])))
