"""The part pipeline (``datasets/commit.py``) and the sink protocols, on their own: files by
time, resume from a part's last file, steps sized by measured cost, protocols as types."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hypernodes_dist import Graph, GraphEngine, node
from hypernodes_dist.datasets.commit import PartPipeline, Steps, _hand_over
from hypernodes_dist.datasets.parts import Part
from hypernodes_dist.datasets.report import PartReport
from hypernodes_dist.run.datasetrun import DatasetCollector
from hypernodes_dist.sinks.base import PartWriter, ResultSink
from hypernodes_dist.sinks.parquet import ParquetDataset


def _rows(a: int, b: int) -> pa.Table:
    return pa.table({"_hn_row": pa.array(range(a, b), pa.int64())})


def _wait_for(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_protocols_are_implemented():
    out = ParquetDataset("/tmp/unused-hn-dir")
    assert isinstance(out, PartWriter)
    collector = DatasetCollector([], False, 0, "local", out)
    assert isinstance(collector, ResultSink)
    daft_datasets = pytest.importorskip("hypernodes_daft.datasets")
    assert isinstance(daft_datasets.DaftWriter(out), PartWriter)


def _begun(tmp_path, part: Part, commit_seconds: float) -> tuple[ParquetDataset, PartPipeline]:
    """An ``into`` directory and a pipeline that has begun ``part``."""
    out = ParquetDataset(tmp_path)
    out.create()
    pipe = PartPipeline(out, commit_seconds=commit_seconds)
    pipe.begin(part)
    return out, pipe


def test_held_rows_are_written_by_time_while_the_part_is_still_running(tmp_path):
    part = Part(3, 300, 100, None)
    out, pipe = _begun(tmp_path, part, 0.2)
    pipe.add(part, 0, _rows(300, 340), PartReport(3, 300, 40))
    # the part goes on (no end()): its first 40 rows get their own file by time
    _wait_for(lambda: out.committed().get(3) is not None, "no file after commit_seconds")
    assert out.committed()[3].rows == 40
    pipe.add(part, 40, _rows(340, 400), PartReport(3, 340, 60))
    pipe.end(part)
    reports = pipe.take() + pipe.close()
    assert sum(r.n for r in reports) == 100
    assert sorted(f.name for f in tmp_path.glob("part-*")) == [
        "part-000003-000000000-000000040.parquet", "part-000003-000000040-000000100.parquet"]
    assert out.committed()[3].done(100)


def test_a_fast_part_is_one_file(tmp_path):
    part = Part(0, 0, 10, None)
    out, pipe = _begun(tmp_path, part, 30)
    pipe.add(part, 0, _rows(0, 4), PartReport(0, 0, 4))
    pipe.add(part, 4, _rows(4, 10), PartReport(0, 4, 6))
    pipe.end(part)
    [report] = pipe.take() + pipe.close()
    assert (report.offset, report.n) == (0, 10)
    assert [f.name for f in tmp_path.glob("part-*")] == ["part-000000.parquet"]


def test_committed_holds_the_first_rows_and_the_ranges_past_a_gap(tmp_path):
    out = ParquetDataset(tmp_path)
    out.create()
    for a, b in ((0, 10), (10, 20), (30, 40)):
        out.write_part(1, _rows(a, b), (a, b))
    found = out.committed()[1]
    assert found.rows == 20 and found.past == ((30, 40),) and not found.done(40)
    assert Part(1, 100, 50, None).resumed(found.rows, found.past).todo() == [(20, 30), (40, 50)]


def test_rows_not_finished_are_left_out_and_the_rest_written_around_them(tmp_path):
    part = Part(2, 200, 10, None)
    out, pipe = _begun(tmp_path, part, 30)
    done = PartReport(2, 200, 10, skipped=[203, 204, 207])
    _hand_over(pipe, part, 0, _rows(200, 210), done, time.monotonic())
    pipe.end(part)
    reports = pipe.take() + pipe.close()
    assert sum(r.n for r in reports) == 7
    assert sorted(f.name for f in tmp_path.glob("part-*")) == [
        "part-000002-000000000-000000003.parquet", "part-000002-000000005-000000007.parquet",
        "part-000002-000000008-000000010.parquet"]
    assert sorted(pq.read_table(tmp_path).column("_hn_row").to_pylist()) == [
        200, 201, 202, 205, 206, 208, 209]


@node(output_name="y")
def double(x: int) -> int:
    return 2 * x


def test_rerun_computes_only_the_rows_in_no_file(tmp_path):
    out = tmp_path / "out"
    g = Graph([double], engine=GraphEngine())
    source = pa.table({"x": list(range(50))})
    g.map(source=source, into=out)
    [whole] = out.glob("part-*.parquet")
    full = pq.read_table(whole)
    whole.unlink()  # as if stopped: rows 0..20 and 30..40 in files
    ds = ParquetDataset(out)
    ds.write_part(0, full.slice(0, 20), (0, 20))
    ds.write_part(0, full.slice(30, 10), (30, 40))
    res = g.map(source=source, into=out)
    assert res.rows == 50 and res.usage["double"]["calls"] == 20
    table = res.to_arrow().sort_by("_hn_row")
    assert table.column("_hn_row").to_pylist() == list(range(50))
    assert table.column("y").to_pylist() == [2 * x for x in range(50)]
    assert sorted(f.name for f in out.glob("part-*")) == [
        "part-000000-000000000-000000020.parquet", "part-000000-000000020-000000030.parquet",
        "part-000000-000000030-000000040.parquet", "part-000000-000000040-000000050.parquet"]


def test_steps_grow_for_fast_rows_and_stay_small_for_slow_ones():
    fast = Steps(commit_seconds=30)
    sizes = []
    for _ in range(6):
        n = fast.size(10**9)
        fast.record(n, 0.05 + 1e-6 * n)  # a fixed cost per step, 1 µs per row
        sizes.append(n)
    assert sizes == sorted(sizes) and sizes[-1] >= 500_000
    slow = Steps(commit_seconds=30)
    for _ in range(4):
        n = slow.size(10**9)
        slow.record(n, 1.0 * n)  # 1 s per row
    assert slow.size(10**9) <= 8  # about commit_seconds / 4 of work


def test_counts_read_files_written_without_statistics(tmp_path):
    """A part file some other writer left without Parquet statistics is counted from its
    error column; the other files still from their footers (none is dropped)."""
    @node(output_name="y")
    def check(x: int) -> int:
        if x % 3 == 0:
            raise ValueError(f"bad {x}")
        return x

    graph = Graph([check], engine=GraphEngine())
    res = graph.map({"x": list(range(30))}, map_over="x", into=str(tmp_path / "out"),
                    on_error="collect")
    assert (res.rows, res.failed) == (30, 10)
    files = ParquetDataset(str(tmp_path / "out")).part_files()
    table = pq.read_table(files[0])
    pq.write_table(table, files[0], write_statistics=False)
    out = ParquetDataset(str(tmp_path / "out"))
    assert [sum(c) for c in zip(*out.counts())] == [30, 10]
