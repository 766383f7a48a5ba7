"""Batch nodes on the local engine: the decorator's checks, one-item calls of run()/iter()
and of the per-item scheduler (cycles), and the error texts users read."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from hypernodes_dist import END, Graph, gate, node, resource
from hypernodes_dist.errors import BatchLengthError

CALLS: list[list[int]] = []


@node(output_name="y", batch_size=3)
def triple(x: list[int]) -> list[int]:
    CALLS.append(list(x))
    return [v * 3 for v in x]


@node(output_name="value")
def start(seed: int) -> int:
    return seed


@node(output_name="value", batch_size=3)
def grow(value: list[int]) -> list[int]:
    CALLS.append(list(value))
    return [v * 3 for v in value]


@gate
def again(value: int) -> Literal["grow", END]:
    return "grow" if value < 50 else END


@pytest.fixture(autouse=True)
def fresh():
    CALLS.clear()


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "4"])
def test_batch_size_must_be_a_positive_int(size):
    with pytest.raises(ValueError, match="batch_size must be None or an int >= 1"):
        node(output_name="y", batch_size=size)(lambda x: x)


def test_a_streaming_node_cannot_batch():
    def gen(x):
        yield x

    with pytest.raises(ValueError, match="streaming node cannot have a batch_size"):
        node(output_name="y", batch_size=4)(gen)


def test_scalars_must_name_parameters():
    with pytest.raises(ValueError, match="node 'embed': scalars names 'modle', which is not "
                                         "one of its parameters"):
        @node(output_name="v", batch_size=4, scalars=("modle",))
        def embed(text: list[str], model: str) -> list[str]:
            return text
    one = node(output_name="v", batch_size=4, scalars="model")(lambda text, model: text)
    assert one.scalars == ("model",)


def test_the_decorated_node_is_still_callable_with_lists():
    assert triple([1, 2]) == [3, 6]


def test_cycles_run_per_item_with_one_item_lists():
    g = Graph([start, grow, again])
    res = g.map({"seed": [1, 20, 60]}, map_over="seed")
    assert [r["value"] for r in res] == [81, 60, 60]
    assert CALLS and all(len(c) == 1 for c in CALLS)


def test_iter_calls_with_one_item_lists():
    async def main():
        async with Graph([triple]).iter({"x": 5}) as run:
            async for _ in run:
                pass
        return run.result

    assert asyncio.run(main())["y"] == 15
    assert CALLS == [[5]]


@node(output_name="y", batch_size=4)
def wrong_type(x: list[int]) -> int:
    return 7


@node(output_name=("a", "b"), batch_size=4)
def two_lists(x: list[int]) -> tuple[list[int], list[int]]:
    return [v + 1 for v in x], [v - 1 for v in x][:-1]


def test_error_texts_name_the_node_and_both_lengths():
    with pytest.raises(BatchLengthError, match="'wrong_type' was called with 1 item and "
                                               "returned a value of type int"):
        Graph([wrong_type]).run({"x": 1})
    res = Graph([two_lists]).map({"x": [1, 2, 3]}, map_over="x", on_error="collect")
    assert all(isinstance(r.error, BatchLengthError) for r in res)
    assert "called with 3 items and returned 2 values for output 'b'" in str(res[0].error)


@resource
def tagger(prefix: str = "#"):
    """A resource reading a broadcast input: passed once, not as a list."""
    return {"prefix": prefix}


@node(output_name="tagged", batch_size=2)
def tag(word: list[str], tagger: dict) -> list[str]:
    return [tagger["prefix"] + w for w in word]


def test_a_resource_reading_a_broadcast_input():
    g = Graph([tagger, tag])
    res = g.map({"word": ["a", "b", "c"], "prefix": "@"}, map_over="word")
    assert [r["tagged"] for r in res] == ["@a", "@b", "@c"]
    assert g.run({"word": "z"})["tagged"] == "#z"


def test_a_resource_reading_a_mapped_input_splits_calls():
    g = Graph([tagger, tag])
    res = g.map({"word": ["a", "b", "c", "d"], "prefix": ["@", "#", "@", "#"]},
                map_over=["word", "prefix"])
    assert [r["tagged"] for r in res] == ["@a", "#b", "@c", "#d"]


class Ends:
    def __init__(self) -> None:
        self.events = []

    def on_node_end(self, event) -> None:
        self.events.append(event)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_events_and_history_stay_per_item(kind):
    @node(output_name="y", batch_size=4)
    def sync_double(x: list[int]) -> list[int]:
        return [v * 2 for v in x]

    @node(output_name="y", batch_size=4)
    async def async_double(x: list[int]) -> list[int]:
        await asyncio.sleep(0.001)
        return [v * 2 for v in x]

    ends = Ends()
    double = sync_double if kind == "sync" else async_double
    res = Graph([double], callbacks=[ends]).map({"x": list(range(10))}, map_over="x")
    assert sorted((e.item_index, e.outputs["y"]) for e in ends.events) == [
        (i, i * 2) for i in range(10)]
    assert all(len(r.history) == 1 and r.history[0].node_id == double.name for r in res)


CONFIG_CALLS: list[tuple[dict, list[str]]] = []


@node(output_name="tagged", batch_size=4, scalars="config")
async def tag_with(word: list[str], config: dict) -> list[str]:
    CONFIG_CALLS.append((config, list(word)))
    return [config["p"] + w for w in word]


@node(output_name="word")
async def lower(raw: str) -> str:
    return raw.lower()


@pytest.mark.parametrize("flowing", [False, True], ids=["columnar", "flowing"])
def test_unhashable_scalar_values_are_grouped_by_equality(flowing):
    CONFIG_CALLS.clear()
    configs = [{"p": "@"}, {"p": "#"}, {"p": "@"}, {"p": "#"}, {"p": "@"}]  # equal, not same
    words = ["A", "B", "C", "D", "E"]
    g = Graph([lower, tag_with] if flowing else [tag_with])
    res = g.map({"raw" if flowing else "word": words if flowing else [w.lower() for w in words],
                 "config": configs}, map_over=["raw" if flowing else "word", "config"])
    assert [r["tagged"] for r in res] == ["@a", "#b", "@c", "#d", "@e"]
    assert sorted((c["p"], w) for c, ws in CONFIG_CALLS for w in ws) == [
        ("#", "b"), ("#", "d"), ("@", "a"), ("@", "c"), ("@", "e")]  # one config per call
    if not flowing:  # (a flow's calls also depend on when items arrive)
        assert len(CONFIG_CALLS) == 2
