"""Batch nodes (``@node(batch_size=N)``): many items per call, against per-row nodes and by hand.

Part 1, ``api``: an embeddings job against the loopback OpenAI-compatible server
(``hypernodes_bench.llm_server.LLMServer``: POST /v1/embeddings, up to 64 inputs per
request, 10-30 ms a request), ``--rows`` texts (default 50 000), at most ``--calls``
requests in flight (default 16) in every case, one ``httpx.AsyncClient`` (a ``@resource``):

- ``batch node``: ``@node(batch_size=64, concurrency=16)`` async, ``Graph.map`` on the
  default ``GraphEngine``;
- ``per-row node``: the same job, one request per row (``concurrency=16``), over the first
  ``--per-row-rows`` texts (default 4 000: its rows/s does not depend on the row count);
- ``hand loop``: a hand-written batched ``asyncio`` loop (chunks of 64, a
  ``Semaphore(16)``, ``gather``).

The hand loop and the batch node alternate, best of ``--repeat`` (default 2) each.

Targets: batch node >= 10x the per-row node's rows/s, and its time <= 1.1x the hand loop's.

Part 2, ``arrow``: a Parquet dataset of ``--arrow-rows`` rows (default 3 000 000) through an
Arrow compute step (``pyarrow.compute.utf8_length`` of a text column), written to Parquet:
``batch node`` (``batch_size=10 000``, the list taken as an Arrow array) and ``per-row
node`` (``len``) with ``map(source=, into=)`` on the local and Daft engines, and a ``raw
Daft`` pipeline (``daft.read_parquet`` -> ``@daft.func.batch`` -> ``write_parquet``). Each
case runs in a fresh subprocess reporting its time and the driver's peak RSS (``VmHWM``).

Run: ``.venv/bin/python benchmarks/bench_batch.py [--rows 50000] [--arrow-rows 3000000]
[--parts api,arrow] [--repeat 2]``. Prints a table, writes ``benchmarks/results/batch.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from hypernodes_dist import Graph, GraphEngine, node, resource

RESULTS = Path(__file__).parent / "results"
MAX_BATCH = 64
CALLS = 16
ARROW_BATCH = 10_000
FILE_ROWS = 500_000


# ------------------------------------------------------------------ part 1: the API job


@resource
async def http(base_url: str):
    """One connection pool per process and loop."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0,
                                 limits=httpx.Limits(max_connections=64)) as client:
        yield client


async def _post(client: httpx.AsyncClient, texts: list[str]) -> list[list[float]]:
    response = await client.post("/embeddings", json={"model": "loopback", "input": texts})
    response.raise_for_status()
    return [d["embedding"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]


@node(output_name="vector", batch_size=MAX_BATCH, concurrency=CALLS)
async def embed_batch(text: list[str], http: httpx.AsyncClient) -> list[list[float]]:
    return await _post(http, text)


@node(output_name="vector", concurrency=CALLS)
async def embed_row(text: str, http: httpx.AsyncClient) -> list[float]:
    return (await _post(http, [text]))[0]


async def _hand_loop(base_url: str, texts: list[str]) -> list[list[float]]:
    sem = asyncio.Semaphore(CALLS)
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0,
                                 limits=httpx.Limits(max_connections=64)) as client:
        async def one(chunk: list[str]) -> list[list[float]]:
            async with sem:
                return await _post(client, chunk)

        chunks = [texts[k:k + MAX_BATCH] for k in range(0, len(texts), MAX_BATCH)]
        done = await asyncio.gather(*map(one, chunks))
    return [v for chunk in done for v in chunk]


def _texts(n: int) -> list[str]:
    return [f"review {i}: " + "good " * (i % 7) + "value" for i in range(n)]


def _server() -> Any:
    from hypernodes_bench.llm_server import LLMServer

    return LLMServer(latency=(0.010, 0.030), max_batch=MAX_BATCH)


