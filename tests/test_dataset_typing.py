"""Output typing of dataset maps: real Arrow types where Arrow holds the values exactly,
pickled binary (marked in the field metadata) for everything else; values that do not fit
their column fail their row, naming node, row and type."""

from __future__ import annotations

import datetime
from typing import Any, Optional

import pyarrow as pa
import pytest

from hypernodes_dist import Graph, node
from hypernodes_dist.sinks.arrow_types import annotation_type, infer_type, is_pickled


@pytest.mark.parametrize("annotation, expected", [
    (str, pa.string()), (int, pa.int64()), (float, pa.float64()), (bool, pa.bool_()),
    (bytes, pa.binary()), (list[str], pa.list_(pa.string())), (Optional[int], pa.int64()),
    (float | None, pa.float64()), (object, False), (Any, False), (dict, None), (tuple, None),
])
def test_annotations_that_decide_a_type(annotation, expected):
    assert annotation_type(annotation) == expected


@pytest.mark.parametrize("values, expected", [
    (["a", None, "b"], pa.string()),
    ([1, 2, None], pa.int64()),
    ([1.5, 2.0], pa.float64()),
    ([True, False], pa.bool_()),
    ([[1, 2], [], None], pa.list_(pa.int64())),
    ([{"k": "a", "n": 1}, {"k": "b", "n": 2}], pa.struct([("k", pa.string()), ("n", pa.int64())])),
    ([datetime.date(2024, 1, 2)], pa.date32()),
])
def test_values_arrow_holds_exactly_get_arrow_types(values, expected):
    assert infer_type(values) == expected


@pytest.mark.parametrize("values", [
    [1, 2.5],                       # 1 would come back as 1.0
    [(1, "a")],                     # a tuple would come back as a list
    [{"a": 1}, {"b": 2}],           # inconsistent keys: nulls would appear
    [{1: "a"}],                     # non-str keys
    [{1, 2}],                       # sets
    [None, None],                   # nothing seen: no type to pick
    [2**70],                        # beyond int64
    [object()],
])
def test_other_values_are_pickled(values):
    assert infer_type(values) is None


@node(output_name="value")
def mixed(x: int):
    return "text" if x == 60 else x  # ints in the first items, then a str


@node(output_name="obj")
def as_object(x: int) -> object:
    return {x} if x % 2 else [x]


def test_a_value_that_does_not_fit_fails_its_row(tmp_path):
    g = Graph([mixed])
    res = g.map(source=pa.table({"x": list(range(80))}), into=tmp_path / "a",
                on_error="collect")
    assert res.failed == 1
    [err] = res.errors.to_pylist()
    assert err["_hn_row"] == 60 and err["node"] == "mixed"
    assert "int64" in err["error"] and "'text'" in err["error"]
    with pytest.raises(TypeError, match="item 60.*int64.*annotate"):
        g.map(source=pa.table({"x": list(range(80))}), into=tmp_path / "b")


def test_object_annotation_stores_pickled_and_to_pandas_restores(tmp_path):
    res = Graph([as_object]).map(source=pa.table({"x": list(range(6))}), into=tmp_path / "o")
    field = res.to_arrow().schema.field("obj")
    assert field.type == pa.binary() and is_pickled(field)
    assert list(res.to_pandas()["obj"]) == [[0], {1}, [2], {3}, [4], {5}]
