"""Map items' history on every engine: real durations, start times, outputs and workers,
like run()'s (README: "Semantics the contract leaves open")."""

from __future__ import annotations

import time

import pytest

from hypernodes_dist import Graph

from . import edge_graphs as E

# ------------------------------------------------------------------ map history


@pytest.mark.parametrize("nodes", [E.TIMED, E.GATED_SQUARE, [E.async_square]],
                         ids=["columnar", "per-item", "async"])
def test_map_history_is_as_informative_as_run(engine, nodes, logs):
    inputs = {"x": [1, 2, 3], "v": [1, 2, 3], "log_dir": str(logs)}
    graph = Graph(nodes, engine=engine)
    single = graph.run({k: v[0] if isinstance(v, list) else v for k, v in inputs.items()
                        if k in graph.inputs})
    before = time.time()
    res = graph.map({k: v for k, v in inputs.items() if k in graph.inputs},
                    map_over=[k for k in ("x", "v") if k in graph.inputs])
    for r in res:
        assert [h.node_id for h in r.history] == [h.node_id for h in single.history]
        for h in r.history:
            assert all(r[o] == v for o, v in h.outputs.items())
            if h.node_id in ("slow", "logged_square", "async_square"):
                assert h.outputs and h.duration_ms > 0
                assert before - 1 <= h.started_at <= time.time() + 1
                assert h.worker
    assert res[0].history[0].outputs == single.history[0].outputs


def test_map_history_of_selected_outputs(engine):
    res = Graph(E.TIMED, engine=engine).map({"x": [1, 2]}, map_over="x", select=["after"])
    # history carries the outputs the map returns; intermediates not selected are left out
    assert [h.outputs for h in res[1].history] == [{}, {"after": 21}]
    assert res[1].history[0].duration_ms > 0
