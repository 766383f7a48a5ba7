"""Nodes of the Batch API view tests (module level: worker processes import them): a batch
node asking two models, so a map makes two provider batches (one model a file), pricing
each call at its rate as the README shows (``in_batch_api()``: the batch rate)."""

from __future__ import annotations

from hypernodes_dist import in_batch_api, meter, node

from .batch_api_graphs import oa_sync

ONLINE_PRICE = 2e-6  # per token
__all__ = ["oa_sync", "two_models", "untyped", "ONLINE_PRICE"]


@node(output_name="label", batch_api=True)
def two_models(text: str, oa_sync) -> str:
    model = "gpt-4o" if text.endswith("!") else "gpt-4o-mini"
    r = oa_sync.chat.completions.create(model=model,
                                        messages=[{"role": "user", "content": text}])
    price = ONLINE_PRICE / 2 if in_batch_api() else ONLINE_PRICE
    meter(tokens=r.usage.total_tokens, cost=r.usage.total_tokens * price)
    return r.choices[0].message.content


@node(output_name="label", batch_api=True)
def untyped(text: str, oa_sync):  # no return annotation: a dataset map's first rows type it
    r = oa_sync.chat.completions.create(model="gpt-4o-mini",
                                        messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content
