"""The trace reducer: ids, edges, status, streaming, determinism, immutability; projections."""

from __future__ import annotations

import pickle
from typing import Literal

import pytest

from hypernodes_dist import END, DiskCache, Graph, gate, node
from hypernodes_dist.events import (
    GateDecisionEvent,
    InterruptEvent,
    NodeEndEvent,
    NodeErrorEvent,
    NodeSkippedEvent,
    NodeStartEvent,
    ResumeEvent,
    RunEndEvent,
    RunStartEvent,
    StateDeltaEvent,
    StreamingChunkEvent,
    StreamingEndEvent,
    StreamingStartEvent,
)
from hypernodes_dist.trace import (
    Edge,
    Trace,
    TraceCollector,
    dag,
    empty,
    format_summary,
    reduce_event,
    reduce_events,
    summary,
    timeline,
)


def _run_events(run: str = "r1", item: int | None = None, parent: str | None = None) -> list:
    base = dict(session_id="s", run_id=run, item_index=item, parent_run_id=parent)
    return [
        RunStartEvent(**base, timestamp=100.0),
        NodeStartEvent(**base, node_id="f", step_index=0, timestamp=100.0),
        NodeEndEvent(**base, node_id="f", step_index=0, started_at=100.0, duration_ms=20.0,
                     worker="w1"),
        NodeStartEvent(**base, node_id="g", step_index=1, timestamp=100.02),
        NodeErrorEvent(**base, node_id="g", step_index=1, error=ValueError("boom"),
                       started_at=100.02, duration_ms=5.0, attempts=3, worker="w1"),
        RunEndEvent(**base, status="error", error=ValueError("boom"), timestamp=100.03),
    ]


def _fold(events: list) -> Trace:
    trace = empty()
    for e in events:
        trace = reduce_event(trace, e)
    return trace


# ---------------------------------------------------------------------------- reducer


def test_ids_sequential_edges_and_status():
    t = _fold(_run_events())
    assert list(t.nodes) == ["r1", "r1:f:0", "r1:g:0"]
    f, g, run = t.nodes["r1:f:0"], t.nodes["r1:g:0"], t.nodes["r1"]
    assert (f.kind, f.status, f.duration_ms, f.worker, f.attempts) == ("node", "complete", 20.0, "w1", 1)
    assert abs(f.ended_at - 100.02) < 1e-9
    assert (g.status, g.error, g.attempts, g.retries) == ("error", "ValueError: boom", 3, 2)
    assert (run.kind, run.status) == ("run", "error")
    assert list(t.edges) == [Edge("r1", "r1:f:0", "seq"), Edge("r1:f:0", "r1:g:0", "seq")]
    assert t.children("r1:f:0") == ["r1:g:0"]
    assert t.version == 6


def test_running_then_complete_and_iterations():
    base = dict(session_id="s", run_id="r")
    t = reduce_event(empty(), NodeStartEvent(**base, node_id="f", iteration=0))
    assert t.nodes["r:f:0"].status == "running"
    t = reduce_event(t, NodeEndEvent(**base, node_id="f", iteration=0))
    t = reduce_event(t, NodeStartEvent(**base, node_id="f", iteration=1))
    assert [n.status for n in t.executions()] == ["complete", "running"]
    assert list(t.edges)[-1] == Edge("r:f:0", "r:f:1", "seq")


def test_cached_end_without_start_creates_the_execution():
    ev = NodeEndEvent(session_id="s", run_id="r", node_id="f", cached=True, timestamp=5.0)
    n = reduce_event(empty(), ev).nodes["r:f:0"]
    assert (n.status, n.cached, n.started_at) == ("complete", True, 5.0)


def test_streaming_chunks_append_to_one_node():
    base = dict(session_id="s", run_id="r", node_id="gen")
    events = [NodeStartEvent(**base), StreamingStartEvent(**base, output_name="text")]
    events += [StreamingChunkEvent(**base, chunk=c, chunk_index=i) for i, c in enumerate("abc")]
    events += [StreamingEndEvent(**base, final_value="abc"), NodeEndEvent(**base)]
    t = _fold(events)
    assert list(t.nodes) == ["r", "r:gen:0"]
    n = t.nodes["r:gen:0"]
    assert list(n.chunks) == ["a", "b", "c"] and n.chunks.joined() == "abc"
    assert n.status == "complete"
    # an older version keeps the chunks it had, even after later appends
    partial = _fold(events[:3])
    later = reduce_event(partial, StreamingChunkEvent(**base, chunk="X"))
    other = reduce_event(partial, StreamingChunkEvent(**base, chunk="Y"))
    assert list(partial.nodes["r:gen:0"].chunks) == ["a"]
    assert list(later.nodes["r:gen:0"].chunks) == ["a", "X"]
    assert list(other.nodes["r:gen:0"].chunks) == ["a", "Y"]


