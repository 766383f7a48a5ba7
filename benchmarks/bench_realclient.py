"""The users' job with a real client: an LLM call per row through the ``openai`` package.

A loopback OpenAI-compatible server (``hypernodes_bench.llm_server``, a subprocess) answers
in 10-30 ms and fails 1% of requests with HTTP 500. Each row is one
``chat.completions.create`` through ``openai.AsyncOpenAI(max_retries=0)`` held by a
``@resource``; the node has ``retries=3, concurrency=64``. Every engine runs at its DEFAULT
settings. Beside each engine, in the same run, the hand-written asyncio loop a user would
write instead: one shared client, ``asyncio.Semaphore(64)``, three retries by hand.

Reported per row: seconds, ``x loop`` (engine / hand loop, measured right before it),
failed rows, requests the server saw, and the driver's peak RSS during the map.

Run: ``.venv/bin/python benchmarks/bench_realclient.py [--rows 4000] [--engines a,b]``.
Prints a table and writes ``benchmarks/results/realclient.json``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from hypernodes_bench.llm_server import LLMServer, label_of
from hypernodes_bench.tables import engines_cli, machine
from hypernodes_dist import Graph, GraphEngine, node, resource

RESULTS = Path(__file__).parent / "results"
COLUMNS = ["engine", "rows", "seconds", "x_loop", "failed", "requests", "driver_mb"]
CONCURRENCY = 64
RETRIES = 3
FAIL_RATE = 0.01


@resource
def llm(base_url: str):
    """One client per worker process (its connection pool reused by every call)."""
    yield openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0)


@node(output_name="label", retries=RETRIES, concurrency=CONCURRENCY)
async def classify(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


# ------------------------------------------------------------------ the hand-written loop


async def _hand_loop(base_url: str, texts: list[str]) -> list[str]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(text: str) -> str:
        for attempt in range(RETRIES + 1):
            async with sem:
                try:
                    r = await client.chat.completions.create(
                        model="loopback", messages=[{"role": "user", "content": text}])
                    return r.choices[0].message.content
                except openai.APIError:
                    if attempt == RETRIES:
                        raise
        raise AssertionError("unreachable")

    try:
        return list(await asyncio.gather(*map(one, texts)))
    finally:
        await client.close()


def hand_loop(base_url: str, texts: list[str]) -> list[str]:
    return asyncio.run(_hand_loop(base_url, texts))


# ------------------------------------------------------------------ engines (defaults)


def _dask(**kwargs: Any) -> Any:
    from hypernodes_dask import DaskEngine

    return DaskEngine(**kwargs)


def _daft(**kwargs: Any) -> Any:
    from hypernodes_daft import DaftEngine

    return DaftEngine(**kwargs)


SETUPS: dict[str, Callable[[], Any]] = {
    "local": GraphEngine,
    "dask-threads": lambda: _dask(scheduler="threads"),
    "dask-processes": lambda: _dask(scheduler="processes"),
    "dask-localcluster": lambda: _dask(scheduler="distributed"),
    "daft-native": lambda: _daft(),
}


# ------------------------------------------------------------------ measuring


class PeakRSS:
    """The process's peak resident memory while the block runs (sampled every 10 ms)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRSS:
        self.peak = self.now()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def run_engine(engine: Any, server: LLMServer, texts: list[str]) -> dict[str, Any]:
    graph = Graph([llm, classify], engine=engine)
    inputs = {"text": texts, "base_url": server.base_url}
    graph.map({**inputs, "text": texts[:8]}, map_over="text")  # start pools, build clients
    server.reset()
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        res = graph.map(inputs, map_over="text", on_error="collect")
        seconds = time.perf_counter() - t0
    good = sum(1 for r, t in zip(res, texts) if r.status == "complete" and r["label"] == label_of(t))
    return {"seconds": seconds, "failed": len(texts) - good,
            "requests": server.stats()["requests"], "driver_mb": round(rss.peak / 2**20)}


def run_loop(server: LLMServer, texts: list[str]) -> dict[str, Any]:
    server.reset()
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        labels = hand_loop(server.base_url, texts)
        seconds = time.perf_counter() - t0
    good = sum(1 for got, t in zip(labels, texts) if got == label_of(t))
    return {"seconds": seconds, "failed": len(texts) - good,
            "requests": server.stats()["requests"], "driver_mb": round(rss.peak / 2**20)}


def main(rows: int, engines: list[str]) -> dict[str, Any]:
    texts = [f"review {i}: " + "great " * (i % 7) + "value" for i in range(rows)]
    load_before = os.getloadavg()[0]
    out: list[dict[str, Any]] = []
    with LLMServer(latency=(0.010, 0.030), fail_rate=FAIL_RATE) as server:
        hand_loop(server.base_url, texts[:64])  # warm the server and the client's imports
        for label in engines:
            engine = SETUPS[label]()
            try:
                loop = run_loop(server, texts)
                row = run_engine(engine, server, texts)
            finally:
                engine.close()
            out.append({"engine": "hand loop (before " + label + ")", "rows": rows,
                        **_rounded(loop), "x_loop": 1.0})
            out.append({"engine": label, "rows": rows, **_rounded(row),
                        "x_loop": round(row["seconds"] / loop["seconds"], 2)})
            print(out[-2], out[-1], sep="\n", flush=True)
    return {
        "machine": machine(load_before, openai=openai.__version__),
        "workload": {"rows": rows, "latency_ms": [10, 30], "fail_rate": FAIL_RATE,
                     "retries": RETRIES, "concurrency": CONCURRENCY},
        "rows": out,
    }


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "seconds": round(row["seconds"], 3)}


if __name__ == "__main__":
    engines_cli(__doc__ or "", main, COLUMNS, RESULTS, "realclient", 4_000, list(SETUPS),
                list(SETUPS))
