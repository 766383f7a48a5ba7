"""Graph construction: wiring, inputs/outputs, and build-time validation naming the nodes."""

from __future__ import annotations

import inspect
import re
from typing import Literal

import pytest

from hypernodes_dist import END, Graph, InterruptNode, branch, gate, node
from hypernodes_dist.errors import (
    AmbiguousProducerError,
    DuplicateNodeError,
    InvalidCycleError,
    UnknownTargetError,
)


@node(output_name="embedding")
def embed(text: str, model: str = "m1") -> list:
    return [len(text), len(model)]


@node(output_name="docs")
def retrieve(embedding: list, k: int = 2) -> list:
    return [f"doc{i}" for i in range(k)]


@node(output_name="answer")
def generate(query: str, docs: list) -> str:
    return f"{query}:{','.join(docs)}"


def test_edges_inferred_and_inputs_outputs():
    g = Graph([generate, retrieve, embed])
    assert g.inputs == ("k", "model", "query", "text")
    assert g.required_inputs == ("query", "text")
    assert g.outputs == ("embedding", "docs", "answer")
    assert [n.name for n in g.plan.nodes] == ["embed", "retrieve", "generate"]


def test_node_list_order_never_matters():
    a = Graph([embed, retrieve, generate]).plan
    b = Graph([generate, embed, retrieve]).plan
    assert [n.name for n in a.nodes] == [n.name for n in b.nodes]
    assert a.graph_hash == b.graph_hash


def test_decorated_node_is_still_callable():
    assert embed("abc") == [3, 2]
    assert embed.name == "embed" and embed.outputs == ("embedding",)
    assert embed.defaults == {"model": "m1"}


def test_node_keywords():
    @node(output_name=("a", "b"), name="pair", tags=["t"], cache=False, retries=2, timeout=3)
    def f(x):
        return x, x

    assert (f.name, f.outputs, f.tags, f.cache, f.policy.retries, f.policy.timeout) == (
        "pair", ("a", "b"), ("t",), False, 2, 3
    )


def test_async_and_generator_nodes_are_detected():
    @node(output_name="a")
    async def a(x):
        return x

    @node(output_name="b")
    def b(x):
        yield x

    @node(output_name="c", streaming=True)
    def c(x):
        return iter([x])

    assert a.is_async and not a.streaming
    assert b.streaming and b.is_generator
    assert c.streaming and not c.is_generator


def test_duplicate_names_rejected():
    @node(output_name="z", name="embed")
    def other(text):
        return text

    with pytest.raises(DuplicateNodeError, match="embed"):
        Graph([embed, other])


def test_unknown_branch_target_named():
    @branch(when_true="nowhere", when_false="embed")
    def check(text: str) -> bool:
        return True

    with pytest.raises(UnknownTargetError) as info:
        Graph([check, embed])
    assert "check" in str(info.value) and "nowhere" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_gate_target_named():
    @gate
    def route(text: str) -> Literal["embed", "missing", END]:
        return "embed"

    with pytest.raises(UnknownTargetError, match="missing"):
        Graph([route, embed])


def test_gate_needs_literal_annotation():
    with pytest.raises(ValueError, match="Literal"):
        @gate
        def route(text: str) -> str:
            return "x"


def test_gate_with_descriptions_and_explicit_targets():
    @gate
    def route(text: str) -> Literal["embed", ("retrieve", "Fetch"), END]:
        return "embed"

    assert route.targets == ("embed", "retrieve")
    assert route.descriptions == {"retrieve": "Fetch"}

    @gate(targets=["embed", END])
    def route2(text: str):
        return END

    assert route2.targets == ("embed",)


def test_ambiguous_producers_named():
    @node(output_name="docs")
    def retrieve2(embedding: list) -> list:
        return []

    with pytest.raises(AmbiguousProducerError) as info:
        Graph([embed, retrieve, retrieve2])
    assert "retrieve" in str(info.value) and "retrieve2" in str(info.value)


def test_exclusive_branch_targets_may_share_an_output():
    @branch(when_true="a", when_false="b")
    def pick(x: int) -> bool:
        return x > 0

    @node(output_name="y")
    def a(x: int) -> int:
        return 1

    @node(output_name="y")
    def b(x: int) -> int:
        return -1

    g = Graph([pick, a, b])
    assert g.run({"x": 5})["y"] == 1 and g.run({"x": -5})["y"] == -1


def test_cycle_without_gate_rejected_naming_nodes():
    @node(output_name="p")
    def f(q: int) -> int:
        return q

    @node(output_name="q")
    def h(p: int) -> int:
        return p

    with pytest.raises(InvalidCycleError) as info:
        Graph([f, h])
    assert "f" in info.value.nodes and "h" in info.value.nodes


def test_cycle_through_branch_target_is_valid():
    @node(output_name="n")
    def start(seed: int) -> int:
        return seed

    @branch(when_true="grow", when_false="stop")
    def small(n: int) -> bool:
        return n < 5

    @node(output_name="n")
    def grow(n: int) -> int:
        return n + 1

    @node(output_name="out")
    def stop(n: int) -> int:
        return n

    assert Graph([start, small, grow, stop]).run({"seed": 1})["out"] == 5


def test_variadic_parameters_rejected():
    with pytest.raises(ValueError, match="variadic"):
        @node(output_name="x")
        def f(*args):
            return 1


def test_interrupt_node_shape():
    i = InterruptNode(name="approval", input_param="prompt", response_param="decision")
    assert i.params == ("prompt",) and i.outputs == ("decision",) and i.kind == "interrupt"
    assert not i.cache


# ------------------------------------------------------------------ Graph.map docstring


def test_map_docstring_documents_every_parameter():
    doc = inspect.getdoc(Graph.map)
    params = [p for p in inspect.signature(Graph.map).parameters if p != "self"]
    missing = [p for p in params if not re.search(rf"``{p}``|\b{p}\b:", doc)]
    assert missing == []