def test_streaming_graph_node_from_a_real_run():
    @node(output_name="words")
    def talk(n: int):
        for i in range(n):
            yield f"w{i} "

    c = TraceCollector()
    result = Graph([talk], callbacks=[c]).run({"n": 3})
    (n,) = c.trace.executions()
    assert n.chunks.joined() == result["words"] == "w0 w1 w2 "


def test_gate_decision_skip_and_interrupt_status():
    base = dict(session_id="s", run_id="r")
    t = _fold([
        NodeStartEvent(**base, node_id="route", node_type="gate"),
        GateDecisionEvent(**base, node_id="route", gate_id="route", decision="a",
                          activated_targets=("a",)),
        NodeSkippedEvent(**base, node_id="b", reason="gate 'route' chose 'a'", skipped_by="route"),
        NodeEndEvent(**base, node_id="route"),
        InterruptEvent(**base, node_id="ask", interrupt_name="ask", value="?"),
        StateDeltaEvent(**base, node_id="ask"),  # no effect on the graph
    ])
    assert t.nodes["r:route:0"].decision == "a"
    assert t.nodes["r:b:0"].status == "skipped"
    assert t.nodes["r:ask:0"].status == "interrupted"
    t = reduce_event(t, ResumeEvent(**base, node_id="ask", interrupt_name="ask"))
    assert t.nodes["r:ask:0"].status == "running"
    t = reduce_event(t, NodeEndEvent(**base, node_id="ask", iteration=0))
    assert t.nodes["r:ask:0"].status == "complete"
    # a skipped target that later runs becomes that execution
    t = reduce_event(t, NodeStartEvent(**base, node_id="b", iteration=0))
    assert t.nodes["r:b:0"].status == "running"


def test_map_and_nested_cross_run_edges():
    events = _run_events("m-0", item=0) + _run_events("m-1", item=1)
    events += _run_events("m-0/sub-0", item=0, parent="m-0")
    t = _fold(events)
    assert t.nodes["map:m"].kind == "map"
    assert (t.nodes["map:m"].items, t.nodes["map:m"].failed) == (2, 2)
    edges = list(t.edges)
    assert Edge("map:m", "m-0", "map") in edges and Edge("map:m", "m-1", "map") in edges
    # the inner run hangs off the nesting execution (a placeholder until its events arrive)
    assert Edge("m-0:sub:0", "m-0/sub-0", "nested") in edges
    assert t.nodes["m-0/sub-0"].parent_run_id == "m-0"


def test_nested_graph_edges_from_a_real_map():
    @node(output_name="y")
    def inc(x: int) -> int:
        return x + 1

    c = TraceCollector()
    outer = Graph([Graph([inc], name="inner").as_node(name="sub")], callbacks=[c])
    outer.map({"x": [1, 2]}, map_over="x")
    nested = [e for e in c.trace.edges if e.kind == "nested"]
    assert len(nested) == 2
    for e in nested:
        assert c.trace.nodes[e.src].node_id == "sub" and c.trace.nodes[e.src].status == "complete"
        assert c.trace.nodes[e.dst].kind == "run"


def test_determinism_same_events_equal_traces():
    @node(output_name="a")
    def f(x: int) -> int:
        return x + 1

    @node(output_name="b")
    def g(a: int) -> int:
        if a == 3:
            raise ValueError("three")
        return a * 2

    rec: list = []

    class Record:
        def on_event(self, e):
            rec.append(e)

    Graph([f, g], callbacks=[Record()]).map({"x": list(range(6))}, map_over="x", on_error="collect")
    a, b = _fold(rec), _fold(rec)
    assert a == b and a is not b
    assert reduce_events(empty(), rec) == a  # the batched fold is the same fold
    assert len(a.executions()) == 12
    assert sum(n.status == "error" for n in a.executions()) == 1
    assert pickle.loads(pickle.dumps(a)) == a


