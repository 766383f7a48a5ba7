"""Limits that belong to the API (issue 33): a server limiting each API key as OpenAI does.

The loopback server (``hypernodes_bench.llm_server``, ``bucket=True``) keeps per API key a
token bucket of ``RPM`` requests refilled continuously (``RPM/60`` a second); a key starts
nearly spent (``REMAINING`` requests left). Each row is a fresh server and key; every call
is one ``chat.completions.create`` through the real ``openai.AsyncOpenAI`` held by a
``@resource`` (``max_retries=0``), the node ``retries=8, retry_on=RETRY_ON`` (429s and
connection errors),
``concurrency=64``, default engine settings:

- **no limits declared, limits in headers**: the server sends ``x-ratelimit-*``; the
  resource declares nothing and learns them (``policies/learned.py``).
- **no limits, no headers, 429 + Retry-After only**: the same, the server sending no
  ``x-ratelimit-*``: only Retry-After hold-offs and the back-off shared by every process.
- **two nodes sharing one resource limit**: ``@resource(rate_limit="RPM/minute")`` (the
  provider's limit as a user copies it) received by two nodes; the key starts full.

Reported: seconds, ``x_ideal`` (seconds / (requests admitted / the key's rate)), the
server's active time (first to last request) and its ``x_ideal``, requests, 429s and their
share, peak in flight, failed rows, the spacing of the arrivals (p99 and largest gap) and
the 1-minute load average after the row. Before each engine's rows, a **hand loop** (bare
asyncio, the same client, 64 at once, requests started at the key's rate, the two-node
row's requests) gives the machine's floor at that moment: on a loaded machine every row,
the hand loop too, runs slower than the ideal because the client's CPU (about 2 ms a
request for ``openai``) is not there. Run:
``.venv/bin/python benchmarks/bench_api_limits.py [--rows 3000] [--engines a,b]``; writes
``benchmarks/results/api_limits.json``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import openai
from bench_realclient import SETUPS

from hypernodes_bench.llm_server import LLMServer, label_of
from hypernodes_bench.tables import engines_cli, machine
from hypernodes_dist import Graph, node, resource

RESULTS = Path(__file__).parent / "results"
COLUMNS = ["run", "rows", "seconds", "x_ideal", "server_active_s", "server_x_ideal",
           "requests", "429s", "pct_429", "peak_in_flight", "failed", "gap_p99_ms",
           "gap_max_ms", "load_1m"]
RPM = 12_000  # 200 requests a second per key
REMAINING = 5  # a nearly spent key
CONCURRENCY = 64
# a 429 is retried, and so is a connection that could not be made: on a loaded machine the
# loopback server accepts late and the client's 5 s connect timeout fails the request
# before it reaches the server (33 of 6,000 rows in one Dask processes run at load 20+)
RETRY_ON = (openai.RateLimitError, openai.APIConnectionError)


def _client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


async def _ask(client: openai.AsyncOpenAI, text: str) -> str:
    r = await client.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=5)
    return r.choices[0].message.content or ""


@resource
def api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=8, retry_on=RETRY_ON, concurrency=CONCURRENCY)
async def ask(text: str, api) -> str:
    return await _ask(api, text)


@resource(rate_limit=f"{RPM}/minute")
def shared_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=8, retry_on=RETRY_ON, concurrency=CONCURRENCY)
async def ask_first(text: str, shared_api) -> str:
    return await _ask(shared_api, text)


@node(output_name="again", retries=8, retry_on=RETRY_ON, concurrency=CONCURRENCY)
async def ask_second(text: str, shared_api) -> str:
    return await _ask(shared_api, "again " + text)


ROWS = {  # run -> (nodes, server options)
    "no limits declared, limits in headers": ([api, ask], {"remaining": REMAINING}),
    "no limits, no headers, 429 + Retry-After only": (
        [api, ask], {"remaining": REMAINING, "headers": False}),
    "two nodes sharing one resource limit": ([shared_api, ask_first, ask_second], {}),
}


def run(label: str, name: str, texts: list[str]) -> dict[str, Any]:
    nodes, options = ROWS[name]
    engine = SETUPS[label]()
    try:
        graph = Graph(nodes, engine=engine)
        with LLMServer(latency=(0.010, 0.030), rpm=RPM, bucket=True, **options) as server:
            warm = f"warm-{uuid.uuid4().hex[:8]}"  # workers start and build their clients
            graph.map({"text": texts[:8], "base_url": server.base_url, "api_key": warm},
                      map_over="text")
            key = f"key-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            res = graph.map({"text": texts, "base_url": server.base_url, "api_key": key},
                            map_over="text", on_error="collect")
            seconds = time.perf_counter() - t0
            seen = _seen(server, key)
    finally:
        engine.close()
    failed = [r for r, t in zip(res, texts) if r.status != "complete" or r["label"] != label_of(t)]
    row = _row(f"ours: {label}, {name}", len(texts), seconds, seen,
               options.get("remaining", 0), len(failed))
    row["errors"] = dict(Counter(f"{type(r.error).__name__}: {str(r.error)[:120]}"
                                 for r in failed))  # what failed rows raised
    return row


def hand_loop(texts: list[str]) -> dict[str, Any]:
    """The machine's floor now: the two-node row's requests (two a row) from a bare
    asyncio loop with the same client, 64 at once, started at the key's rate."""
    async def loop(base_url: str, key: str, n: int) -> None:
        client, units = _client(base_url, key), asyncio.Semaphore(CONCURRENCY)
        start, interval = time.time(), 60 / RPM

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, start + i * interval - time.time()))
            async with units:
                await _ask(client, texts[i // 2] if i % 2 == 0 else "again " + texts[i // 2])

        await asyncio.gather(*(one(i) for i in range(n)))
        await client.close()

    with LLMServer(latency=(0.010, 0.030), rpm=RPM, bucket=True) as server:
        asyncio.run(loop(server.base_url, f"warm-{uuid.uuid4().hex[:8]}", 16))
        key = f"key-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        asyncio.run(loop(server.base_url, key, 2 * len(texts)))
        seconds = time.perf_counter() - t0
        seen = _seen(server, key)
    return _row("hand loop: asyncio + openai, paced at the key's rate, two calls a row",
                len(texts), seconds, seen, 0, 0)


def _seen(server: LLMServer, key: str) -> dict[str, Any]:
    """What the server saw of ``key``, with its requests' arrival times."""
    return {**server.keys()[key], "arrivals": sorted(t for t, _ in server.log(key))}


def _row(run_name: str, rows: int, seconds: float, seen: dict[str, Any], remaining: int,
         failed: int) -> dict[str, Any]:
    ideal = max(0.0, seen["ok"] - remaining) / (RPM / 60)
    arrivals = seen["arrivals"]
    active = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:])) or [0.0]
    return {"run": run_name, "rows": rows, "seconds": round(seconds, 2),
            "x_ideal": round(seconds / ideal, 3) if ideal else None,
            # the server's view: first to last request, and how the arrivals were spaced
            "server_active_s": round(active, 2),
            "server_x_ideal": round(active / ideal, 3) if ideal else None,
            "requests": seen["requests"], "429s": seen["rate_limited"],
            "pct_429": round(100 * seen["rate_limited"] / max(1, seen["requests"]), 2),
            "peak_in_flight": seen["max_in_flight"], "failed": failed,
            "gap_p50_ms": round(1000 * gaps[len(gaps) // 2], 2),
            "gap_p99_ms": round(1000 * gaps[int(len(gaps) * 0.99)], 2),
            "gap_max_ms": round(1000 * gaps[-1], 1),
            "load_1m": round(os.getloadavg()[0], 1)}


def main(rows: int, engines: list[str]) -> dict[str, Any]:
    texts = [f"review {i}: " + "fine " * (i % 9) + "value" for i in range(rows)]
    load_before = os.getloadavg()[0]
    out = []
    for label in engines:
        out.append(hand_loop(texts))  # the floor at this moment's load, before each engine
        print(out[-1], flush=True)
        for name in ROWS:
            out.append(run(label, name, texts))
            print(out[-1], flush=True)
    return {"machine": machine(load_before, openai=openai.__version__),
            "workload": {"rows": rows, "latency_ms": [10, 30], "rpm_per_key": RPM,
                         "remaining_at_start": REMAINING, "concurrency": CONCURRENCY},
            "rows": out}


if __name__ == "__main__":
    engines_cli(__doc__ or "", main, COLUMNS, RESULTS, "api_limits", 3_000,
                ["local", "dask-processes", "daft-native"], list(SETUPS))
