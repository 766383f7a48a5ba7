"""Bad input, property-based: random graphs x random inputs x map_over x map_mode.

Graphs are small random DAGs drawn from the fixed pool in ``graphs.py`` (one producer per
level, sometimes two — an ambiguous graph — and sometimes an ``InterruptNode``). Inputs are
random dicts with wrong types, missing and extra keys, produced names given as inputs,
unequal-length lists, non-list ``map_over`` values, empty lists, unknown or repeated
``map_over`` names, invalid ``map_mode`` strings and non-dict inputs.

Every outcome must be one of the DOCUMENTED ones, and identical on every engine:

========================================  ===============================================
outcome                                   checked
========================================  ===============================================
results                                   one per item (zip: the common length, product:
                                          the product of lengths), each equal to an oracle
                                          that calls the plain functions; no partial result
``GraphBuildError`` (a ``ValueError``)    at ``Graph(...)``: two producers of one name;
                                          ``.nodes`` names both
``GraphInputError`` (a ``ValueError``)    its ``.params`` are named in the message and are
                                          among the parameters the draw perturbed
``ValueError``                            invalid ``map_mode`` (message names it)
``TypeError``                             non-dict inputs; a graph with an ``InterruptNode``
                                          (message names the node)
the node's own exception                  ``TypeError``/``ZeroDivisionError`` raised by a
                                          node, annotated with ``hn_node``/``hn_item`` and a
                                          ``__notes__`` line; the oracle fails at that item
                                          and node with the same type (any failing item:
                                          the columnar executor runs node by node)
========================================  ===============================================

Never a hang (pytest-timeout), never an interpreter crash, never a silent partial result.
``test_local_and_dask_sync_agree`` runs 250 examples on ``GraphEngine`` and
``DaskEngine(scheduler="sync")``; ``test_daft_and_dask_processes_agree`` 25 examples across
``DaftEngine`` and ``DaskEngine(scheduler="processes")``, which cost more per map.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is in the test extra (pip install -e '.[test]')")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hypernodes_dist import Graph, GraphEngine, InterruptNode  # noqa: E402
from hypernodes_dist.engines import DaftEngine, DaskEngine  # noqa: E402
from hypernodes_dist.errors import GraphBuildError, GraphInputError  # noqa: E402

from . import graphs as R  # noqa: E402

TRIED: dict[str, int] = {}  # examples run per property (printed at the end: figures.py)

NAMES = ("a", "b", "c", "step")


@dataclass
class Case:
    nodes: list
    dup_level: str | None
    interrupt: bool
    inputs: Any
    map_over: Any
    map_mode: str
    suspects: set[str] = field(default_factory=set)  # parameters the draw made bad


def _value(draw) -> Any:
    if draw(st.integers(0, 24)) == 0:  # a wrong type (some still work: "s" * 3)
        return draw(st.sampled_from(["s", None, 2.5, [1], (1, 2), {"k": 1}, True]))
    return draw(st.integers(-5, 5))


def _draw_nodes(draw) -> tuple[list[Any], str | None]:
    """Some nodes of each level of the pool (one level now and then twice: ``dup``)."""
    nodes, dup = [], None
    for level in R.LEVELS:
        pick = draw(st.integers(0, 40))
        if pick == 40 and dup is None:
            nodes.extend(R.POOL[level])
            dup = level
        elif pick < 14:
            continue
        else:
            nodes.append(R.POOL[level][pick % 2])
    if not nodes:
        nodes.append(R.POOL["p"][0])
    return nodes, dup


@st.composite
def cases(draw) -> Case:
    nodes, dup = _draw_nodes(draw)
    interrupt = draw(st.integers(0, 30)) == 30
    shape = draw(st.integers(0, 80))
    if shape == 80:
        return Case(nodes, dup, interrupt, draw(st.sampled_from([None, [1, 2], "a=1", 3])),
                    "a", "zip")
    produced = {o for n in nodes for o in n.outputs}
    reads = sorted({p for n in nodes for p in n.params if p not in produced})
    optional = {p for n in nodes for p in n.defaults}
    suspects: set[str] = set()
    inputs: dict[str, Any] = {}
    for p in reads:
        if draw(st.integers(0, 30)) == 0:  # left out
            if p not in optional or any(p in n.params and p not in n.defaults for n in nodes):
                suspects.add(p)
            continue
        inputs[p] = _value(draw)
    if draw(st.integers(0, 30)) == 0:
        inputs["zzz"] = 1
        suspects.add("zzz")
    if produced and draw(st.integers(0, 40)) == 0:
        name = draw(st.sampled_from(sorted(produced)))
        inputs[name] = 1
        suspects.add(name)
    # map_over: usually some given inputs, sometimes unknown / repeated / none
    given_names = sorted(inputs)
    k = draw(st.integers(0, 25))
    if k == 25 or not given_names:
        map_over: Any = draw(st.sampled_from([[], "nope", ["a", "a"]]))
        suspects.update(["nope", "a"] if map_over else [])
    else:
        chosen = draw(st.lists(st.sampled_from(given_names), min_size=1, max_size=3,
                               unique=True))
        map_over = chosen[0] if len(chosen) == 1 and draw(st.booleans()) else chosen
        base = draw(st.sampled_from([2, 1, 3, 4, 0]))
        for p in chosen:
            form = draw(st.integers(0, 40))
            if form == 0:  # not a list
                inputs[p] = draw(st.sampled_from([3, "abc", {"a": 1}, None, 2.5]))
                suspects.add(p)
            else:
                length = base if form > 3 else draw(st.integers(0, 4))
                if length != base:
                    suspects.update(chosen)
                inputs[p] = [_value(draw) for _ in range(length)]
                if form == 1:
                    inputs[p] = tuple(inputs[p])  # list-like: accepted
    mode = draw(st.sampled_from(["zip"] * 12 + ["product"] * 6 + ["diagonal"]))
    return Case(nodes, dup, interrupt, inputs, map_over, mode, suspects)


# --------------------------------------------------------------------------- oracle


def _items(case: Case) -> list[dict[str, Any]]:
    names = [case.map_over] if isinstance(case.map_over, str) else list(case.map_over)
    lists = {p: list(case.inputs[p]) for p in names}
    broadcast = {k: v for k, v in case.inputs.items() if k not in lists}
    if case.map_mode == "zip":
        rows = list(zip(*lists.values()))
    else:
        rows = list(itertools.product(*lists.values()))
    return [{**broadcast, **dict(zip(names, row))} for row in rows]


def _oracle_item(nodes: list, item: dict[str, Any]) -> tuple[dict[str, Any], dict]:
    """Outputs of one item by calling the plain functions in level order, and the failures:
    ``{node name: exception type}`` of every node that fails on inputs it received (nodes
    downstream of a failure do not run; independent nodes may fail on their own)."""
    values = dict(item)
    out: dict[str, Any] = {}
    failures: dict[str, type] = {}
    for level in R.LEVELS:
        for n in nodes:
            if n.outputs[0] != level:
                continue
            if any(p not in values and p not in n.defaults for p in n.params):
                continue  # an upstream node failed
            kwargs = {p: values[p] if p in values else n.defaults[p] for p in n.params}
            try:
                value = n.func(**kwargs)
            except Exception as exc:  # noqa: BLE001
                failures[n.name] = type(exc)
                continue
            values[level] = out[level] = value
    return out, failures


# --------------------------------------------------------------------------- outcomes


def outcome(case: Case, engine) -> tuple:
    """``("build", exc)``, ``("error", exc)`` or ``("ok", [dict per item])``."""
    nodes = list(case.nodes)
    if case.interrupt:
        nodes.append(InterruptNode(name="ask", input_param="a", response_param="answer"))
    try:
        graph = Graph(nodes, engine=engine)
    except Exception as exc:  # noqa: BLE001
        return ("build", exc)
    try:
        res = graph.map(case.inputs, map_over=case.map_over, map_mode=case.map_mode)
    except Exception as exc:  # noqa: BLE001
        return ("error", exc)
    return ("ok", [dict(r) for r in res], [r.status for r in res])


def default_conflicts(case: Case) -> dict[str, list[str]]:
    """Graph inputs read by several of the case's nodes with different defaults (the
    ``Graph`` refuses them): ``{input: [node names]}``."""
    produced = {o for n in case.nodes for o in n.outputs}
    found: dict[str, dict[str, object]] = {}
    for n in case.nodes:
        for p, v in n.defaults.items():
            if p not in produced:
                found.setdefault(p, {})[n.name] = v
    return {p: sorted(by) for p, by in found.items()
            if len({(type(v), v) for v in by.values()}) > 1}


def check_documented(case: Case, got: tuple) -> None:
    """The outcome is one of the documented ones (see the module docstring)."""
    kind = got[0]
    conflicts = default_conflicts(case)
    if kind == "build":
        exc = got[1]
        assert isinstance(exc, GraphBuildError) and isinstance(exc, ValueError), repr(exc)
        if case.dup_level is None:  # the other build error: one input, different defaults
            assert conflicts and "different defaults" in str(exc), repr(exc)
            assert any(set(names) <= set(exc.nodes) for names in conflicts.values())
            return
        names = {n.name for n in R.POOL[case.dup_level]}
        assert names <= set(exc.nodes) and all(n in str(exc) for n in names)
        return
    assert case.dup_level is None, f"ambiguous graph was accepted: {got!r}"
    assert not conflicts, f"a graph input with different defaults was accepted: {conflicts}"
    if kind == "ok":
        results, statuses = got[1], got[2]
        assert not case.interrupt
        items = _items(case)
        names = [case.map_over] if isinstance(case.map_over, str) else list(case.map_over)
        lengths = [len(list(case.inputs[p])) for p in names]
        n = lengths[0] if case.map_mode == "zip" else math.prod(lengths)
        assert len(results) == n == len(items)  # never a partial result
        for i, (item, row) in enumerate(zip(items, results)):
            expected, failures = _oracle_item(case.nodes, item)
            assert not failures, f"item {i} should have failed in {failures}, got {row}"
            assert row == expected, f"item {i}"
        assert all(s == "complete" for s in statuses)
        return
    exc = got[1]
    text = str(exc) + " " + " ".join(getattr(exc, "__notes__", []))
    if hasattr(exc, "hn_node"):  # the node's own exception
        assert isinstance(exc, (TypeError, ZeroDivisionError)), repr(exc)
        items = _items(case)
        item = exc.hn_item
        assert isinstance(item, int) and 0 <= item < len(items)
        assert f"node {exc.hn_node!r} (item {item})" in text
        _, failures = _oracle_item(case.nodes, items[item])
        assert exc.hn_node in failures, (exc.hn_node, failures)
        assert failures[exc.hn_node] is type(exc)
        return
    if isinstance(exc, GraphInputError):
        if exc.params:
            assert all(repr(p) in str(exc) for p in exc.params), str(exc)
            assert set(exc.params) & case.suspects, (str(exc), case.suspects)
        else:
            assert case.map_over == [] and "names no parameter" in str(exc)
        return
    if isinstance(exc, TypeError):
        if case.interrupt:
            assert "InterruptNode" in str(exc) and "ask" in str(exc)
        else:
            assert not isinstance(case.inputs, dict) and "inputs must be a dict" in str(exc)
        return
    if isinstance(exc, ValueError):
        assert case.map_mode not in ("zip", "product") and "map_mode" in str(exc), str(exc)
        return
    raise AssertionError(f"undocumented exception {type(exc).__name__}: {exc}")


def same(a: tuple, b: tuple, exact_error: bool = True) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert a[1] == b[1] and a[2] == b[2]
    else:
        assert type(a[1]) is type(b[1]), (a[1], b[1])
        # a node failure may be any failing item (Dask runs partitions in its own order);
        # every other error is raised in the driver before any work: the same message
        if exact_error and not hasattr(a[1], "hn_node"):
            assert str(a[1]) == str(b[1])


# --------------------------------------------------------------------------- properties

COMMON = dict(deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])


@pytest.mark.timeout(300)
@settings(max_examples=250, **COMMON)
@given(case=cases())
def test_local_and_dask_sync_agree(case: Case) -> None:
    TRIED["local+dask-sync"] = TRIED.get("local+dask-sync", 0) + 1
    local = outcome(case, GraphEngine(batch_size=3))
    check_documented(case, local)
    dask = outcome(case, DaskEngine(scheduler="sync", partition_size=2))
    check_documented(case, dask)
    same(local, dask)


@pytest.fixture(scope="module")
def costly_engines():
    engines = {"daft": DaftEngine(batch_size=2),
               "dask-processes": DaskEngine(scheduler="processes", num_workers=2,
                                            partition_size=2)}
    yield engines
    for e in engines.values():
        e.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_daft_and_dask_processes_agree(costly_engines) -> None:
    @settings(max_examples=25, **COMMON)
    @given(case=cases())
    def prop(case: Case) -> None:
        TRIED["daft+dask-processes"] = TRIED.get("daft+dask-processes", 0) + 1
        local = outcome(case, GraphEngine())
        for engine in costly_engines.values():
            got = outcome(case, engine)
            check_documented(case, got)
            same(local, got, exact_error=False)

    prop()


# --------------------------------------------------------------------------- explicit corners


@pytest.mark.parametrize("inputs", [None, [1, 2], "x=1", 3])
def test_non_dict_inputs_are_a_type_error_on_every_engine(inputs, costly_engines) -> None:
    for engine in [GraphEngine(), DaskEngine(scheduler="sync"), *costly_engines.values()]:
        with pytest.raises(TypeError, match="inputs must be a dict"):
            Graph([R.add_ab], engine=engine).map(inputs, map_over="a")


def test_interrupt_graph_map_is_a_type_error_naming_it(costly_engines) -> None:
    ask = InterruptNode(name="ask", input_param="p", response_param="answer")
    for engine in [GraphEngine(), DaskEngine(scheduler="sync"), *costly_engines.values()]:
        with pytest.raises(TypeError, match="InterruptNode.*ask"):
            Graph([R.add_ab, ask], engine=engine).map({"a": [1], "b": 2}, map_over="a")
