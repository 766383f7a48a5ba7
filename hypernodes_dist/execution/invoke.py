"""Calling one node: sync or async functions, generators, streaming objects, output unpacking.

This is the only place that knows how a node function is called, so the local scheduler,
the batch executor and every engine's workers share it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import CoroutineType
from typing import Any

from hypernodes_dist.execution.batchcall import call_single
from hypernodes_dist.nodes import HyperNode

__all__ = ["join_chunks", "split_outputs", "call_node", "OutputShapeError"]


class OutputShapeError(ValueError):
    """A multi-output node returned something that does not unpack into its outputs."""


def join_chunks(chunks: list[Any], empty: Callable[[], Any] = list) -> Any:
    """Join streamed chunks: str -> ``"".join``, bytes -> ``b"".join``, dict -> merged, else
    list. No chunks give ``empty()``: the empty value of the stream's kind (``node.empty``)."""
    if not chunks:
        return empty()
    first = chunks[0]
    if isinstance(first, str):
        return "".join(chunks)
    if isinstance(first, (bytes, bytearray)):
        return b"".join(chunks)
    if isinstance(first, dict):
        merged: dict[Any, Any] = {}
        for c in chunks:
            merged.update(c)
        return merged
    return list(chunks)


def split_outputs(node: HyperNode, value: Any) -> tuple[Any, ...]:
    """The node's return value as one value per output name."""
    outputs = node.outputs
    if len(outputs) == 1:
        return (value,)
    if not outputs:
        return ()
    if not isinstance(value, (tuple, list)) or len(value) != len(outputs):
        got = f"{len(value)} values" if isinstance(value, (tuple, list)) else type(value).__name__
        raise OutputShapeError(
            f"node {node.name!r} declares outputs {outputs} but returned {got}; "
            f"return a tuple of {len(outputs)}"
        )
    return tuple(value)


ChunkSink = Callable[[Any, int], Any]


async def call_node(node: HyperNode, kwargs: dict[str, Any], on_chunk: ChunkSink | None) -> Any:
    """Call ``node`` with ``kwargs`` and return its value (streams joined).

    Sync functions are called directly (this coroutine then never suspends, so a sync graph
    can be driven without an event loop); async functions are awaited. ``on_chunk`` receives
    each streamed chunk with its index; it may return an awaitable.
    """
    if node.batch_size is not None:  # one item as one-item lists
        return await call_single(node, kwargs)
    result = node.func(**kwargs)  # type: ignore[misc]  # a called node has a func (only interrupts have none)
    if type(result) is CoroutineType or (inspect.isawaitable(result)
                                         and not inspect.isasyncgen(result)):
        result = await result
    if not node.streaming:
        return result
    return await _drain(result, on_chunk, node.empty)


async def _drain(stream: Any, on_chunk: ChunkSink | None, empty: Callable[[], Any]) -> Any:
    chunks: list[Any] = []
    if hasattr(stream, "__aiter__"):
        async for chunk in stream:
            await _deliver(on_chunk, chunk, len(chunks))
            chunks.append(chunk)
    elif hasattr(stream, "__iter__") and not isinstance(stream, (str, bytes, dict)):
        for chunk in stream:
            await _deliver(on_chunk, chunk, len(chunks))
            chunks.append(chunk)
    else:
        return stream  # streaming=True on a plain value: nothing to stream
    return join_chunks(chunks, empty)


async def _deliver(on_chunk: ChunkSink | None, chunk: Any, index: int) -> None:
    if on_chunk is None:
        return
    maybe = on_chunk(chunk, index)
    if inspect.isawaitable(maybe):
        await maybe
