"""Nodes of the progress conformance tests, at module level so worker processes import
them: each row waits for the loopback LLM server (its answers take ~50 ms), through the
real ``openai`` client (async, two calls in flight machine- or cluster-wide; it takes the
``usage_graphs.llm`` resource) or ``httpx`` (sync, one call after another in each batch)."""

from __future__ import annotations

import httpx

from hypernodes_dist import meter, node


@node(output_name="label", concurrency=2)
async def ask(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content


@node(output_name="label")
def ask_sync(text: str, base_url: str) -> str:
    r = httpx.post(f"{base_url}/chat/completions", timeout=10.0, json={
        "model": "loopback", "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    meter(tokens=r.json()["usage"]["total_tokens"])
    return r.json()["choices"][0]["message"]["content"]
