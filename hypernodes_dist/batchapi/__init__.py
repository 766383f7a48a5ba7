"""Provider Batch APIs: one ``BatchTransport`` per provider (``transport.py`` is the protocol).

``transport_for(client, map_id)`` picks the transport of a user's client, or raises
``UnsupportedClientError`` naming the supported clients and the protocol.
"""

from __future__ import annotations

from typing import Any

from hypernodes_dist.batchapi.anthropic_batches import AnthropicBatches
from hypernodes_dist.batchapi.openai_batches import OpenAIBatches
from hypernodes_dist.batchapi.transport import (
    BatchFile,
    BatchInfo,
    BatchNotFoundError,
    BatchTransport,
    LineResult,
    QueueLimitError,
    UnsupportedClientError,
)

__all__ = ["transport_for", "BatchTransport", "OpenAIBatches", "AnthropicBatches", "BatchFile",
           "BatchInfo", "LineResult", "BatchNotFoundError", "QueueLimitError",
           "UnsupportedClientError", "SUPPORTED"]

SUPPORTED = (OpenAIBatches, AnthropicBatches)


def transport_for(client: Any, map_id: str, where: str = "") -> BatchTransport:
    """The transport for ``client`` (``where``: who holds it, for the error message, e.g.
    "node 'classify', resource 'llm'")."""
    if isinstance(client, BatchTransport):
        return client
    for transport in SUPPORTED:
        if transport.supports(client):
            return transport(client, map_id)
    name = f"{type(client).__module__}.{type(client).__qualname__}"
    raise UnsupportedClientError(
        f"{where + ': ' if where else ''}{name} cannot go through a provider Batch API. "
        "Supported clients: openai.OpenAI and openai.AsyncOpenAI (OpenAI and OpenAI-compatible "
        "servers: Azure OpenAI, Together, Groq, vLLM; chat completions, embeddings, responses) "
        "and anthropic.Anthropic and anthropic.AsyncAnthropic (messages). Use one of them, "
        "set batch_api=False, or implement hypernodes_dist.batchapi.transport.BatchTransport "
        "for your provider.")
