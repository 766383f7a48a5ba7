"""Nodes of the provider-signal and ``on_budget`` conformance tests, at module level so worker
processes import them; they call the loopback LLM server with the real ``openai`` client
(``usage_graphs.llm``), whose markers make a message fail as a provider does."""

from __future__ import annotations

import openai

from hypernodes_dist import meter, node

from .usage_graphs import llm

__all__ = ["llm", "rate_retried", "any_retried", "window_limited", "chat"]


async def chat(llm, text: str) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    return r.choices[0].message.content


@node(output_name="label", retries=3, retry_on=openai.RateLimitError, backoff=0.01,
      concurrency=2, max_retry_after=60)
async def rate_retried(text: str, llm) -> str:
    """Retries rate-limit errors only; a Retry-After over 60 s is ignored."""
    return await chat(llm, text)


@node(output_name="label", retries=3, backoff=0.01)
async def any_retried(text: str, llm) -> str:
    """Retries every error (``retry_on=Exception``)."""
    return await chat(llm, text)


@node(output_name="label", concurrency=1, rate_limit={"tokens": "20/1s"})
async def window_limited(text: str, llm) -> str:
    """20 tokens a second: a call of more than 20 tokens can never start."""
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}], max_tokens=1)
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content