def _graph_case(label: str, nodes: list[Any], base_url: str, texts: list[str]
                ) -> tuple[dict[str, Any], list[Any]]:
    graph = Graph([http, *nodes], engine=GraphEngine())
    t0 = time.perf_counter()
    res = graph.map({"text": texts, "base_url": base_url}, map_over="text")
    seconds = time.perf_counter() - t0
    return _row(label, len(texts), seconds), [r["vector"] for r in res]


def _row(label: str, rows: int, seconds: float) -> dict[str, Any]:
    return {"case": label, "rows": rows, "seconds": round(seconds, 3),
            "rows_per_s": round(rows / seconds, 1)}


def _hand_case(base_url: str, texts: list[str]) -> tuple[dict[str, Any], list[Any]]:
    t0 = time.perf_counter()
    vectors = asyncio.run(_hand_loop(base_url, texts))
    return _row("hand loop", len(texts), time.perf_counter() - t0), vectors


def bench_api(rows: int, per_row_rows: int, repeat: int) -> dict[str, Any]:
    """Best of ``repeat`` runs of the hand loop and the batch node, alternated."""
    texts = _texts(rows)
    with _server() as server:
        base = server.base_url
        asyncio.run(_hand_loop(base, texts[:MAX_BATCH]))  # warm the server
        hands, batches = [], []
        for _ in range(repeat):
            hands.append(_hand_case(base, texts))
            server.reset()
            batches.append(_graph_case("batch node", [embed_batch], base, texts))
            stats = server.stats()
        (hand, by_hand), (batch, vectors) = (min(runs, key=lambda r: r[0]["seconds"])
                                             for runs in (hands, batches))
        per_row, row_vectors = _graph_case("per-row node", [embed_row], base,
                                           texts[:per_row_rows])
    assert vectors == by_hand, "the batch node's vectors differ from the hand loop's"
    assert row_vectors == by_hand[:per_row_rows], "the per-row node's vectors differ"
    batch["requests"] = stats.get("embeddings", stats.get("requests"))
    return {"cases": [batch, per_row, hand],
            "batch_vs_per_row": round(batch["rows_per_s"] / per_row["rows_per_s"], 1),
            "batch_vs_hand": round(batch["seconds"] / hand["seconds"], 3),
            "targets": {"batch_vs_per_row": ">= 10", "batch_vs_hand": "<= 1.1"}}


# ------------------------------------------------------------------ part 2: Arrow compute


@node(output_name="n_chars", batch_size=ARROW_BATCH)
def chars_batch(text: list[str]) -> list[int]:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.utf8_length(pa.array(text, pa.string())).to_pylist()


@node(output_name="n_chars")
def chars_row(text: str) -> int:
    return len(text)


