"""What the fake batch provider answers to one request: the same on the online and batch paths.

Every answer is a deterministic function of the request (endpoint + body), so a request
answered by a batch equals the same request answered online, field for field (ids and
``created`` included). ``request_key`` names a request the way the server counts it.

Markers in a request's text choose its fate (on both paths unless said otherwise):
- ``[[status:400]]``: answered with that HTTP status and the provider's error body, always;
  ``[[status:500:2]]``: only the first 2 times the server receives the request, then answered.
- ``[[expire:1]]`` / ``[[cancel:1]]`` (batch path only): the line expires / is cancelled the
  first 1 time(s) it is submitted in a batch, then answered.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from typing import Any

from hypernodes_bench.llm_server import label_of

__all__ = ["request_key", "key_int", "canonical", "answer", "tokens", "marker_fate",
           "openai_error", "anthropic_error", "ANTHROPIC_ERROR_TYPES", "CREATED", "COMPACT"]

CREATED = 1_700_000_000
_MARKER = re.compile(rb"\[\[(status|expire|cancel):(\d+)(?::(\d+))?\]\]")
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                         402: "billing_error", 403: "permission_error", 404: "not_found_error",
                         413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                         504: "timeout_error", 529: "overloaded_error"}


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
COMPACT = json.JSONEncoder(separators=(",", ":"))


def canonical(body: Any) -> bytes:
    """The body as canonical JSON (sorted keys, no spaces)."""
    return _CANONICAL.encode(body).encode()


def key_int(endpoint: str, body: Any) -> int:
    """``request_key`` as a 64-bit int (what the server keys its counters by)."""
    h = hashlib.blake2b(endpoint.encode() + b"\n" + canonical(body), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def request_key(endpoint: str, body: Any) -> str:
    """A request's identity at the server: ``endpoint`` (``/v1/chat/completions``,
    ``/v1/messages``...) and the canonical body, as 16 hex digits."""
    return f"{key_int(endpoint, body):016x}"


def marker_fate(raw: bytes, seen: int, batch: bool) -> tuple[str, int] | None:
    """The fate a request's markers give its ``seen``-th reception (1 = first):
    ``("status", code)``, ``("expired", 0)``, ``("cancelled", 0)`` or None (answered)."""
    if b"[[" not in raw:
        return None
    for m in _MARKER.finditer(raw):
        kind, first, times = m.group(1).decode(), int(m.group(2)), m.group(3)
        if kind == "status" and (times is None or seen <= int(times)):
            return ("status", first)
        if batch and kind != "status" and seen <= first:
            return ("expired" if kind == "expire" else "cancelled", 0)
    return None


def _texts(value: Any) -> list[str]:
    """Every string inside a message content / input value (strings, blocks, lists)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        if "text" in value:
            return _texts(value["text"])
        return _texts(value.get("content", ""))
    return [] if value is None else [str(value)]


def _words(value: Any) -> int:
    return sum(len(t.split()) for t in _texts(value))


def _last_user(messages: Any) -> str:
    for m in reversed(messages if isinstance(messages, list) else [messages]):
        if not isinstance(m, dict) or m.get("role", "user") == "user":
            return " ".join(_texts(m))
    return ""


def tokens(endpoint: str, body: dict[str, Any]) -> tuple[int, int]:
    """(input tokens, output tokens) the server bills for a request."""
    if endpoint.endswith("/embeddings"):
        return _words(body.get("input", "")) or 1, 0
    if endpoint.endswith("/messages"):
        return _words(body.get("messages", [])) + _words(body.get("system", "")) + 4, 1
    if endpoint.endswith("/responses"):
        return _words(body.get("input", "")) + _words(body.get("instructions", "")) + 4, 1
    out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1)
    return _words(body.get("messages", [])) + 4, out


def answer(endpoint: str, body: dict[str, Any], key: str,
           billed: tuple[int, int] | None = None) -> dict[str, Any]:
    """The 2xx response body for a request (``key``: its ``request_key``; ``billed``: its
    ``tokens`` when known)."""
    tin, tout = billed or tokens(endpoint, body)
    model = body.get("model", "loopback")
    if endpoint.endswith("/embeddings"):
        return _embeddings(body.get("input", ""), model, tin, body.get("encoding_format"))
    if endpoint.endswith("/messages"):
        return {"id": f"msg_{key}", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": label_of(_last_user(body.get("messages")))}],
                "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": tin, "output_tokens": tout}}
    if endpoint.endswith("/responses"):
        return _response(body, model, key, tin, tout)
    return {"id": f"chatcmpl-{key}", "object": "chat.completion", "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "refusal": None,
                                     "content": label_of(_last_user(body.get("messages")))}}],
            "usage": {"prompt_tokens": tin, "completion_tokens": tout,
                      "total_tokens": tin + tout}}


def _embeddings(inputs: Any, model: str, tin: int, encoding: Any) -> dict[str, Any]:
    texts = inputs if isinstance(inputs, list) else [inputs]
    data = [{"object": "embedding", "index": i, "embedding": _vector(str(t), encoding)}
            for i, t in enumerate(texts)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tin, "total_tokens": tin}}


def _vector(text: str, encoding: Any) -> list[float] | str:
    """8 floats; as base64 of little-endian float32s when asked (what the ``openai``
    client asks for unless told otherwise, and decodes)."""
    floats = [b / 255.0 for b in hashlib.blake2b(text.encode(), digest_size=8).digest()]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode()
    return floats


def _response(body: dict[str, Any], model: str, key: str, tin: int, tout: int) -> dict[str, Any]:
    text = label_of(_last_user(body.get("input", "")))
    item = {"type": "message", "id": f"msg_{key}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": f"resp_{key}", "object": "response", "created_at": CREATED, "model": model,
            "status": "completed", "output": [item], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
            "usage": {"input_tokens": tin, "output_tokens": tout, "total_tokens": tin + tout,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def openai_error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body for an HTTP ``status``."""
    kind = ("rate_limit_error" if status == 429 else "server_error" if status >= 500
            else "invalid_request_error")
    if code is None and status == 429:
        code = "rate_limit_exceeded"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for an HTTP ``status``."""
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500
                                     else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
