"""``map(progress=True)``: a tqdm bar with items done, rate, ETA, cache hits and errors, on
every engine (the bar lives in the driver; engines only hand batches back)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, node


@node(output_name="y")
def half(x: int) -> float:
    if x == 7:
        raise ValueError("seven")
    return x / 2


def _engine(name: str):
    if name == "local":
        return GraphEngine(batch_size=4)
    engines = pytest.importorskip("hypernodes_dist.engines")
    if name == "dask":
        pytest.importorskip("dask")
        return engines.DaskEngine(scheduler="threads", partition_size=4, num_workers=2)
    pytest.importorskip("daft")
    return engines.DaftEngine(batch_size=4)


@pytest.mark.parametrize("engine_name", ["local", "dask", "daft"])
def test_progress_bar_reports_items_rate_hits_and_errors(engine_name, tmp_path, capsys):
    engine = _engine(engine_name)
    try:
        g = Graph([half], engine=engine, cache=DiskCache(tmp_path / "c"))
        g.map({"x": list(range(20))}, map_over="x", on_error="collect", progress=True)
        capsys.readouterr()
        result = g.map({"x": list(range(20))}, map_over="x", on_error="collect", progress=True)
    finally:
        engine.close()
    assert len(result.errors) == 1
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"map [{engine.name}]" in final
    assert "20/20" in final  # items done / total
    assert re.search(r"item/s|s/item", final)  # rate
    assert re.search(r"<\d\d:\d\d", final)  # elapsed<ETA
    assert "cache_hits=19" in final  # the failed item is never cached
    assert "errors=1" in final


def test_no_bar_without_progress(capsys):
    Graph([half]).map({"x": [1, 2]}, map_over="x")
    assert "map [" not in capsys.readouterr().err


@node(output_name="y")
def slow_half(x: int) -> float:
    time.sleep(0.005)
    if x == 7:
        raise ValueError("seven")
    return x / 2


@pytest.mark.parametrize("engine_name", ["local", "dask", "daft"])
def test_dataset_bar_shows_rows_rate_eta_failed_and_resumed_rows(engine_name, tmp_path,
                                                                 capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    engine = _engine(engine_name)
    source, out = pa.table({"x": list(range(40))}), tmp_path / "out"
    try:
        g = Graph([slow_half], engine=engine)
        g.map(source=source, into=out, on_error="collect", progress=True, commit_seconds=0.05)
        files = sorted(out.glob("part-*.parquet"))
        assert len(files) > 1
        lost = pq.read_metadata(files[-1]).num_rows
        files[-1].unlink()  # as if killed before that file was written
        capsys.readouterr()
        res = g.map(source=source, into=out, on_error="collect", progress=True,
                    commit_seconds=0.05)
    finally:
        engine.close()
    assert res.rows == 40 and res.failed == 1
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"map [{engine.name}] -> parquet" in final
    assert "40/40" in final  # rows in files / total
    assert re.search(r"row/s|s/row", final)  # this run's rate
    assert re.search(r"<\d\d:\d\d", final)  # elapsed<ETA
    assert re.search(r"failed=\d", final)
    assert f"resumed={40 - lost}" in final  # rows an earlier run had written


# ------------------------------------------------------------------ the bar's contents

from hypernodes_dist.errors import MapStoppedWarning  # noqa: E402
from hypernodes_dist.run.progress import Tally, plain  # noqa: E402
from hypernodes_dist.run.stops import Kept  # noqa: E402


def _last_line(capsys) -> str:
    return capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]


@pytest.mark.parametrize("value, text", [
    (0, "0"), (12, "12"), (0.0421, "0.0421"), (0.00001, "0.00001"), (2.5, "2.5"),
    (999.96, "1k"), (1000, "1k"), (199_900, "199.9k"), (799_540, "799.5k"),
    (7_995_000, "7.995M"), (3.2e9, "3.2G"),
])
def test_usage_numbers_are_plain(value, text):
    assert plain(value) == text


def test_bar_shows_usage_so_far_and_its_projection_with_units(capsys):
    tally = Tally([], True, 20_000, "map [local] -> parquet", unit="row", failed_name="failed")
    tally.add(5_000, 0, 3, [], {"ask": {"calls": 5_000, "tokens": 199_900, "cost": 0.03}})
    tally.bar.refresh()
    line = _last_line(capsys)
    assert "5000/20000" in line and "failed=3" in line
    assert "tokens=199.9k (proj. 799.6k)" in line and "cost=0.03 (proj. 0.12)" in line
    tally.add(15_000, 0, 0, [], {"ask": {"calls": 15_000, "tokens": 600_000}})
    tally.close()
    line = _last_line(capsys)
    assert "20000/20000" in line and "tokens=799.9k" in line and "proj." not in line


def test_after_a_resume_the_projection_covers_this_runs_rows_and_ends(capsys):
    tally = Tally([], True, 1_000, "map", initial=600, unit="row", failed_name="failed")
    tally.add(100, 0, 0, [], {"ask": {"calls": 100, "tokens": 1_000}})
    tally.bar.refresh()
    line = _last_line(capsys)
    assert "700/1000" in line and "resumed=600" in line
    assert "tokens=1k (proj. 4k)" in line  # 400 rows to do in this run, 100 done
    tally.add(300, 0, 0, [], {"ask": {"calls": 300, "tokens": 3_000}})
    tally.close()
    line = _last_line(capsys)
    assert "1000/1000" in line and "tokens=4k" in line and "proj." not in line


def test_rows_finished_where_they_run_move_the_bar_once(capsys):
    """Live counts (the progress channel) move the bar; a batch's exact count replaces
    its live one, and a live count arriving after it is ignored."""
    tally = Tally([], True, 100, "map")
    tally.receive({0: (10, None), 50: (5, None)})
    assert tally.position == 15
    tally.add(50, 0, 0, [], offset=0)  # batch 0..50 done: its live 10 replaced by 50
    assert tally.position == 55
    tally.receive({0: (30, None), 50: (20, None)})  # late news of batch 0: ignored
    assert tally.position == 70
    tally.add(50, 0, 0, [], offset=50)
    tally.close()
    assert tally.position == 100 and "100/100" in _last_line(capsys)


def test_what_live_rows_metered_is_on_the_bar_until_their_batch_comes_back(capsys):
    tally = Tally([], True, 100, "map")
    tally.receive({0: (20, {"tokens": 2_000})})
    tally.bar.refresh()
    assert "tokens=2k (proj. 10k)" in _last_line(capsys)
    tally.add(50, 0, 0, [], {"ask": {"calls": 50, "tokens": 5_000}}, offset=0)
    tally.receive({0: (50, {"tokens": 5_000}), 50: (10, {"tokens": 1_000})})
    tally.bar.refresh()
    line = _last_line(capsys)  # batch 0's exact 5k replaced its live count; batch 50 live
    assert "60/100" in line and "tokens=6k (proj. 10k)" in line
    tally.close()


def test_a_budget_stop_is_on_the_bar_and_in_one_warning(capsys):
    tally = Tally([], True, 20_000, "map [local] -> parquet", unit="row",
                  failed_name="failed", budget={"cost": 2.0}, kept=Kept("into", "out/"))
    tally.add(1_204, 0, 0, [], {"ask": {"calls": 1_204, "cost": 2.01}}, offset=0,
              budget_stop=True)
    with pytest.warns(MapStoppedWarning) as caught:
        tally.close()
    [warning] = [w for w in caught if w.category is MapStoppedWarning]  # one line, once
    assert str(warning.message) == (
        "budget {'cost': 2} reached after 1,204 of 20,000 rows: 18,796 rows not written; "
        "the finished rows are kept in out/: rerun the same map with a larger budget to "
        "continue")
    assert "stopped: budget {'cost': 2} reached" in _last_line(capsys)


@node(output_name="y")
def interrupted(x: int) -> int:
    if x == 30:
        raise KeyboardInterrupt
    return x


def test_an_interrupt_is_on_the_bar_and_in_one_log_line(capsys, caplog):
    g = Graph([interrupted], engine=GraphEngine(batch_size=10))
    with pytest.raises(KeyboardInterrupt):
        g.map({"x": list(range(100))}, map_over="x", progress=True)
    assert "interrupted" in _last_line(capsys)
    [record] = [r for r in caplog.records if r.name == "hypernodes_dist.map"]
    assert record.getMessage() == (
        "map interrupted after 30 of 100 items; results of finished items are lost; pass "
        "cache= (or map into=) to keep them across a stop")


@node(output_name="y")
def broken(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


def test_an_error_stop_names_the_node_and_what_to_do(tmp_path, caplog):
    g = Graph([broken], cache=DiskCache(tmp_path / "c"), engine=GraphEngine(batch_size=2))
    with pytest.raises(ValueError):
        g.map({"x": list(range(10))}, map_over="x", progress=True)
    [record] = [r for r in caplog.records if r.name == "hypernodes_dist.map"]
    assert record.getMessage() == (
        "map stopped by ValueError in node 'broken' after 2 of 10 items; finished items are "
        "in the cache: rerun the same map to continue (fix the error, or pass "
        "on_error=\"collect\")")


def test_a_count_held_back_by_the_throttle_is_told_without_a_further_update():
    """Two counts within a quarter second, then none (one slow row still runs): the
    callback hears the second one anyway, before the final event, not only at the end."""
    heard: list[int] = []
    second = threading.Event()

    class Listener:
        def on_progress(self, event):
            heard.append(event.done)
            if event.done == 30 and not event.final:
                second.set()

    tally = Tally([Listener()], False, 100, "map")
    tally.receive({0: (10, None)})  # told at once
    tally.receive({0: (30, None)})  # within the quarter second: held back, then told
    assert second.wait(timeout=30), heard  # a bound, not a timing: it never came before
    assert heard == [10, 30]
    tally.close()
    assert len(heard) == 3  # then the final event (its exact counts: none were added here)
