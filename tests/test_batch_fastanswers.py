"""The replay pass's fast answer (``batchapi/fastreplies.py``): a known ``create`` answered 2xx
by a batch returns the SDK's own value (type, fields, ``_request_id``...) built without the
SDK's request and response; other answers take the SDK's way (its own errors, warnings); the
self-check switches a wrong fast answer off. Real ``openai`` (sync and async) and
``anthropic`` clients against the loopback fake provider."""

from __future__ import annotations

import asyncio
import importlib
import warnings
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist.batchapi import AnthropicBatches, OpenAIBatches, fastcalls
from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.fastreplies import same
from hypernodes_dist.batchapi.identity import request_digest
from hypernodes_dist.batchapi.recording import (
    Answer,
    BatchWait,
    answered_scope,
    in_batch_api,
    recording_client,
)
from hypernodes_dist.batchapi.store import AnswerStore, RequestLog
from tests.batchrig import drive
from tests.test_batch_fastcalls import CALLS, CHAT, EMB, MSG, MSGS, _resource, _run
from tests.test_batch_fastcalls import _client as _sync_or_openai

ANSWERED = {**CALLS, "embeddings base64": (EMB, {"model": "emb", "input": ["x", "y z"],
                                                 "encoding_format": "base64"}),
            "responses extra_body": (CALLS["responses"][0],
                                     {**CALLS["responses"][1], "extra_body": {"user": "u"}})}


def _kinds(case: str) -> list[str]:
    return (["anthropic", "anthropic-async"] if ANSWERED[case][0] == MSG
            else ["openai-sync", "openai-async"])


def _client(kind: str, base: str = "http://127.0.0.1:9/v1") -> Any:
    if kind == "anthropic-async":
        return anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key="x",
                                        max_retries=0)
    return _sync_or_openai(kind, base)


@pytest.fixture
def fresh_checks(monkeypatch):
    """The fast path's and fast answer's verdicts of this process set aside for the test."""
    for name, empty in (("_VERDICTS", {}), ("_OFF", set()), ("_REPLIED", set()),
                        ("_REPLY_OFF", set())):
        monkeypatch.setattr(fastcalls, name, empty)


def _answered(fake: BatchServer, kind: str, folder: Path, cases: list[str]) -> AnswerStore:
    """The cases' calls recorded, batched at the fake and answered: the answer store."""
    log, answers = RequestLog(folder), AnswerStore(folder)
    copy = recording_client(_client(kind, fake.base_url), answers, log.record)
    for case in cases:
        path, kwargs = ANSWERED[case]
        with pytest.raises(BatchWait):
            _run(_resource(copy, path).create(**kwargs))
    if kind.startswith("anthropic"):
        transport: Any = AnthropicBatches(_client("anthropic", fake.base_url), "m")
    else:
        transport = OpenAIBatches(_client("openai-sync", fake.base_url), "m")
    drive(BatchDriver(transport, str(folder)), log)
    return answers


def _sdk_way(kind: str, fake: BatchServer, answers: AnswerStore) -> Any:
    """A recording copy whose known create methods are the SDK's own (answers through the
    SDK's request and response)."""
    copy = recording_client(_client(kind, fake.base_url), answers, print)
    for known in fastcalls.KNOWN:
        if hasattr(copy, known.path[0]):
            vars(_resource(copy, known.path)).pop("create", None)
    return copy


class _Counting:
    """The copy's request building, counted (the fast answer builds no request)."""

    def __init__(self, build: Any) -> None:
        self.build, self.calls = build, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.build(*args, **kwargs)


def _scoped(create: Any, kwargs: dict[str, Any]) -> tuple[Any, bool]:
    """``create(**kwargs)`` in one run of a node's code: its value and ``in_batch_api()``."""
    with answered_scope():
        out = create(**kwargs)
        if not asyncio.iscoroutine(out):
            return out, in_batch_api()

    async def awaited() -> tuple[Any, bool]:
        with answered_scope():
            return await out, in_batch_api()
    return asyncio.run(awaited())


def _users_view(got: Any, path: tuple[str, ...]) -> Any:
    """What a user reads of an answer."""
    if path == CHAT:
        return got.id, got.choices[0].message.content, got.usage, got.model
    if path == EMB:
        return [d.embedding for d in got.data], got.usage
    if path == MSG:
        return got.id, got.content[0].text, got.usage, got.stop_reason
    return got.id, got.output_text, got.usage


@pytest.mark.parametrize("kind", ["openai-sync", "openai-async", "anthropic",
                                  "anthropic-async"])