def make_input(directory: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    for f, start in enumerate(range(0, rows, FILE_ROWS)):
        ids = range(start, min(rows, start + FILE_ROWS))
        table = pa.table({"id": pa.array(ids, pa.int64()),
                          "body": [f"review {i} " + "word " * (i % 9) for i in ids]})
        pq.write_table(table, directory / f"part-{f:03d}.parquet", row_group_size=100_000)


def hypernodes_case(kind: str, engine_name: str, src: Path, out: Path) -> int:
    if engine_name == "daft":
        from hypernodes_daft import DaftEngine

        engine: Any = DaftEngine()
    else:
        engine = GraphEngine()
    step = chars_batch if kind == "batch" else chars_row
    with engine:
        res = Graph([step], engine=engine).map(source=str(src), columns={"text": "body"},
                                               keep=["id"], into=str(out))
        return res.rows


def raw_daft(src: Path, out: Path) -> int:
    import daft
    import pyarrow.compute as pc
    from daft import DataType, col

    @daft.func.batch(return_dtype=DataType.int64())
    def chars(body: daft.Series) -> Any:
        return pc.cast(pc.utf8_length(body.to_arrow()), "int64")

    daft.read_parquet(f"{src}/*.parquet").select(
        col("id"), chars(col("body")).alias("n_chars")).write_parquet(str(out))
    return daft.read_parquet(f"{out}/*.parquet").count_rows()


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_case(case: str, src: Path, out: Path) -> dict[str, Any]:
    kind, engine = case.split("-", 1)
    t0 = time.perf_counter()
    rows = raw_daft(src, out) if kind == "raw" else hypernodes_case(kind, engine, src, out)
    seconds = time.perf_counter() - t0
    return {"case": case, "rows": rows, "seconds": round(seconds, 3),
            "rows_per_s": round(rows / seconds, 1),
            "driver_peak_rss_mb": round(peak_rss_mb(), 1)}


ARROW_CASES = ("batch-local", "row-local", "batch-daft", "row-daft", "raw-daft")


def in_subprocess(case: str, src: Path, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, __file__, "--case", case, str(src), str(out)],
                          capture_output=True, text=True, timeout=3600,
                          cwd=Path(__file__).parent, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_arrow(rows: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="hn-bench-batch-"))
    try:
        make_input(work / "src", rows)
        cases = {c: in_subprocess(c, work / "src", work / f"out-{c}") for c in ARROW_CASES}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = cases["raw-daft"]["seconds"]
    for c in cases.values():
        c["x_raw_daft"] = round(c["seconds"] / raw, 2)
    return {"cases": list(cases.values()),
            "batch_vs_row_local": round(cases["row-local"]["seconds"]
                                        / cases["batch-local"]["seconds"], 2),
            "batch_vs_row_daft": round(cases["row-daft"]["seconds"]
                                       / cases["batch-daft"]["seconds"], 2)}


# ------------------------------------------------------------------ driver


def table(results: dict[str, Any]) -> list[str]:
    lines = [f"{'part':<6} {'case':<14} {'rows':>9} {'seconds':>9} {'rows/s':>11} "
             f"{'x raw/hand':>10} {'peak MB':>8}"]
    for part, found in results["parts"].items():
        hand = next((c["rows_per_s"] for c in found["cases"] if c["case"] == "hand loop"),
                    None)
        for c in found["cases"]:  # time per row relative to the raw pipeline / hand loop
            ratio = c.get("x_raw_daft") or (round(hand / c["rows_per_s"], 2) if hand else "")
            lines.append(f"{part:<6} {c['case']:<14} {c['rows']:>9} {c['seconds']:>9.3f} "
                         f"{c['rows_per_s']:>11.1f} {ratio!s:>10} "
                         f"{c.get('driver_peak_rss_mb', '')!s:>8}")
    api = results["parts"].get("api")
    if api:
        lines.append(f"api: batch node = {api['batch_vs_per_row']}x the per-row node's rows/s "
                     f"(target >= 10), {api['batch_vs_hand']}x the hand loop's time "
                     "(target <= 1.1)")
    arrow = results["parts"].get("arrow")
    if arrow:
        lines.append(f"arrow: per-row time / batch time = {arrow['batch_vs_row_local']} (local), "
                     f"{arrow['batch_vs_row_daft']} (Daft); above 1: the batch node is faster")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--per-row-rows", type=int, default=4_000)
    ap.add_argument("--arrow-rows", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=2, help="api: best of N runs")
    ap.add_argument("--parts", default="api,arrow")
    ap.add_argument("--case", nargs=3, metavar=("CASE", "SRC", "OUT"))
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case[0], Path(args.case[1]), Path(args.case[2]))))
        return
    parts = args.parts.split(",")
    results: dict[str, Any] = {"machine": {"python": platform.python_version(),
                                           "cpus": os.cpu_count(),
                                           "load_before": os.getloadavg()}, "parts": {}}
    if "api" in parts:
        results["parts"]["api"] = bench_api(args.rows, min(args.per_row_rows, args.rows),
                                            args.repeat)
    if "arrow" in parts:
        results["parts"]["arrow"] = bench_arrow(args.arrow_rows)
    results["machine"]["load_after"] = os.getloadavg()
    print("\n".join(table(results)))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