def test_input_trace_is_never_mutated():
    events = _run_events()
    versions = [empty()]
    snapshots = [dict(versions[0].nodes)]
    for e in events:
        versions.append(reduce_event(versions[-1], e))
        snapshots.append(dict(versions[-1].nodes))
    # every older version still reads exactly what it held, edges included
    for i, (t, snap) in enumerate(zip(versions, snapshots)):
        assert dict(t.nodes) == snap
        assert t == _fold(events[:i])
    # branching an old version leaves both lineages intact
    mid = versions[4]  # g running
    alt = reduce_event(mid, NodeEndEvent(session_id="s", run_id="r1", node_id="g", step_index=1))
    assert alt.nodes["r1:g:0"].status == "complete"
    assert versions[-1].nodes["r1:g:0"].status == "error"
    assert mid.nodes["r1:g:0"].status == "running"
    view = mid.nodes  # a view taken before further reductions stays on its version
    reduce_event(mid, RunEndEvent(session_id="s", run_id="r1", status="complete"))
    assert view["r1"].status == "running"


def test_versions_share_one_log_and_one_memoised_fold():
    trace = empty()
    for e in _run_events() * 50:
        trace = reduce_event(trace, e)
        # each read moves the log's one fold forward by the new event: no copy per version
        assert trace._fold(records=True) is trace._log.memo
    assert len(trace) == 3
    kept = trace
    trace = reduce_event(trace, _run_events("r2")[0])
    trace = reduce_event(trace, _run_events("r2")[1])
    assert "r2" not in kept.nodes  # the kept version still reads its own prefix of the log
    assert "r2:f:0" in trace.nodes


def test_collector_buffers_and_folds():
    c = TraceCollector(batch=4)
    for e in _run_events():
        c.on_event(e)
    assert c.trace == _fold(_run_events())


# ---------------------------------------------------------------------------- projections


def _synthetic(durations: list[float], worker: str = "w") -> Trace:
    events = []
    for i, d in enumerate(durations):
        base = dict(session_id="s", run_id=f"m-{i}", item_index=i)
        events += [RunStartEvent(**base),
                   NodeEndEvent(**base, node_id="f", started_at=10.0 + i * 0.001,
                                duration_ms=d, worker=worker),
                   RunEndEvent(**base)]
    return _fold(events)


def test_summary_counts_and_percentiles(tmp_path):
    t = _fold(_run_events())
    s = summary(t)
    assert (s["f"].executions, s["f"].ran, s["f"].errors) == (1, 1, 0)
    assert (s["g"].errors, s["g"].retries) == (1, 2)
    s = summary(_synthetic([float(d) for d in range(1, 101)]))["f"]
    assert (s.p50_ms, s.p95_ms, s.max_ms, s.executions) == (50.0, 95.0, 100.0, 100)
    assert "p95 ms" in format_summary(summary(t))

    @node(output_name="y")
    def sq(x: int) -> int:
        return x * x

    c = TraceCollector()
    g = Graph([sq], cache=DiskCache(tmp_path / "c"), callbacks=[c])
    g.map({"x": [1, 2, 3]}, map_over="x")
    g.map({"x": [1, 2, 3]}, map_over="x")
    s = summary(c.trace)["sq"]
    assert (s.executions, s.ran, s.cached) == (6, 3, 3)


