"""Nodes of the usage, budget, token-limit and Retry-After conformance tests, at module level
so worker processes import them. Executions are recorded as files in ``log_dir`` (worker
processes share no memory with the driver); the paid nodes call the loopback LLM server with
the real ``openai`` and ``httpx`` clients, held by resources."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import httpx
import openai

from hypernodes_dist import meter, node, resource


def record(log_dir: str, name: str, x: object) -> None:
    Path(log_dir, f"{name}-{x}-{os.getpid()}-{uuid.uuid4().hex[:6]}").touch()


def executions(log_dir: str, name: str) -> list[int]:
    """The items (sorted, repeated when run twice) whose ``name`` call ran."""
    return sorted(int(f.name.split("-")[1]) for f in Path(log_dir).iterdir()
                  if f.name.startswith(f"{name}-"))


@node(output_name="y")
def priced(x: int, log_dir: str) -> int:
    """Sync, metered: x tokens, x/100 dollars."""
    record(log_dir, "priced", x)
    meter(tokens=x, cost=x / 100)
    return x * 2


@node(output_name="z")
async def summed(y: int) -> int:
    """Async, metered: one token."""
    meter(tokens=1)
    await asyncio.sleep(0)
    return y + 1


@node(output_name="w")
def free(z: int) -> int:
    return z - 1


@node(output_name="paid", concurrency=2)
async def paid(x: int, log_dir: str) -> int:
    """One dollar a call, at most two calls in flight (machine- or cluster-wide)."""
    await asyncio.sleep(0.01)
    record(log_dir, "paid", x)
    meter(cost=1.0)
    return x


HOLD = 60.0  # seconds a held call waits for its release at most


@node(output_name="kept")
async def paid_beside_a_failure(x: int, log_dir: str) -> int:
    """A dollar a call; item 6 fails while the file ``fail`` exists in ``log_dir``. Item 7
    is held until item 6 has failed: on an engine running items 0-6 and 7-11 at once, it
    still runs when item 6's partition raises. Each call leaves ``started``, then
    ``finished`` (paid), ``failed`` or ``cancelled``."""
    record(log_dir, "started", x)
    try:
        if x == 6 and Path(log_dir, "fail").exists():
            Path(log_dir, "failing").touch()
            record(log_dir, "failed", x)
            raise ValueError("item 6 fails")
        deadline = time.monotonic() + HOLD
        while x == 7 and not Path(log_dir, "failing").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # it ends well after item 6 failed, as a slow call would
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        record(log_dir, "cancelled", x)
        raise
    record(log_dir, "finished", x)
    meter(cost=1.0)
    return x


# ------------------------------------------------------------------ real clients


@resource
def llm(base_url: str):
    return openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0, timeout=10.0)


@node(output_name="label", retries=6, retry_on=openai.RateLimitError, concurrency=4,
      rate_limit={"tokens": "200/1s"})
async def tokens_limited(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=5)
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content


@node(output_name="label", retries=12, retry_on=openai.RateLimitError, concurrency=4)
async def told_to_wait(text: str, llm) -> str:
    """No back-off of its own: only the server's Retry-After spaces its retries."""
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


@resource
async def web(base_url: str):
    client = httpx.AsyncClient(base_url=base_url, timeout=10.0)
    yield client
    await client.aclose()


@node(output_name="label", retries=12, retry_on=httpx.HTTPStatusError, concurrency=4)
async def told_to_wait_httpx(text: str, web) -> str:
    r = await web.post("/chat/completions", json={
        "model": "loopback", "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


@node(output_name="label", concurrency=4)
async def paid_label(text: str, llm) -> str:
    """One paid request per row (a dollar each), at most four in flight."""
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    meter(cost=1.0)
    return r.choices[0].message.content
