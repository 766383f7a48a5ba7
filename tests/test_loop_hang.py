"""Issue 34's map that never returned: (1) an engine maps and runs a graph whose node gets
an ``AsyncOpenAI`` client from a ``@resource``, then closes; (2) in the same process a
notebook cell (``asyncio.run``) maps that graph twice and awaits ``arun``; (3) a map of a
node using a module-level ``AsyncOpenAI`` client. The client torn down in (1) was collected
under the cell's loop, and its finalizer closed its connections from the main thread with
the process loop's non-threadsafe ``call_soon``, after its sockets had been freed: it
unregistered the numbers of newer connections, whose answers the loop never saw. Each case
runs in a subprocess with a timeout, so a regression fails instead of hanging the suite.
Real ``openai`` clients against the session's loopback server (its URL on the command line:
one server for the three cases)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = '''
import asyncio, gc, sys
import openai
from hypernodes_bench.llm_server import label_of
from hypernodes_dist import Graph, node, resource
from hypernodes_dist.engines import GraphEngine

CASE, BASE = sys.argv[1:3]
client = openai.AsyncOpenAI(base_url=BASE, api_key="loopback", max_retries=0, timeout=60)


@resource
def llm():
    yield openai.AsyncOpenAI(base_url=BASE, api_key="loopback", max_retries=0, timeout=60)


@node(output_name="label", concurrency=64)
async def classify(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


@node(output_name="label")
async def classify_global(text: str) -> str:
    r = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


def engine():
    if CASE == "dask-threads":
        from hypernodes_dist.engines import DaskEngine
        return DaskEngine(scheduler="threads", num_workers=2)
    if CASE == "daft":
        from hypernodes_dist.engines import DaftEngine
        return DaftEngine()
    return None


texts = [f"row {i}" for i in range(40)]
want = [label_of(t) for t in texts]
eng = GraphEngine()
graph = Graph([llm, classify], engine=eng)
for _ in range(2):
    assert [r["label"] for r in graph.map({"text": texts}, map_over="text")] == want
assert graph.run({"text": "x"})["label"] == label_of("x")
eng.close()

cell_graph = Graph([llm, classify], engine=engine())


async def cell():
    gc.collect()  # the cell's allocations collect (1)'s client under the cell's loop: before
    outs = [cell_graph.map({"text": texts}, map_over="text") for _ in range(2)]
    gc.collect()  # the maps' new connections (old code: ~1 run in 2 lost arun's answer)
    last = await cell_graph.arun({"text": "y"})
    return outs, last


outs, last = asyncio.run(cell())
assert all([r["label"] for r in out] == want for out in outs)
assert last["label"] == label_of("y")
out = Graph([classify_global]).map({"text": texts}, map_over="text")
assert [r["label"] for r in out] == want
print("done")
'''


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["local", "dask-threads", "daft"])
def test_engine_close_then_a_notebook_cell_then_a_module_level_client_map(tmp_path, case,
                                                                          llm_server):
    script = tmp_path / "steps.py"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run([sys.executable, str(script), case, llm_server.base_url],
                              capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the three steps ({case}) did not finish in 180 s:\n{exc.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("done")
