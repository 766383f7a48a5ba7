"""A recording client looks a call up from the options the client builds its request from:
the request it records is the one the client would send (digest over the canonical form of
the bytes it sends, as read at the HTTP layer), and an answered call still comes back as the
client's own type or its own error. Real ``openai``/``anthropic`` clients; nothing is sent."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import anthropic
import openai
import pytest

from hypernodes_dist.batchapi.identity import canonical_body, request_digest
from hypernodes_dist.batchapi.recording import (
    Answer,
    BatchWait,
    UnbatchableCall,
    answered_scope,
    in_batch_api,
    recording_client,
)
from hypernodes_dist.batchapi.store import AnswerStore, RequestLog

URL = "http://127.0.0.1:9/v1"   # nothing listens: a call that went out would fail
MSGS = [{"role": "user", "content": "héllo"}]

# (keyword arguments of chat.completions.create, whether the options path takes it)
CHAT_CALLS = {
    "plain": ({"model": "m", "messages": MSGS, "max_tokens": 5}, True),
    "extra_body": ({"model": "m", "messages": MSGS, "extra_body": {"top_k": 3, "model": "x"}},
                   True),
    "tuple": ({"model": "m", "messages": tuple(MSGS), "max_tokens": 7}, True),
    # int keys sort apart from their strings, a datetime is the client's to encode: HTTP layer
    "int keys": ({"model": "m", "messages": MSGS, "extra_body": {"bias": {10: 1, 9: -1}}},
                 False),
    "datetime": ({"model": "m", "messages": MSGS,
                  "extra_body": {"at": dt.datetime(2026, 1, 2, 3, 4)}}, False),
}


def _clients(kind: str) -> Any:
    if kind == "openai-async":
        return openai.AsyncOpenAI(base_url=URL, api_key="x", max_retries=0)
    if kind == "anthropic":
        return anthropic.Anthropic(base_url=URL.removesuffix("/v1"), api_key="x",
                                   max_retries=0)
    return openai.OpenAI(base_url=URL, api_key="x", max_retries=0)


def _call(client: Any, kwargs: dict[str, Any]) -> Any:
    if isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        result = client.messages.create(**{"max_tokens": 8, **kwargs})
    else:
        result = client.chat.completions.create(**kwargs)
    return asyncio.run(result) if asyncio.iscoroutine(result) else result


def _recorded(client: Any, kwargs: dict[str, Any], tmp: Any, http_layer: bool) -> Any:
    """What a recording copy of ``client`` records for one call (read at the HTTP layer
    only, when ``http_layer``), and whether the options path took it."""
    seen: list[tuple[str, Any]] = []
    copy = recording_client(client, AnswerStore(tmp), lambda e, b: seen.append((e, b)))
    took = "_build_request" in vars(copy)
    if http_layer:
        del copy._build_request
    with pytest.raises(BatchWait):
        _call(copy, kwargs)
    [(endpoint, body)] = seen
    return endpoint, canonical_body(body), took


@pytest.mark.parametrize("kind", ["openai-sync", "openai-async", "anthropic"])
@pytest.mark.parametrize("case", list(CHAT_CALLS))
def test_a_call_records_the_request_the_client_sends(kind, case, tmp_path):
    kwargs, fast = CHAT_CALLS[case]
    client = _clients(kind)
    endpoint, canonical, took = _recorded(client, kwargs, tmp_path / "a", False)
    sent = _recorded(client, kwargs, tmp_path / "b", True)
    assert took and (endpoint, canonical) == sent[:2]
    assert endpoint in ("/v1/chat/completions", "/v1/messages")
    if case == "extra_body":
        assert json.loads(canonical)["top_k"] == 3 and json.loads(canonical)["model"] == "x"
    assert fast or case in ("int keys", "datetime")


def test_an_answered_call_is_the_clients_own_type_or_error(tmp_path):
    client = openai.OpenAI(base_url=URL, api_key="x", max_retries=0)
    answers, log = AnswerStore(tmp_path), RequestLog(tmp_path)
    copy = recording_client(client, answers, log.record)
    ok = {"model": "m", "messages": MSGS}
    bad = {"model": "m", "messages": [{"role": "user", "content": "bad"}]}
    for kwargs in (ok, bad):
        with pytest.raises(BatchWait):
            _call(copy, kwargs)
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": "fine"}}]}
    error = {"error": {"message": "no such model", "type": "invalid_request_error"}}
    endpoint = "/v1/chat/completions"
    answers.put("b1", [(request_digest(endpoint, ok), Answer(200, completion)),
                       (request_digest(endpoint, bad), Answer(400, error))])
    with answered_scope():
        got = _call(copy, ok)
        assert isinstance(got, openai.types.chat.ChatCompletion) and in_batch_api()
    assert got.choices[0].message.content == "fine"
    with pytest.raises(openai.BadRequestError, match="no such model"):
        _call(copy, bad)
    with pytest.raises(UnbatchableCall, match="with_raw_response"):
        copy.chat.completions.with_raw_response.create(**ok)
