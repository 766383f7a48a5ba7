"""An LLM job through a provider's Batch API: half the price, each request sent once
(README: Provider Batch APIs).

Starts a local fake of OpenAI's Files + Batches API on 127.0.0.1
(``hypernodes_bench.batch_server``; no network; a batch answers after ``--delay`` seconds
at half the online price). Classifies reviews with the real ``openai`` client in a
``batch_api=True`` node whose code is the online code: the first map records the requests,
submits them in batch files and returns at once (``wait=False``, ``pending`` rows); the
second map, the same job again, waits for the answers and writes every row. Then it prints
what reached the provider and what the same job would have cost online.

    python examples/batch_api.py [--rows 2000] [--delay 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import openai
import pyarrow as pa

from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist import Graph, batch_status, in_batch_api, meter, node, resource

PRICE = 1e-6  # dollars per token online; a batch's answer costs half (the fake's prices)


@resource(not_in_key=("base_url",))  # another port, same answers: a rerun resumes
def llm(base_url: str):
    yield openai.AsyncOpenAI(base_url=base_url, api_key="local", max_retries=0)


@node(output_name="label", batch_api=True)
async def classify(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], max_tokens=3)
    price = PRICE / 2 if in_batch_api() else PRICE  # answered by a batch: the batch rate
    meter(tokens=r.usage.total_tokens, cost=r.usage.total_tokens * price)
    return r.choices[0].message.content


def main(rows: int, delay: float, out: Path) -> None:
    reviews = pa.table({"text": [f"review {i}: " + "solid value " * (i % 5)
                                 for i in range(rows)]})
    with BatchServer(delay=delay) as server:
        graph = Graph([llm, classify])
        inputs = {"base_url": server.base_url}
        first = graph.map(source=reviews, inputs=inputs, into=out / "labels", wait=False)
        print(f"first map:  {first.rows} rows written, {first.pending} waiting for a batch "
              "(the process could exit here)")
        for s in batch_status(out / "labels"):
            print(f"  {s.resource}: batches at the provider {s.running}")
        done = graph.map(source=reviews, inputs=inputs, into=out / "labels")
        used = done.usage["classify"]
        print(f"second map: {done.rows} rows in all, {done.pending} waiting, {done.failed} "
              f"failed; {used['batch_calls']:.0f} calls answered by a batch")
        stats = server.stats()
        print(f"at the provider: {stats['distinct']} distinct requests, each received "
              f"{stats['received_max']} time(s); {stats['batches']:.0f} batch(es), "
              f"{stats['online_requests']:.0f} online requests")
        print(f"cost: {stats['cost_batch']:.4f} $ by batch; the same tokens online: "
              f"{stats['tokens_batch'] * PRICE:.4f} $")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--delay", type=float, default=2.0,
                        help="seconds the fake provider takes to answer a batch")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HYPERNODES_BATCH_POLL", "0.2")  # poll the local fake often
    folder = args.out or Path(tempfile.mkdtemp(prefix="hn-batch-api-"))
    try:
        main(args.rows, args.delay, folder)
    finally:
        if args.out is None:
            shutil.rmtree(folder, ignore_errors=True)