def test_answered_calls_are_the_sdks_own_values_built_without_a_request(
        batch_fake, tmp_path, kind, fresh_checks):
    fake: BatchServer = batch_fake
    cases = [c for c in ANSWERED if kind in _kinds(c)]
    for known in fastcalls.KNOWN:  # made at once (a module not imported: at its first call)
        importlib.import_module(known.module)
    answers = _answered(fake, kind, tmp_path / "b", cases)
    copy = recording_client(_client(kind, fake.base_url), answers, print)
    online = _client("anthropic" if kind.startswith("anthropic") else "openai-sync",
                     fake.base_url)
    sdk = _sdk_way(kind, fake, answers)
    for case in cases:
        path, kwargs = ANSWERED[case]
        checked = _run(_resource(copy, path).create(**kwargs))  # the first: the check's
        counting = copy._build_request = _Counting(copy._build_request)
        got, flagged = _scoped(_resource(copy, path).create, kwargs)
        assert flagged, case  # in_batch_api() in the node's code
        assert counting.calls == 0, case  # no request built: the fast answer
        del copy._build_request
        want = _run(_resource(sdk, path).create(**kwargs))
        assert type(got) is type(want) is type(checked), case
        model = anthropic.BaseModel if kind.startswith("anthropic") else openai.BaseModel
        assert same(got, want, model) and same(checked, want, model), case
        assert got.model_dump(warnings=False) == want.model_dump(warnings=False) and got == want, case
        assert got._request_id == want._request_id, case
        if kind.startswith("anthropic"):
            assert got._workspace_id == want._workspace_id
        assert _users_view(got, path) == _users_view(_run(_resource(online, path).create(
            **kwargs)), path), case
        if path == EMB:  # decoded from base64 unless a format was asked for
            asked = any(w in case for w in ("float", "extra_body", "base64"))
            vectors = [d.embedding for d in got.data]
            assert all(isinstance(v, str) for v in vectors) == ("base64" in case)
            assert asked or all(isinstance(x, float) for v in vectors for x in v)
        client_class, resource = type(copy), type(_resource(copy, path))
        assert fastcalls.took_fast_answer(client_class, resource), case
        assert not fastcalls.answers_off(client_class, resource), case


def test_the_self_check_switches_a_wrong_fast_answer_off(batch_fake, tmp_path, fresh_checks,
                                                        monkeypatch):
    """A fast answer that would miss the SDK's post-parser (the embeddings' base64 decoded):
    its first answer's check returns the SDK's value and switches it off for the method."""
    answers = _answered(batch_fake, "openai-sync", tmp_path / "b", ["embeddings"])
    [emb] = [k for k in fastcalls.KNOWN if k.path == EMB]
    wrong = emb._replace(reply=emb.reply._replace(post=None))
    monkeypatch.setattr(fastcalls, "KNOWN", tuple(wrong if k is emb else k
                                                  for k in fastcalls.KNOWN))
    copy = recording_client(_client("openai-sync", batch_fake.base_url), answers, print)
    _, kwargs = CALLS["embeddings"]
    want = _sdk_way("openai-sync", batch_fake, answers).embeddings.create(**kwargs)
    for _ in range(2):
        got = copy.embeddings.create(**kwargs)
        assert got == want and isinstance(got.data[0].embedding[0], float)
    assert fastcalls.answers_off(openai.OpenAI, openai.resources.Embeddings)
    assert not fastcalls.took_fast_answer(openai.OpenAI, openai.resources.Embeddings)
    chat = copy.chat.completions
    assert not fastcalls.answers_off(openai.OpenAI, type(chat))


def test_answers_the_fast_answer_leaves_to_the_sdk(batch_fake, tmp_path, fresh_checks):
    """A 400 answer: the client's own error; a deprecated anthropic model: the SDK's
    warning, each time."""
    folder = tmp_path / "s"
    answers = AnswerStore(folder)
    path, kwargs = CALLS["chat"]
    body = {"error": {"message": "bad model", "type": "invalid_request_error"}}
    answers.put("t", [(request_digest("/v1/chat/completions", {"model": kwargs["model"],
                                                               "messages": MSGS}),
                       Answer(400, body))])
    copy = recording_client(_client("openai-sync"), AnswerStore(folder), print)
    for _ in range(2):
        with pytest.raises(openai.BadRequestError, match="bad model"):
            copy.chat.completions.create(**kwargs)
    old = next(iter(anthropic.resources.messages.messages.DEPRECATED_MODELS))
    answers = _answered(batch_fake, "anthropic", tmp_path / "a", [])
    call = {"model": old, "max_tokens": 16, "messages": MSGS}
    log = RequestLog(tmp_path / "a")
    copy = recording_client(_client("anthropic", batch_fake.base_url), answers, log.record)
    with pytest.raises(BatchWait), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the record pass: the SDK's warning or not
        copy.messages.create(**call)
    drive(BatchDriver(AnthropicBatches(_client("anthropic", batch_fake.base_url), "m"),
                      str(tmp_path / "a")), log)
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="deprecated"):
            assert copy.messages.create(**call).content
    assert not fastcalls.took_fast_answer(anthropic.Anthropic, anthropic.resources.Messages)
    assert not fastcalls.took_fast_answer(openai.OpenAI, openai.resources.chat.Completions)
