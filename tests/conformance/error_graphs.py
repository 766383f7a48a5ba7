"""Nodes of the error-type conformance tests, at module level so worker processes import
them: the real ``openai`` and ``httpx`` clients, held by resources, get errors from the
loopback server (400 for too many embedding inputs, 404 for an unknown path)."""

from __future__ import annotations

import httpx
import openai

from hypernodes_dist import node, resource


@resource
def sync_llm(base_url: str):
    return openai.OpenAI(base_url=base_url, api_key="loopback", max_retries=0, timeout=10.0)


@node(output_name="vectors")
def embed(n: int, sync_llm) -> int:
    """``n`` inputs in one request: the server refuses more than 64 with HTTP 400."""
    return len(sync_llm.embeddings.create(model="loopback", input=["a"] * n).data)


@resource
async def web(base_url: str):
    client = httpx.AsyncClient(base_url=base_url, timeout=10.0)
    yield client
    await client.aclose()


@node(output_name="status")
async def fetch(path: str, web) -> int:
    """``raise_for_status`` of a path the server does not have: ``httpx.HTTPStatusError``."""
    r = await web.get(path)
    r.raise_for_status()
    return r.status_code
