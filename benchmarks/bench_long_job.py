"""The long paid job as a user lives it: a Parquet file enriched by an LLM into ``into=``,
killed midway or stopped by its budget, then run again. Are paid rows ever paid twice?

A loopback OpenAI-compatible server (``hypernodes_bench.llm_server``, a subprocess, no
limits) counts the requests it answers. Each row is one ``chat.completions.create``
through the real ``openai.AsyncOpenAI`` held by a ``@resource``, ``meter(tokens=...)``,
64 calls in flight; default engine settings, default ``commit_seconds``, no cache, the
default ``on_error="raise"``. Every map runs in its own driver process (this script with
``drive``), so it can be SIGKILLed with its workers (its process group).

Per engine (local, Dask processes, Daft):

- **full**: one map of every row;
- **kill at 50%**: SIGKILL once the server has answered half the rows, then the same map
  again to the end;
- **budget stop**: ``budget={"tokens": half the full run's tokens}`` (the map raises
  ``BudgetExceededError``), then the same map again without a budget.

Reported: wall seconds of each map (in its driver, without the interpreter's start),
requests the server answered in each run, rows in files after the first run, and rows
paid twice (requests over both runs minus the rows: a finished row that was not written
is paid again by the rerun).

Run: ``.venv/bin/python benchmarks/bench_long_job.py [--rows 20000] [--engines a,b]``.
Prints a table and writes ``benchmarks/results/long_job.json``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
import pyarrow as pa
import pyarrow.parquet as pq

from hypernodes_bench.llm_server import LLMServer
from hypernodes_bench.tables import engines_cli, machine
from hypernodes_dist import Graph, GraphEngine, meter, node, resource

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["engine", "scenario", "run1_s", "rerun_s", "paid_run1", "written_run1",
           "paid_rerun", "paid_twice", "rows"]
ENGINES = ["local", "dask-processes", "daft"]


@resource
def llm(base_url: str):
    yield openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0)


@node(output_name="label", concurrency=64)
async def classify(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=5)
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content


def _engine(name: str) -> Any:
    if name == "local":
        return GraphEngine()
    if name == "dask-processes":
        from hypernodes_dask import DaskEngine

        return DaskEngine(scheduler="processes")
    from hypernodes_daft import DaftEngine

    return DaftEngine()


# ------------------------------------------------------------------ one map (a driver process)


def drive(engine_name: str, source: str, into: str, base_url: str, tokens: str) -> None:
    """``drive ENGINE SOURCE INTO BASE_URL TOKENS`` (TOKENS 0: no budget): prints
    ``seconds=...`` and ``rows=...`` (or the error's type)."""
    engine = _engine(engine_name)
    budget = {"tokens": float(tokens)} if float(tokens) else None
    t0 = time.perf_counter()
    try:
        res = Graph([llm, classify], engine=engine).map(
            source=source, inputs={"base_url": base_url}, into=into, budget=budget)
        print(f"rows={res.rows}", flush=True)
    except Exception as exc:  # noqa: BLE001 -- the budget's stop, reported to the parent
        print(f"error={type(exc).__name__}", flush=True)
    finally:
        print(f"seconds={time.perf_counter() - t0:.2f}", flush=True)
        engine.close()


def _start(engine: str, src: Path, out: Path, server: LLMServer, tokens: float = 0) -> Any:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), str(Path(__file__).parent), os.environ.get("PYTHONPATH", ""))
        if p))
    return subprocess.Popen(
        [sys.executable, __file__, "drive", engine, str(src), str(out), server.base_url,
         str(tokens)], env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)


def _finish(proc: Any) -> dict[str, str]:
    text = proc.communicate(timeout=1800)[0]
    return dict(line.split("=", 1) for line in text.split() if "=" in line)


def _written(out: Path) -> int:
    return sum(pq.read_metadata(f).num_rows for f in out.glob("part-*.parquet"))


# ------------------------------------------------------------------ scenarios


def _full(engine: str, src: Path, tmp: Path, server: LLMServer, n: int) -> dict[str, Any]:
    server.reset()
    got = _finish(_start(engine, src, tmp / f"{engine}-full", server))
    stats = server.stats()
    return {"scenario": "full", "run1_s": float(got["seconds"]), "paid_run1": stats["requests"],
            "written_run1": _written(tmp / f"{engine}-full"), "tokens": stats["tokens"]}


def _killed(engine: str, src: Path, tmp: Path, server: LLMServer, n: int) -> dict[str, Any]:
    out = tmp / f"{engine}-killed"
    server.reset()
    t0 = time.perf_counter()
    proc = _start(engine, src, out, server)
    while server.stats()["requests"] < n // 2 and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    seconds = time.perf_counter() - t0
    return {"scenario": "kill at 50%", "run1_s": round(seconds, 2),
            **_rerun(engine, src, out, server, n)}


def _budget(engine: str, src: Path, tmp: Path, server: LLMServer, n: int,
            tokens: float) -> dict[str, Any]:
    out = tmp / f"{engine}-budget"
    server.reset()
    got = _finish(_start(engine, src, out, server, tokens / 2))
    assert got.get("error") == "BudgetExceededError", got
    return {"scenario": "budget stop at 50%", "run1_s": float(got["seconds"]),
            **_rerun(engine, src, out, server, n)}


def _rerun(engine: str, src: Path, out: Path, server: LLMServer, n: int) -> dict[str, Any]:
    paid1, written = server.stats()["requests"], _written(out)
    server.reset()
    got = _finish(_start(engine, src, out, server))
    assert got.get("rows") == str(n), got
    paid2 = server.stats()["requests"]
    return {"paid_run1": paid1, "written_run1": written, "rerun_s": float(got["seconds"]),
            "paid_rerun": paid2, "paid_twice": paid1 + paid2 - n}


def main(rows: int, engines: list[str]) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, LLMServer() as server:
        src = Path(tmp) / "reviews.parquet"
        pq.write_table(pa.table({"text": [f"review {i}: " + "fine " * (i % 9)
                                          for i in range(rows)]}), src)
        for engine in engines:
            full = _full(engine, src, Path(tmp), server, rows)
            tokens = full.pop("tokens")
            for row in (full, _killed(engine, src, Path(tmp), server, rows),
                        _budget(engine, src, Path(tmp), server, rows, tokens)):
                out.append({"engine": engine, **row, "rows": rows})
                print(out[-1], flush=True)
    return {"machine": machine(load_before, openai=openai.__version__),
            "setup": {"rows": rows, "concurrency": 64, "server_latency_s": [0.01, 0.03],
                      "commit_seconds": "default", "on_error": "raise", "cache": None},
            "rows": out}


if __name__ == "__main__":
    if sys.argv[1:2] == ["drive"]:
        drive(*sys.argv[2:])
    else:
        engines_cli(__doc__, main, COLUMNS, RESULTS, "long_job", 20_000, ENGINES, ENGINES)
