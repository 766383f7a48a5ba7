"""A recording client looks a call up from the options the client builds its request from:
the request it records is the one the client would send (digest over the canonical form of
the bytes it sends, as read at the HTTP layer), and an answered call still comes back as the
client's own type or its own error. Real ``openai``/``anthropic`` clients; nothing is sent,
but to the loopback fake provider at the end (a node's rate turns)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import anthropic
import openai
import pytest

from hypernodes_dist import DiskCache, Graph, node, resource
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
from hypernodes_dist.run.batchmap import POLL_ENV

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
    if http_layer:  # the client's own request, read where it is sent
        del copy._build_request
        for resource in (copy.messages,) if hasattr(copy, "messages") else (
                copy.chat.completions,):
            del resource.create  # the fast path's (fastcalls.py): the SDK's own again
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


# -- a recorded or answered call takes no network turn; a call sent online does --------------
@resource
def paced_client(base_url: str):
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10.0)


def _ask(text: str, paced_client) -> str:
    r = paced_client.chat.completions.create(model="gpt-4o-mini",
                                             messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


class _Throttles:
    def __init__(self) -> None:
        self.waits: list[str] = []

    def on_policy(self, event) -> None:
        if event.kind == "throttle":
            self.waits.append(event.reason)


@pytest.mark.parametrize("online_after", [None, 0.3])
def test_only_a_call_sent_online_takes_a_rate_turn(batch_fake, tmp_path, monkeypatch,
                                                   online_after):
    """``rate_limit`` is the provider's online limit: a call recorded for a batch or answered
    by one never reaches the network and waits for no turn; ``online_after``'s calls do."""
    monkeypatch.setenv(POLL_ENV, "0.05")
    options = {} if online_after is None else {"online_after": online_after}
    paced = node(output_name="label", batch_api=True, rate_limit="1/s", **options)(_ask)
    seen = _Throttles()
    texts = [f"paced {i}" for i in range(8)]
    if online_after is not None:
        batch_fake.configure(delay=60.0)  # nothing answered in time: every line goes online
    graph = Graph([paced_client, paced], cache=DiskCache(tmp_path / "c"), callbacks=[seen])
    res = graph.map({"text": texts, "base_url": batch_fake.base_url}, map_over="text")
    assert not res.errors and res.pending == 0 and len(res.column("label")) == 8
    online = batch_fake.stats()["online_requests"]
    assert online == (0 if online_after is None else 8)
    assert bool(seen.waits) == bool(online)  # 8 online calls at 1/s wait for their turns
