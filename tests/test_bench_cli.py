"""``hypernodes-dist bench``: built-in workloads, user graphs, engines, outputs."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hypernodes_bench import runner as bench
from hypernodes_bench.workloads import WORKLOADS, cpu_inputs, get_workload
from hypernodes_dist.cli import main

USER_MODULE = '''
from hypernodes_dist import Graph, node

@node(output_name="sq")
def square(v: int) -> int:
    return v * v

@node(output_name="out")
def shift(sq: int, k: int) -> int:
    return sq + k

graph = Graph([square, shift])

def make_inputs(n):
    return {"v": list(range(n)), "k": 1}, "v"

def loop(inputs):
    return [v * v + inputs["k"] for v in inputs["v"]]

@node(output_name="bad")
def explode(v: int) -> int:
    raise ValueError("nope")

broken = [explode]

def only_v(n):
    return {"v": list(range(n))}, ["v"]
'''


def _run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    rc = main(["bench", "--out", str(tmp_path), "--repeat", "1", "--no-plot", *args])
    return rc, json.loads((tmp_path / "bench.json").read_text())


def test_builtin_workloads_match_their_loops():
    for w in WORKLOADS.values():
        if w.name == "cpu":
            inputs, map_over = cpu_inputs(5, work=10)
        else:
            inputs, map_over = w.inputs(5)
        res = w.graph().map(inputs, map_over, select=[w.output])
        assert [r[w.output] for r in res] == w.loop(inputs)
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("nope")


def test_bench_local_writes_table_json_and_csv(tmp_path, capsys):
    rc, report = _run(tmp_path, "--engines", "local", "--items", "10,50",
                      "--workloads", "trivial,async-io")
    assert rc == 0
    rows = report["rows"]
    assert [(r["workload"], r["items"]) for r in rows] == [
        ("trivial", 10), ("trivial", 50), ("async-io", 10), ("async-io", 50)]
    for r in rows:
        assert r["error"] is None and r["items_per_s"] > 0 and r["x_loop"] > 0
        assert r["cache"] == "off" and r["hits"] == 0
    assert len(report["machine"]["load_avg"]) == 3
    with (tmp_path / "bench.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    out = capsys.readouterr().out
    assert "items/s" in out and "x loop" in out and "load average" in out


def test_bench_cache_reports_cold_and_warm_hits(tmp_path):
    rc, report = _run(tmp_path, "--engines", "local", "--items", "40", "--cache")
    assert rc == 0
    cold, warm = report["rows"]
    assert (cold["cache"], cold["hits"]) == ("cold", 0)
    assert (warm["cache"], warm["hits"]) == ("warm", 40)  # one hit per item: the leaf output


def test_bench_user_graph_with_inputs_and_loop(tmp_path, monkeypatch):
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "bench_user_mod.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.chdir(mod)
    monkeypatch.setattr(sys, "path", list(sys.path))
    rc, report = _run(tmp_path, "--engines", "local", "--items", "30",
                      "--workloads", "bench_user_mod:graph", "--inputs",
                      "bench_user_mod:make_inputs", "--loop", "bench_user_mod:loop")
    assert rc == 0
    (row,) = report["rows"]
    assert row["workload"] == "bench_user_mod:graph" and row["x_loop"] is not None

    rc, report = _run(tmp_path, "--engines", "local", "--items", "5", "--workloads",
                      "bench_user_mod:broken", "--inputs", "bench_user_mod:only_v")
    assert rc == 1  # every row failed
    assert "ValueError: nope" in report["rows"][0]["error"]


def test_bench_dask_threads_variant(tmp_path):
    pytest.importorskip("hypernodes_dask")
    rc, report = _run(tmp_path, "--engines", "dask-threads", "--items", "20")
    assert rc == 0 and report["rows"][0]["engine"] == "dask-threads"


def test_bench_rejects_unknown_engine_and_bad_items(tmp_path, capsys):
    assert main(["bench", "--engines", "spark", "--out", str(tmp_path)]) == 2
    assert "unknown engine 'spark'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's own check of --items
        main(["bench", "--items", "0", "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert bench.ALIASES["dask"] == "dask-processes" and bench.ALIASES["daft"] == "daft-native"


def test_max_seconds_skips_sizes_predicted_too_slow(tmp_path):
    rc, report = _run(tmp_path, "--engines", "local", "--workloads", "async-io",
                      "--items", "20,1000000", "--max-seconds", "1")
    assert rc == 0
    big = report["rows"][1]
    assert big["seconds"] is None and big["error"].startswith("skipped: predicted")


def test_plot_written_or_skipped_with_reason(tmp_path, monkeypatch):
    rows = [bench._row(get_workload("trivial"), "local", n, "off", n / 1e5, n / 1e6, 0, 0.0)
            for n in (10, 100)]
    png = tmp_path / "p.png"
    why = bench.plot(rows, png)
    if why is None:
        assert png.stat().st_size > 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "matplotlib is not installed" in bench.plot(rows, tmp_path / "q.png")


def test_console_script_has_bench(tmp_path):
    script = Path(sys.executable).with_name("hypernodes-dist")
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    out = subprocess.run([str(script), "bench", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--engines" in out.stdout and "async-io" in out.stdout


@pytest.mark.parametrize("args, says", [
    (["bench", "-w", "llm"], "unknown workload 'llm'; built-in: trivial"),
    (["bench", "-e", "spark"], "unknown engine 'spark'; choose from local"),
    (["bench", "-w", "no_such_module_hn:graph"], "cannot import 'no_such_module_hn'"),
    (["bench", "-w", "os:no_such_graph"], "module 'os' has no 'no_such_graph'"),
    (["bench", "-w", "os:path"], "'os:path' is a module, not a Graph"),
    (["bench", "-w", "nocolon:"], "expected module:attr"),
    (["bench", "-n", "0"], "item counts must be >= 1"),
    (["cache", "info", "/no/such/cache"], "no cache at '/no/such/cache'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_command_line_mistakes_are_one_line_and_exit_code_2(tmp_path, args, says):
    """What a user typing the command sees: the reason on one line, no traceback."""
    done = subprocess.run([sys.executable, "-m", "hypernodes_dist.cli", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(("hypernodes-dist: error: ", "hypernodes-dist bench: error: "))