def test_timeline_lanes_spans_and_rendering(tmp_path):
    base = dict(session_id="s")
    events = [  # two overlapping executions on w1, one on w2
        NodeEndEvent(**base, run_id="a", node_id="f", started_at=1.0, duration_ms=500, worker="w1"),
        NodeEndEvent(**base, run_id="b", node_id="f", started_at=1.2, duration_ms=500, worker="w1"),
        NodeEndEvent(**base, run_id="c", node_id="g", started_at=1.1, duration_ms=100, worker="w2"),
        NodeErrorEvent(**base, run_id="d", node_id="g", started_at=1.6, duration_ms=10,
                       worker="w2", error=RuntimeError("x")),
    ]
    tl = timeline(_fold(events))
    assert len(tl.spans) == 4 and tl.nodes == ("f", "g")
    assert tl.lanes == ("w1 #0", "w1 #1", "w2")
    assert tl.t0 == 1.0 and abs(tl.t1 - 1.7) < 1e-9
    assert {s.lane for s in tl.spans if s.worker == "w1"} == {0, 1}
    html_path = tl.to_html(tmp_path / "t.html")
    text = html_path.read_text()
    assert "<svg" in text and "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    pytest.importorskip("matplotlib")
    png = tl.to_png(tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_of_a_big_synthetic_map_renders(tmp_path):
    tl = timeline(_synthetic([0.9] * 5000))
    assert len(tl.spans) == 5000 and tl.lanes == ("w",)
    svg = tl.to_svg()
    assert svg.count("<rect") < 200  # merged at pixel resolution


def test_dag_layout_layers():
    t = _fold(_run_events("m-0", item=0) + _run_events("m-1", item=1))
    layout = dag(t)
    pos = {n.id: (n.x, n.y) for n in layout.nodes}
    assert pos["map:m"] == (0, 0)
    assert pos["m-0"] == (1, 0) and pos["m-1"] == (1, 1)
    assert pos["m-0:f:0"][0] == 2 and pos["m-0:g:0"][0] == 3
    assert layout.width == 4 and layout.height == 2
    assert len(layout.edges) == len(t.edges)


def test_gate_loop_trace_from_a_real_run():
    @node(output_name="n")
    def init(seed: int) -> int:
        return seed

    @node(output_name="n")
    def step(n: int) -> int:
        return n + 1

    @gate
    def again(n: int) -> Literal["step", END]:
        return "step" if n < 3 else END

    c = TraceCollector()
    Graph([init, step, again], callbacks=[c]).run({"seed": 0})
    ids = [n.id for n in c.trace.executions()]
    run = c.trace.runs()[0].id
    assert f"{run}:step:0" in ids and f"{run}:step:2" in ids
    assert [n.decision for n in c.trace.executions() if n.node_id == "again"][-1] == END


# ---------------------------------------------------------------------------- engines


def _engine(name: str):
    engines = pytest.importorskip("hypernodes_dist.engines")
    if name == "dask":
        pytest.importorskip("dask")
        return engines.DaskEngine(scheduler="threads", partition_size=5, num_workers=2)
    if name == "dask-processes":
        pytest.importorskip("dask")
        return engines.DaskEngine(scheduler="processes", partition_size=10, num_workers=2)
    pytest.importorskip("daft")
    return engines.DaftEngine(batch_size=5)


@node(output_name="a")
def _inc(x: int) -> int:
    return x + 1


@node(output_name="b")
def _double(a: int) -> int:
    return a * 2


@pytest.mark.parametrize("engine_name", ["dask", "daft"])
def test_timeline_written_for_an_engine_map(engine_name, tmp_path):
    engine = _engine(engine_name)
    c = TraceCollector()
    try:
        g = Graph([_inc, _double], engine=engine, callbacks=[c])
        result = g.map({"x": list(range(20))}, map_over="x")
    finally:
        engine.close()
    assert [r["b"] for r in result] == [(x + 1) * 2 for x in range(20)]
    trace = c.trace
    assert len(trace.runs()) == 20 and len(trace.executions()) == 40
    assert all(n.status == "complete" and n.worker and n.started_at for n in trace.executions())
    assert sum(e.kind == "map" for e in trace.edges) == 20
    tl = timeline(trace)
    assert len(tl.spans) == 40 and tl.duration >= 0
    if engine_name == "dask-processes":
        assert len(tl.workers) >= 1
    tl.to_html(tmp_path / "t.html")
    assert (tmp_path / "t.html").stat().st_size > 0
    if engine_name != "dask-processes":  # one PNG per engine family is enough
        pytest.importorskip("matplotlib")
        assert tl.to_png(tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_retries_counted_from_policy_events():
    calls: dict = {}

    @node(output_name="y", retries=2, backoff=0.001)
    def flaky(x: int) -> int:  # each item fails once (items retry side by side)
        calls[x] = calls.get(x, 0) + 1
        if calls[x] % 2:
            raise RuntimeError("flaky")
        return x

    for how in ("run", "map"):
        calls.clear()
        c = TraceCollector()
        g = Graph([flaky], callbacks=[c])
        g.run({"x": 1}) if how == "run" else g.map({"x": [1, 2, 3]}, map_over="x")
        assert all(n.attempts == 2 and n.status == "complete" for n in c.trace.executions())
        assert summary(c.trace)["flaky"].retries == (1 if how == "run" else 3)
        waited = summary(c.trace)["flaky"].waited_ms  # the back-offs: a wait, not running
        assert waited == pytest.approx(1.0 if how == "run" else 3.0)
        assert "waited ms" in format_summary(summary(c.trace))
