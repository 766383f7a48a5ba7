"""Limits that belong to the API (issue 33): a server limiting each API key as OpenAI does.

The loopback server (``hypernodes_bench.llm_server``, ``bucket=True``) keeps per API key a
token bucket of ``RPM`` requests refilled continuously (``RPM/60`` a second); a key starts
nearly spent (``REMAINING`` requests left). Each row is a fresh server and key; every call
is one ``chat.completions.create`` through the real ``openai.AsyncOpenAI`` held by a
``@resource`` (``max_retries=0``), the node ``retries=8, retry_on=openai.RateLimitError``,
``concurrency=64``, default engine settings:

- **no limits declared, limits in headers**: the server sends ``x-ratelimit-*``; the
  resource declares nothing and learns them (``policies/learned.py``).
- **no limits, no headers, 429 + Retry-After only**: the same, the server sending no
  ``x-ratelimit-*``: only Retry-After hold-offs and the back-off shared by every process.
- **two nodes sharing one resource limit**: ``@resource(rate_limit="RPM/minute")`` (the
  provider's limit as a user copies it) received by two nodes; the key starts full.

Reported: seconds, ``x_ideal`` (seconds / (requests admitted / the key's rate)), requests,
429s and their share, peak in flight, failed rows. Run:
``.venv/bin/python benchmarks/bench_api_limits.py [--rows 3000] [--engines a,b]``; writes
``benchmarks/results/api_limits.json``.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import openai
from bench_realclient import SETUPS

from hypernodes_bench.llm_server import LLMServer, label_of
from hypernodes_bench.tables import engines_cli, machine
from hypernodes_dist import Graph, node, resource

RESULTS = Path(__file__).parent / "results"
COLUMNS = ["run", "rows", "seconds", "x_ideal", "requests", "429s", "pct_429",
           "peak_in_flight", "failed"]
RPM = 12_000  # 200 requests a second per key
REMAINING = 5  # a nearly spent key
CONCURRENCY = 64


def _client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


async def _ask(client: openai.AsyncOpenAI, text: str) -> str:
    r = await client.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=5)
    return r.choices[0].message.content or ""


@resource
def api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=8, retry_on=openai.RateLimitError, concurrency=CONCURRENCY)
async def ask(text: str, api) -> str:
    return await _ask(api, text)


@resource(rate_limit=f"{RPM}/minute")
def shared_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=8, retry_on=openai.RateLimitError, concurrency=CONCURRENCY)
async def ask_first(text: str, shared_api) -> str:
    return await _ask(shared_api, text)


@node(output_name="again", retries=8, retry_on=openai.RateLimitError, concurrency=CONCURRENCY)
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
            seen = server.keys()[key]
    finally:
        engine.close()
    ideal = max(0.0, seen["ok"] - options.get("remaining", 0)) / (RPM / 60)
    failed = sum(1 for r, t in zip(res, texts)
                 if r.status != "complete" or r["label"] != label_of(t))
    return {"run": f"ours: {label}, {name}", "rows": len(texts), "seconds": round(seconds, 2),
            "x_ideal": round(seconds / ideal, 3) if ideal else None,
            "requests": seen["requests"], "429s": seen["rate_limited"],
            "pct_429": round(100 * seen["rate_limited"] / max(1, seen["requests"]), 2),
            "peak_in_flight": seen["max_in_flight"], "failed": failed}


def main(rows: int, engines: list[str]) -> dict[str, Any]:
    texts = [f"review {i}: " + "fine " * (i % 9) + "value" for i in range(rows)]
    load_before = os.getloadavg()[0]
    out = []
    for label in engines:
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
