"""Batch nodes (``@node(batch_size=N)``) on every engine: calls of lists, per-item results.

What each call received is read back from files (``batch_graphs.calls``): worker processes
share no memory with the driver.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.errors import BatchLengthError
from hypernodes_dist.policies import NodeTimeoutError

from . import batch_graphs as BG

KINDS = ["sync", "async", "flowing", "flowing-sync"]  # flowing: an async per-item node first


def _flat(call_list):
    return sorted(t for c in call_list for t in c)


def _check_calls(call_list, texts):
    """Every item entered exactly one call of at most ``B`` items."""
    assert all(1 <= len(c) <= BG.B for c in call_list), call_list
    assert _flat(call_list) == sorted(texts)


@pytest.mark.parametrize("kind", KINDS)
def test_dict_map_before_and_after_per_item_nodes(engine, logs, kind):
    raws = [f"  Item{i:02d}{'x' * i} " for i in range(10)]
    g = Graph(BG.BEFORE_AFTER[kind], engine=engine)
    res = g.map({"raw": raws, "log_dir": logs}, map_over="raw")
    texts = [r.strip().lower() for r in raws]
    assert [r["score"] for r in res] == [len(t) * 10 for t in texts]
    assert [r["size"] for r in res] == [len(t) for t in texts]
    _check_calls(BG.calls(logs, "size"), texts)
    if kind == "sync":  # engine batches are cut to multiples of batch_size: full calls
        assert sorted(map(len, BG.calls(logs, "size"))) == [2, 4, 4]
    for call in BG.calls(logs, "size"):  # a call's lists keep item order
        assert call == sorted(call, key=texts.index)


@pytest.mark.parametrize("kind", KINDS)
def test_dataset_map_source_into(engine, logs, tmp_path, kind):
    texts = [f"row{i}" + "y" * (i % 5) for i in range(23)]
    g = Graph(BG.BEFORE_AFTER[kind], engine=engine)
    res = g.map(source=pa.table({"body": texts, "id": list(range(23))}),
                columns={"raw": "body"}, keep=["id"], inputs={"log_dir": logs},
                into=tmp_path / "out", select=["score"])
    table = res.to_arrow().sort_by("_hn_row")
    assert table.column("id").to_pylist() == list(range(23))
    assert table.column("score").to_pylist() == [len(t) * 10 for t in texts]
    _check_calls(BG.calls(logs, "size"), texts)


@pytest.mark.parametrize("kind", KINDS)
def test_run_calls_with_one_item_lists(engine, logs, kind):
    g = Graph(BG.BEFORE_AFTER[kind], engine=engine)
    out = g.run({"raw": " Hello ", "log_dir": logs})
    assert out["size"] == 5 and out["score"] == 50
    assert BG.calls(logs, "size") == [["hello"]]
    with pytest.raises(ValueError, match="bad text 'bad'"):
        g.run({"raw": "bad", "log_dir": logs})


@pytest.mark.parametrize("kind", KINDS)
def test_exception_in_a_slot_fails_that_item_alone(engine, logs, kind):
    raws = ["a", "bb", "bad1", "ccc", "dddd", "bad2", "ee"]
    g = Graph(BG.BEFORE_AFTER[kind], engine=engine)
    res = g.map({"raw": raws, "log_dir": logs}, map_over="raw", on_error="collect")
    assert [r.status for r in res] == ["error" if r.startswith("bad") else "complete"
                                      for r in raws]
    assert [r["score"] for r in res if r.status == "complete"] == [10, 20, 30, 40, 20]
    bad = [r.error for r in res if r.status == "error"]
    assert [type(e) for e in bad] == [ValueError, ValueError]
    assert "bad text 'bad1'" in str(bad[0]) and "bad text 'bad2'" in str(bad[1])
    assert any("item 2" in n for n in bad[0].__notes__)
    assert any("item 5" in n for n in bad[1].__notes__)
    with pytest.raises(ValueError, match="bad text 'bad[12]'") as info:  # any failed item
        g.map({"raw": raws, "log_dir": logs}, map_over="raw")
    item = 2 if "bad1" in str(info.value) else 5
    assert any(BG.SIZE[kind].name in n and f"item {item}" in n for n in info.value.__notes__)


def test_a_call_that_raises_fails_each_of_its_items(engine, logs):
    texts = [f"t{i}" for i in range(10)]
    texts[5] = "boom"
    g = Graph([BG.b_boom], engine=engine)
    res = g.map({"text": texts, "log_dir": logs}, map_over="text", on_error="collect")
    failed_call = next(c for c in BG.calls(logs, "boom") if "boom" in c)
    assert [r.status for r in res] == ["error" if t in failed_call else "complete"
                                      for t in texts]
    for i, r in enumerate(res):
        if r.status == "error":
            assert isinstance(r.error, BG.BoomError)
            assert any(f"item {i}" in n for n in r.error.__notes__)
        else:
            assert r["size"] == len(texts[i])


def test_a_wrong_length_return_fails_every_item_of_the_call(engine, logs):
    texts = [f"t{i}" for i in range(10)]
    texts[6] = "short"
    g = Graph([BG.b_short], engine=engine)
    res = g.map({"text": texts, "log_dir": logs}, map_over="text", on_error="collect")
    failed_call = next(c for c in BG.calls(logs, "short") if "short" in c)
    n = len(failed_call)
    for t, r in zip(texts, res):
        if t in failed_call:
            assert isinstance(r.error, BatchLengthError)
            assert "'b_short'" in str(r.error)
            assert f"called with {n} items and returned {n - 1} values" in str(r.error)
        else:
            assert r.status == "complete" and r["size"] == len(t)


def test_several_outputs_as_a_tuple_of_lists(engine, logs):
    texts = ["ab", "cd", "ef", "gh", "ij", "kl"]
    res = Graph([BG.b_two], engine=engine).map({"text": texts, "log_dir": logs},
                                                map_over="text")
    assert [(r["upper"], r["first"]) for r in res] == [(t.upper(), t[0]) for t in texts]
    _check_calls(BG.calls(logs, "two"), texts)


@pytest.mark.parametrize("flowing", [False, True], ids=["columnar", "flowing"])
def test_retries_apply_per_call(engine, logs, flowing):
    class Seen:
        def __init__(self):
            self.events = []

        def on_policy(self, event):
            self.events.append(event)

    seen = Seen()
    texts = [f"w{i}" * (i + 1) for i in range(9)]
    nodes = [BG.aclean, BG.b_flaky] if flowing else [BG.b_flaky]
    g = Graph(nodes, engine=engine, callbacks=[seen])
    res = g.map({"raw" if flowing else "text": texts, "log_dir": logs},
                map_over="raw" if flowing else "text")
    assert [r["size"] for r in res] == [len(t) for t in texts]
    attempts = BG.calls(logs, "flaky")
    distinct = {tuple(c) for c in attempts}
    assert len(attempts) == 2 * len(distinct)  # each call: one failed attempt, one retry
    _check_calls([list(c) for c in distinct], texts)
    retries = [e for e in seen.events if e.kind == "retry"]
    assert len(retries) == len(distinct)  # one retry event per call, not per item
    assert all("ConnectionError" in e.reason for e in retries)


@pytest.mark.parametrize("kind", KINDS)
def test_cache_hits_never_enter_a_call_and_identical_keys_enter_once(engine, logs, tmp_path,
                                                                      kind):
    cache = DiskCache(tmp_path / "cache")
    g = Graph(BG.BEFORE_AFTER[kind], engine=engine, cache=cache)
    first = [f"k{i}" for i in range(6)]
    g.map({"raw": first, "log_dir": logs}, map_over="raw")
    _check_calls(BG.calls(logs, "size"), first)
    seen = len(BG.calls(logs, "size"))
    again = ["k0", "new1", "k3", "new2", "new1", "k5", "new2", "new3", "k1"]
    res = g.map({"raw": again, "log_dir": logs}, map_over="raw")
    assert [r["score"] for r in res] == [len(t) * 10 for t in again]
    _check_calls(BG.calls(logs, "size")[seen:], ["new1", "new2", "new3"])


@pytest.mark.parametrize("kind", KINDS)
def test_inside_a_nested_graph(engine, logs, kind):
    docs = ["a|bb|ccc|dddd|eeeee|ffffff", "x|yy", "", "p|qq|rrr|ssss|t"]
    g = Graph(BG.nested(kind), engine=engine)
    res = g.map({"document": docs, "log_dir": logs}, map_over="document")
    assert [r["total"] for r in res] == [
        sum(len(p) * 10 for p in d.split("|") if p) for d in docs]
    passages = [p for d in docs for p in d.split("|") if p]
    _check_calls(BG.calls(logs, "size"), passages)


def test_a_resource_is_passed_as_itself(engine, logs):
    texts = ["a", "bb", "ccc", "dddd", "eeeee"]
    g = Graph([BG.unit, BG.b_label], engine=engine)
    res = g.map({"text": texts, "log_dir": logs}, map_over="text")
    assert [r["labelled"] for r in res] == [f"{len(t)} chars" for t in texts]
    _check_calls(BG.calls(logs, "label"), texts)


def test_concurrency_counts_calls(engine, logs):
    texts = [f"c{i}" for i in range(12)]
    res = Graph([BG.ab_serial], engine=engine).map({"text": texts, "log_dir": logs},
                                                   map_over="text")
    assert [r["size"] for r in res] == [len(t) for t in texts]
    order = [w for w, _ in BG.spans(logs)]
    assert order == ["start", "end"] * (len(order) // 2)  # no two calls overlap
    assert len(order) // 2 == 3  # 12 items, calls of 4


def test_a_timeout_bounds_the_call_and_fails_its_items(engine, logs):
    texts = [f"s{i}" for i in range(8)]
    texts[2] = "slow"
    res = Graph([BG.ab_slow], engine=engine).map({"text": texts, "log_dir": logs},
                                                 map_over="text", on_error="collect")
    slow_call = next(c for c in BG.calls(logs, "slow") if "slow" in c)
    for t, r in zip(texts, res):
        if t in slow_call:
            assert isinstance(r.error, NodeTimeoutError)
            assert "ab_slow" in str(r.error)
        else:
            assert r["size"] == len(t)


# --------------------------------------------------------------------------- scalars=


def _check_model_calls(logs, pairs):
    """Every (model, text) pair entered exactly one call of at most ``B`` items, and each
    call took one model, as one value."""
    seen = BG.model_calls(logs)
    assert all(1 <= len(texts) <= BG.B and isinstance(m, str) for m, texts in seen), seen
    assert sorted((m, t) for m, texts in seen for t in texts) == sorted(pairs)
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_a_broadcast_value_as_a_scalar(engine, logs, kind):
    raws = [f" Doc{i} " for i in range(10)]
    g = Graph(BG.EMBED[kind], engine=engine)
    res = g.map({"raw": raws, "model": "small", "log_dir": logs}, map_over="raw")
    texts = [r.strip().lower() for r in raws]
    assert [r["vector"] for r in res] == [f"small:{t}" for t in texts]
    _check_model_calls(logs, [("small", t) for t in texts])
    if kind == "sync":  # one value everywhere: calls stay full
        assert sorted(len(texts) for _, texts in BG.model_calls(logs)) == [2, 4, 4]
    assert g.run({"raw": "One", "model": "small", "log_dir": logs})["vector"] == "small:one"
    assert BG.model_calls(logs)[-1] == ("small", ["one"])  # run(): a one-item call


@pytest.mark.parametrize("kind", KINDS)
def test_a_mapped_scalar_splits_calls_by_value(engine, logs, kind):
    raws = [f"t{i}" for i in range(14)]
    models = ["a", "b", "a", "c", "b", "a", "a", "b", "c", "a", "a", "b", "a", "a"]
    g = Graph(BG.EMBED[kind], engine=engine)
    res = g.map({"raw": raws, "model": models, "log_dir": logs}, map_over=["raw", "model"])
    assert [r["vector"] for r in res] == [f"{m}:{t}" for m, t in zip(models, raws)]
    seen = _check_model_calls(logs, list(zip(models, raws)))
    for _, texts in seen:  # a call's texts keep item order
        assert texts == sorted(texts, key=raws.index)
    assert len(seen) >= 4  # 7 'a' (2 calls at least), 4 'b', 2 'c'


def test_a_scalar_column_of_a_dataset_map(engine, logs, tmp_path):
    texts = [f"row{i}" for i in range(23)]
    models = ["m1" if i % 3 else "m2" for i in range(23)]
    g = Graph(BG.EMBED["sync"], engine=engine)
    res = g.map(source=pa.table({"raw": texts, "model": models}), inputs={"log_dir": logs},
                into=tmp_path / "out", select=["vector"])
    table = res.to_arrow().sort_by("_hn_row")
    assert table.column("vector").to_pylist() == [f"{m}:{t}" for m, t in zip(models, texts)]
    _check_model_calls(logs, list(zip(models, texts)))


@pytest.mark.parametrize("kind", KINDS)
def test_scalars_leave_cache_hits_per_item(engine, logs, tmp_path, kind):
    g = Graph(BG.EMBED[kind], engine=engine, cache=DiskCache(tmp_path / "cache"))
    first = ["k0", "k1", "k2", "k3", "k4"]
    g.map({"raw": first, "model": ["a", "b", "a", "b", "a"], "log_dir": logs},
          map_over=["raw", "model"])
    done = len(BG.model_calls(logs))
    again = ["k0", "k1", "k0", "new", "k2", "new"]
    models = ["a", "b", "b", "a", "a", "a"]  # (k0, b) is a new pair: a miss
    res = g.map({"raw": again, "model": models, "log_dir": logs}, map_over=["raw", "model"])
    assert [r["vector"] for r in res] == [f"{m}:{t}" for m, t in zip(models, again)]
    entered = BG.model_calls(logs)[done:]
    assert sorted((m, t) for m, texts in entered for t in texts) == [("a", "new"), ("b", "k0")]


@pytest.mark.parametrize("kind", KINDS)
def test_scalars_keep_errors_per_item(engine, logs, kind):
    raws = ["a1", "bad1", "a2", "d1", "a3", "d2", "bad2", "a4"]
    models = ["m", "m", "m", "down", "m", "down", "m", "m"]
    g = Graph(BG.EMBED[kind], engine=engine)
    res = g.map({"raw": raws, "model": models, "log_dir": logs}, map_over=["raw", "model"],
                on_error="collect")
    for i, (raw, model, r) in enumerate(zip(raws, models, res)):
        if model == "down":  # the call of model 'down' failed: its items alone
            assert isinstance(r.error, BG.ModelDownError)
            assert any(f"item {i}" in n for n in r.error.__notes__)
        elif raw.startswith("bad"):
            assert isinstance(r.error, ValueError) and f"bad text {raw!r}" in str(r.error)
        else:
            assert r.status == "complete" and r["vector"] == f"m:{raw}"


def test_translated_daft_ray_literal_argument_of_a_batch_udf(engine):
    """Daft ``repeat_n(col("a"), 2)`` / ``my_sum_with_scalar(col("x"), 10)`` and Ray
    ``map_batches(fn, fn_kwargs=...)``: a broadcast value is one value per call."""
    g = Graph([BG.repeat_n], engine=engine)
    res = g.map({"data": ["foo", "bar", "baz"], "n": 2}, map_over="data")
    assert [r["repeated"] for r in res] == ["foofoo", "barbar", "bazbaz"]
    res = Graph([BG.sum_with_scalar], engine=engine).map({"x": [1, 2, 3], "b": 10},
                                                          map_over="x")
    assert [r["total"] for r in res] == [11, 12, 13]
    assert g.run({"data": "qux", "n": 3})["repeated"] == "quxquxqux"
