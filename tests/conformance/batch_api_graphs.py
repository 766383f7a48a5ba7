"""Nodes of the Batch API conformance tests, at module level so worker processes import
them: the real ``openai`` (async and sync) and ``anthropic`` clients, held by resources,
against the loopback fake provider (``hypernodes_bench.batch_server``). Each batch node has
an online twin (the same code, ``batch_api=False``) whose answers the batch path must equal.
"""

from __future__ import annotations

import openai

from hypernodes_dist import branch, in_batch_api, meter, node, resource


@resource
def oa_async(base_url: str):
    return openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10.0)


@resource
def oa_sync(base_url: str):
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10.0)


@resource
def claude(anthropic_url: str):
    # imported where the client is built: ``anthropic`` costs ~1.4 CPU s to import, paid
    # otherwise by every process importing these nodes (the openai jobs of the kill tests,
    # their Dask worker processes, every xdist worker)
    import anthropic
    return anthropic.Anthropic(base_url=anthropic_url, api_key="x", max_retries=0,
                               timeout=10.0)


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def ask_async(text: str, client) -> str:
    r = await client.chat.completions.create(model="gpt-4o-mini", messages=_messages(text))
    meter(tokens=r.usage.total_tokens, batched=float(in_batch_api()))
    return r.choices[0].message.content


def ask_sync(text: str, client) -> str:
    r = client.chat.completions.create(model="gpt-4o-mini", messages=_messages(text))
    meter(tokens=r.usage.total_tokens, batched=float(in_batch_api()))
    return r.choices[0].message.content


def ask_claude(text: str, client) -> str:
    r = client.messages.create(model="claude-haiku", max_tokens=16, messages=_messages(text))
    meter(tokens=r.usage.input_tokens + r.usage.output_tokens, batched=float(in_batch_api()))
    return r.content[0].text


@node(output_name="label", batch_api=True)
async def label_async(text: str, oa_async) -> str:
    return await ask_async(text, oa_async)


@node(output_name="label", batch_api=True)
def label_sync(text: str, oa_sync) -> str:
    return ask_sync(text, oa_sync)


@node(output_name="label", batch_api=True)
def label_claude(text: str, claude) -> str:
    return ask_claude(text, claude)


@node(output_name="label", batch_api=True)
def guarded(text: str, oa_sync) -> str:
    """The node's own try/except sees the client's own error type."""
    try:
        return ask_sync(text, oa_sync)
    except openai.BadRequestError as exc:
        return f"refused {exc.status_code}"


@node(output_name="label")
async def online_async(text: str, oa_async) -> str:
    return await ask_async(text, oa_async)


@node(output_name="label")
def online_sync(text: str, oa_sync) -> str:
    return ask_sync(text, oa_sync)


@node(output_name="label")
def online_claude(text: str, claude) -> str:
    return ask_claude(text, claude)


@node(output_name="shout")
def shout(label: str) -> str:
    """A node after the batch node: runs once its item's answer is there."""
    return label.upper()


# kind -> (batch graph, online graph, the URL input it reads)
KINDS = {
    "openai-async": ([oa_async, label_async], [oa_async, online_async], "base_url"),
    "openai-sync": ([oa_sync, label_sync], [oa_sync, online_sync], "base_url"),
    "anthropic": ([claude, label_claude], [claude, online_claude], "anthropic_url"),
}


@node(output_name="label", batch_api=True, retries=1)
def label_retried(text: str, oa_sync) -> str:
    """Expired, cancelled and failed lines go again (each retry counts against retries)."""
    return ask_sync(text, oa_sync)


@node(output_name="label", batch_api=True, online_after=0.3)
def label_soon(text: str, oa_sync) -> str:
    """A batch still running 0.3 s after its submission: the rest goes online."""
    return ask_sync(text, oa_sync)


@node(output_name="why", batch_api=True)
def explain(text: str, label: str, oa_sync) -> str:
    """A second batch call, made once the first has its answer."""
    return ask_sync(f"why is {text!r} {label}?", oa_sync)


@node(output_name="label", batch_api=True)
def label_untyped(text: str, oa_sync):
    """No return annotation: a dataset map's first rows tell the output's type."""
    return ask_sync(text, oa_sync)


# a cycle (the reactive scheduler's per-item path): each revision waits for its own batch
@node(output_name="draft")
def first_draft(topic: str) -> str:
    return f"{topic} v0"


@branch(when_true="publish", when_false="rewrite")
def long_enough(draft: str) -> bool:
    return draft.count("+") >= 2


@node(output_name="final")
def publish(draft: str) -> str:
    return draft.upper()


@node(output_name="draft", batch_api=True)
def rewrite(draft: str, oa_sync) -> str:
    return draft + "+" + ask_sync(draft, oa_sync)


CYCLE = [oa_sync, first_draft, long_enough, publish, rewrite]
