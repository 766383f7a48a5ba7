"""Nodes of the progress conformance tests, at module level so worker processes import
them: each row waits for the loopback LLM server (its answers take ~50 ms), through the
real ``openai`` client (async, two calls in flight machine- or cluster-wide; it takes the
``llm`` resource below) or ``httpx`` (sync, one call after another in each batch).
The row named ``held`` first waits until the file ``until`` exists: the test's progress
callback creates it once it has heard half the rows done, so the map finishes only if
progress arrives while rows still run (no clock in the test).

``ask`` takes its own client resource, ``llm`` (not ``usage_graphs.llm``), so that no other
test's 429s can narrow its two places. Session 13's full runs saw this test's rows wait
behind its held row on Dask processes: the back-off was then keyed by the resource function
alone, the signal tests' 429s through ``usage_graphs.llm`` (another server) had left it at 1
of 2 places for 60 s, the held row took that one place and no other row could start until
it gave up (``pytest tests/conformance/test_signals.py tests/conformance/test_progress.py -k
"test_a_garbage and local and not memory and not parallel and not batch1 or
test_progress_events_arrive_while_rows_run and dask-processes" -p no:xdist`` failed 4 of 4
so). Limits are now keyed by the API a resource is built for (``resources/bind.py``,
``ApiLimits``): another server is another API."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import openai

from hypernodes_dist import meter, node, resource


@resource(version="progress-llm")
def llm(base_url: str):
    """The loopback client, an API of its own (see the module docstring)."""
    return openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0, timeout=10.0)


@node(output_name="label", concurrency=2)
async def ask(text: str, llm, held: str, until: str) -> str:
    while text == held and not os.path.exists(until):
        _give_up(text, until)
        await asyncio.sleep(0.02)
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content


@node(output_name="label")
def ask_sync(text: str, base_url: str, held: str, until: str) -> str:
    while text == held and not os.path.exists(until):
        _give_up(text, until)
        time.sleep(0.02)
    r = httpx.post(f"{base_url}/chat/completions", timeout=10.0, json={
        "model": "loopback", "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    meter(tokens=r.json()["usage"]["total_tokens"])
    return r.json()["choices"][0]["message"]["content"]


_HELD_SINCE: dict[str, float] = {}
# Half the rows are heard done within ~1-2 s even on a loaded machine (40-60 ms rows); the
# bound only turns a hang into a failure naming it.
HOLD_DEADLINE = 30.0


def _give_up(text: str, until: str) -> None:
    """Raise once the held row has waited ``HOLD_DEADLINE`` s (a generous bound: the test
    then fails with this message instead of hanging)."""
    since = _HELD_SINCE.setdefault(until, time.monotonic())
    if time.monotonic() - since > HOLD_DEADLINE:
        raise TimeoutError(
            f"row {text!r} waited {HOLD_DEADLINE:.0f} s for the driver to hear half the "
            f"rows done ({until} never created): progress did not arrive while rows ran")
