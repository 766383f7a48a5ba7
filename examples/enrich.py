"""Dataset enrichment: the README's ``make demo``.

Writes a product catalogue as a Parquet file, starts a local OpenAI-compatible API on
127.0.0.1 (``hypernodes_bench.llm_server``: 10-30 ms answers, 5% of requests fail with HTTP
500; no network), then maps the catalogue -- one row per item -- through a graph of
several nodes, one of them an LLM call per row made with a real HTTP client
(``httpx.AsyncClient``, one connection pool per worker process, held by a ``@resource``),
with the disk cache on. The map reads the Parquet file in parts and writes its results as a
Parquet dataset (``into=``): the rows never sit in one list in memory. Prints a results
table, the errors table and a throughput/cache summary.

Run it twice: the second run finds every part already written and computes nothing (its
local API listens on another port: the endpoint is ``not_in_key``); a run killed halfway
computes only the parts that have no output file yet.

    python examples/enrich.py [--rows N] [--engine local|dask|daft] [--cache DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from hypernodes_bench.llm_server import LLMServer
from hypernodes_dist import DiskCache, Graph, branch, node, resource
from hypernodes_dist.events import NodeEndEvent, PolicyEvent
from hypernodes_dist.policies import exponential

ADJECTIVES = ["compact", "rugged", "wireless", "smart", "eco", "premium", "classic", "portable"]
NOUNS = ["speaker", "backpack", "lamp", "kettle", "drone", "keyboard", "blender", "tent"]


def write_catalogue(path: Path, rows: int, seed: int = 7) -> None:
    """The input: ``rows`` products (sku, title, price) in one Parquet file."""
    rng = random.Random(seed)
    titles = [f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.randint(1, 9)}"
              for _ in range(rows)]
    prices = [round(rng.uniform(5, 500), 2) for _ in range(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"sku": [f"SKU-{i:06d}" for i in range(rows)], "title": titles,
                             "price": prices}), path, row_group_size=50_000)


@node(output_name="clean_title")
def normalize(title: str) -> str:
    return " ".join(title.split()).title()


# The endpoint does not change the answers: it stays out of the cache keys and of the
# output's identity, so a rerun against a server on another port resumes the same map.
@resource(not_in_key=("base_url",))
async def api(base_url: str):
    """One HTTP client (and connection pool) per worker process, closed at the end."""
    client = httpx.AsyncClient(base_url=base_url, timeout=5.0)
    yield client
    await client.aclose()


# The provider answers in 10-30 ms and fails 5% of requests: each call is retried up to 3
# times with a short exponential backoff; at most 64 calls are in flight, across all
# processes of the machine (and a whole Dask distributed cluster), not per worker.
@node(output_name=("sentiment", "tokens"), retries=3, backoff=exponential(base=0.05),
      retry_on=httpx.HTTPError, timeout=5.0, concurrency=64)
async def classify(clean_title: str, api) -> tuple:
    """An LLM call per row through the API client the resource holds."""
    r = await api.post("/chat/completions", json={
        "model": "loopback", "messages": [{"role": "user", "content": clean_title}]})
    r.raise_for_status()
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["total_tokens"]


@branch(when_true="premium_copy", when_false="standard_copy")
def is_premium(price: float) -> bool:
    return price >= 200


@node(output_name="blurb")
def premium_copy(clean_title: str, sentiment: str) -> str:
    return f"{clean_title}: a premium pick ({sentiment} reviews)."


@node(output_name="blurb")
def standard_copy(clean_title: str, sentiment: str) -> str:
    return f"{clean_title} — great value ({sentiment} reviews)."


GRAPH_NODES = [api, normalize, classify, is_premium, premium_copy, standard_copy]


class Counter:
    """Counts node executions, cache hits and policy actions as the engine reports them."""

    def __init__(self) -> None:
        self.executed = 0
        self.cached = 0
        self.policy = {"retry": 0, "timeout": 0, "throttle": 0}
        self.throttled_s = 0.0

    def on_node_end(self, event: NodeEndEvent) -> None:
        if event.cached:
            self.cached += 1
        else:
            self.executed += 1

    def on_policy(self, event: PolicyEvent) -> None:
        self.policy[event.kind] += 1
        if event.kind == "throttle":
            self.throttled_s += event.wait


def make_engine(name: str):
    if name == "local":
        from hypernodes_dist import GraphEngine

        return GraphEngine(batch_size=500)
    from hypernodes_dist.engines import get_engine

    return get_engine(name)()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--engine", default="local", choices=["local", "dask", "daft"])
    parser.add_argument("--cache", default=".cache/enrich")
    parser.add_argument("--out", default="examples/out", help="directory for input and output")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    out = Path(args.out)
    catalogue = out / f"catalogue-{args.rows}.parquet"
    if not catalogue.exists():
        write_catalogue(catalogue, args.rows)
    counter = Counter()
    graph = Graph(GRAPH_NODES, engine=make_engine(args.engine), cache=DiskCache(args.cache),
                  callbacks=[counter])
    with LLMServer(latency=(0.010, 0.030), fail_rate=0.05) as server:
        t0 = time.perf_counter()
        result = graph.map(
            source=str(catalogue),               # each row is one item; inputs read its columns
            inputs={"base_url": server.base_url},  # broadcast: what the `api` resource reads
            keep=["sku", "price"],               # source columns copied into every output row
            into=out / f"enriched-{args.rows}",  # Parquet files, written part by part
            select=["clean_title", "sentiment", "tokens", "blurb"],
            on_error="collect",
            progress=not args.no_progress,
        )
        elapsed = time.perf_counter() - t0
        requests = server.stats()["requests"]
        graph.engine.close()  # tears the resource down (closes the client) while the API is up

    head = result.dataset().head(8).to_pylist()
    print(f"\n{'sku':<11} {'title':<24} {'price':>8} {'sentiment':<9} {'tok':>4}  blurb")
    for row in head:
        if row["_hn_error"] is None:
            print(f"{row['sku']:<11} {row['clean_title']:<24} {row['price']:>8.2f} "
                  f"{row['sentiment']:<9} {row['tokens']:>4}  {row['blurb']}")
        else:
            print(f"{row['sku']:<11} failed: {row['_hn_error']}")
    total = counter.executed + counter.cached
    print(f"\nengine={args.engine} rows={result.rows} ok={result.rows - result.failed} "
          f"failed={result.failed} -> {result.path}")
    print(f"time={elapsed:.2f}s throughput={result.rows / elapsed:,.0f} rows/s "
          f"node executions={counter.executed} cache hits={counter.cached} "
          f"({100 * counter.cached / max(total, 1):.0f}%)")
    p = counter.policy
    print(f"classify policy: retries={p['retry']} timeouts={p['timeout']} "
          f"concurrency waits={p['throttle']}; requests at the API: {requests}")
    for row in result.errors.slice(0, 3).to_pylist():
        print(f"  row {row['_hn_row']} failed in {row['node']}: {row['error']}")


if __name__ == "__main__":
    main()
