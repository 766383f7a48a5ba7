"""Batch nodes on the local engine: the decorator's checks, one-item calls of run()/iter()
and of the per-item scheduler (cycles), and the error texts users read."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from hypernodes_dist import END, Graph, gate, node
from hypernodes_dist.execution.batchcall import BatchLengthError

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
