"""Run by test_ray_cluster.py: the driver of a job on a 2-node Ray cluster (``argv``: the
cluster address, the LLM server's base URL). Prints one JSON line: which nodes ran calls,
and the server's counts after a map with ``concurrency=4`` and after one with a budget."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

import ray

from hypernodes_daft import DaftEngine
from hypernodes_dist import Graph, meter, node
from tests.conformance.usage_graphs import llm

CONCURRENCY = 4
BUDGET = 20


async def _chat(llm, text: str) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    return r.choices[0].message.content


@node(output_name=("label", "where"), concurrency=CONCURRENCY)
async def limited(text: str, llm) -> tuple[str, str]:
    return await _chat(llm, text), ray.get_runtime_context().get_node_id()


@node(output_name="label", concurrency=CONCURRENCY)
async def paid(text: str, llm) -> str:
    label = await _chat(llm, text)
    meter(cost=1.0)
    return label


def _stats(base_url: str) -> dict[str, int]:
    with urllib.request.urlopen(base_url.replace("/v1", "/stats"), timeout=10) as r:
        return json.loads(r.read())


def _reset(base_url: str) -> None:
    req = urllib.request.Request(base_url.replace("/v1", "/reset"), method="POST")
    urllib.request.urlopen(req, timeout=10).close()


def main(address: str, base_url: str) -> None:
    engine = DaftEngine(runner="ray", address=address, batch_size=4)
    engine._ensure_runner()  # connects to the cluster
    deadline = time.monotonic() + 120
    while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    texts = [f"t{i}" for i in range(64)]
    res = Graph([llm, limited], engine=engine).map(
        {"text": texts, "base_url": base_url}, map_over="text")
    conc = _stats(base_url)
    _reset(base_url)
    spent = Graph([llm, paid], engine=engine).map(
        {"text": texts, "base_url": base_url}, map_over="text", budget={"cost": BUDGET},
        on_error="collect")
    budget = _stats(base_url)
    out = {"nodes": len({r["where"] for r in res}), "rows": len(res),
           "max_in_flight": conc["max_in_flight"], "requests": conc["requests"],
           "paid_requests": budget["requests"], "paid_rows": sum(r.status == "complete"
                                                                  for r in spent)}
    engine.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
