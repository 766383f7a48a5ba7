"""DaftEngine throughput: the trivial 3-node graph vs the plain loop, and an async I/O graph.

Rows (the functions are small so ``bench_engines.py`` can import them):

- ``trivial_rows``: ``x -> x+1 -> *2 -> f"{b}-{y}"`` (the graph of ``bench_local.py``) at
  1k/10k/100k items on ``DaftEngine()``; target ``ratio_to_loop <= 15`` at 100k;
- ``io_rows``: two async nodes sleeping 1 ms each per item; ``speedup`` is the serial time
  (each call awaited one after another) over the map's time; target ``>= 50``;
- ``udf_shape_rows``: the measured alternative of the engine's design — one Daft UDF
  column per node (what ``hypernodes_daft`` does not do) vs one batch UDF running the
  whole plan (what it does), on the same two graphs.

Run: ``.venv/bin/python benchmarks/bench_daft.py``; writes ``benchmarks/results/daft.json``.
"""

from __future__ import annotations

import asyncio
import json
import platform
import sys
import time
from pathlib import Path

from bench_local import best_of, double, fmt, inc, plain_loop

from hypernodes_daft import DaftEngine
from hypernodes_dist import Graph, node

RESULTS = Path(__file__).parent / "results"
SLEEP = 0.001


@node(output_name="page")
async def fetch(x: int) -> int:
    await asyncio.sleep(SLEEP)
    return x * 3


@node(output_name="label")
async def enrich(page: int) -> str:
    await asyncio.sleep(SLEEP)
    return f"p{page}"


def _row(engine: str, n: int, t: float, **extra: object) -> dict:
    return {"engine": engine, "items": n, "seconds": round(t, 4),
            "us_per_item": round(t / n * 1e6, 2), **extra}


def trivial_rows(sizes: list[int], engine: DaftEngine) -> list[dict]:
    g = Graph([inc, double, fmt], engine=engine)
    rows = []
    for n in sizes:
        xs = list(range(n))
        loop_s = best_of(lambda xs=xs: plain_loop(xs, "y"))
        assert g.map({"x": xs, "y": "y"}, map_over="x")[n - 1]["c"] == plain_loop(xs[-1:], "y")[0]
        t = best_of(lambda xs=xs: g.map({"x": xs, "y": "y"}, map_over="x"))
        rows.append(_row("daft trivial", n, t, ratio_to_loop=round(t / loop_s, 1)))
    return rows


def serial_io(xs: list[int]) -> float:
    async def loop() -> None:
        for x in xs:
            await enrich.func(await fetch.func(x))

    t0 = time.perf_counter()
    asyncio.run(loop())
    return time.perf_counter() - t0


def io_rows(n: int, engine: DaftEngine) -> list[dict]:
    serial = serial_io(list(range(500))) / 500 * n  # per-item serial cost, measured on 500
    g = Graph([fetch, enrich], engine=engine)
    xs = list(range(n))
    assert g.map({"x": xs}, map_over="x")[n - 1]["label"] == f"p{(n - 1) * 3}"
    t = best_of(lambda: g.map({"x": xs}, map_over="x"))
    floor = _raw_gather(n)
    return [_row("daft async 2x1ms", n, t, speedup=round(serial / t, 1),
                 serial_s=round(serial, 2), raw_asyncio_gather_speedup=round(serial / floor, 1))]


def _raw_gather(n: int) -> float:
    """The floor: the same sleeps as bare coroutines gathered on one loop (no engine)."""
    async def both(x: int) -> None:
        await asyncio.sleep(SLEEP)
        await asyncio.sleep(SLEEP)

    async def main() -> None:
        await asyncio.gather(*(both(x) for x in range(n)))

    return best_of(lambda: asyncio.run(main()))


def _per_node_pipeline(fns: list, xs: list[int], **kw: object) -> list:
    """One ``daft.func`` UDF column per node (the alternative design), no cache/events."""
    import daft
    import pyarrow as pa
    from daft import DataType, col

    df = daft.from_pydict({"x": pa.array(xs, pa.int64())})
    prev = "x"
    for i, fn in enumerate(fns):
        udf = daft.func(fn, return_dtype=DataType.python(), **kw)
        df = df.with_column(f"n{i}", udf(col(prev)))
        prev = f"n{i}"
    return df.select(prev).to_pydict()[prev]


def udf_shape_rows(n_trivial: int, n_io: int, engine: DaftEngine) -> list[dict]:
    xs = list(range(n_trivial))
    trivial = [inc.func, double.func, lambda b: fmt.func(b, "y")]
    g = Graph([inc, double, fmt], engine=engine)
    rows = [
        _row("one UDF per node (trivial)", n_trivial,
             best_of(lambda: _per_node_pipeline(trivial, xs))),
        _row("one batch UDF, whole plan (trivial)", n_trivial,
             best_of(lambda: g.map({"x": xs, "y": "y"}, map_over="x"))),
    ]
    ys = list(range(n_io))
    ga = Graph([fetch, enrich], engine=engine)
    rows += [
        _row("one async UDF per node (io)", n_io,
             best_of(lambda: _per_node_pipeline([fetch.func, enrich.func], ys,
                                                max_concurrency=n_io))),
        _row("one batch UDF, whole plan (io)", n_io,
             best_of(lambda: ga.map({"x": ys}, map_over="x"))),
    ]
    return rows


def print_table(rows: list[dict]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    print(" | ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" | ".join(f"{str(r.get(c, '')):>14}" for c in cols))


def main(sizes: list[int]) -> list[dict]:
    engine = DaftEngine()
    return (trivial_rows(sizes, engine) + io_rows(5_000, engine)
            + udf_shape_rows(100_000, 2_000, engine))


if __name__ == "__main__":
    rows = main([int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000])
    print_table(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"benchmark": "daft", "python": platform.python_version(), "rows": rows}
    (RESULTS / "daft.json").write_text(json.dumps(out, indent=2))
