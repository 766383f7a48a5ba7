"""A budget that stops spending, then a rerun that pays only for the rest (README: Paid APIs).

Starts a local OpenAI-compatible API on 127.0.0.1 (``hypernodes_bench.llm_server``; no
network) that limits tokens per window (429 with ``retry-after`` past it). Classifies 300
reviews with the real ``openai`` client, pricing each call by its tokens with ``meter``,
under ``budget={"cost": ...}`` worth about a third of the job: the map stops starting calls
there and writes what it finished. A second map with a larger budget into the same directory
computes only the rows the first did not write.

    python examples/budget.py [--rows 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import openai

from hypernodes_bench.llm_server import LLMServer
from hypernodes_dist import DiskCache, Graph, meter, node, resource

PRICE = 0.15e-6 * 1000  # dollars per token (an exaggerated price, so the numbers read well)


@resource(not_in_key=("base_url",))  # another port, same answers: a rerun resumes
def llm(base_url: str):
    yield openai.AsyncOpenAI(base_url=base_url, api_key="local", max_retries=0)


@node(output_name="label", retries=5, retry_on=openai.RateLimitError, concurrency=16,
      rate_limit={"tokens": "20000/10s"})
async def classify(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="local", messages=[{"role": "user", "content": text}], max_tokens=3)
    meter(tokens=r.usage.total_tokens, cost=r.usage.total_tokens * PRICE)
    return r.choices[0].message.content


def main(rows: int, out: Path) -> None:
    texts = [f"review {i}: " + "solid value " * (i % 5) for i in range(rows)]
    with LLMServer(latency=(0.005, 0.015), tpm=25_000, window_seconds=10) as server:
        graph = Graph([llm, classify], cache=DiskCache(out / "cache"))
        inputs = {"text": texts, "base_url": server.base_url}
        first = graph.map(inputs, map_over="text", into=str(out / "labels"),
                          budget={"cost": 0.2}, on_error="collect")
        print(f"first map:  {first.rows} rows written, {first.unfinished} left by the budget; "
              f"spent {first.usage['classify']['cost']:.3f} $ "
              f"({first.usage['classify']['calls']} calls)")
        rest = graph.map(inputs, map_over="text", into=str(out / "labels"),
                         budget={"cost": 5.0})
        print(f"second map: {rest.rows} rows in all, {rest.unfinished} left; spent "
              f"{rest.usage['classify']['cost']:.3f} $ more "
              f"({rest.usage['classify']['calls']} calls)")
        print(f"requests at the server: {server.stats()['requests']}, "
              f"refused for rate: {server.stats()['rate_limited']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="hn-budget-"))
    try:
        main(args.rows, folder)
    finally:
        if args.out is None:
            shutil.rmtree(folder, ignore_errors=True)
