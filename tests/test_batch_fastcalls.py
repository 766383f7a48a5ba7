"""The record pass's fast path (``batchapi/fastcalls.py``): a known ``create`` of a recording
copy computes the body from its arguments; the request recorded is, digest for digest, the
one the SDK itself would send, an answered call is still the client's own type or error,
calls the fast path does not know behave as before, and its self-check switches it off
where it would disagree. Real ``openai`` (sync and async) and ``anthropic`` clients against
the loopback fake provider."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import anthropic
import openai
import pydantic
import pytest

from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist import DiskCache, Graph, node, resource
from hypernodes_dist.batchapi import AnthropicBatches, OpenAIBatches, fastcalls
from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.identity import canonical_body, request_digest
from hypernodes_dist.batchapi.recording import BatchWait, UnbatchableCall, recording_client
from hypernodes_dist.batchapi.store import AnswerStore, RequestLog
from hypernodes_dist.run.batchmap import POLL_ENV
from tests.batchrig import drive

MSGS = [{"role": "user", "content": "héllo"}]
CHAT, EMB, RESP = ("chat", "completions"), ("embeddings",), ("responses",)
MSG = ("messages",)
# (resource path, keyword arguments): each is recorded as the SDK itself sends it
CALLS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "chat": (CHAT, {"model": "gpt-4o-mini", "messages": MSGS}),
    "chat extra_body": (CHAT, {"model": "m", "messages": MSGS, "max_tokens": 9,
                               "extra_body": {"top_k": 3, "model": "x"}}),
    "chat omitted": (CHAT, {"model": "m", "messages": MSGS, "temperature": openai.omit,
                            "top_p": openai.NOT_GIVEN, "stream": False, "seed": None}),
    "embeddings": (EMB, {"model": "emb", "input": ["a b", "c"]}),
    "embeddings float": (EMB, {"model": "emb", "input": "a", "encoding_format": "float"}),
    "embeddings omitted": (EMB, {"model": "emb", "input": "a", "encoding_format": openai.omit}),
    "embeddings extra_body": (EMB, {"model": "emb", "input": "a",
                                    "extra_body": {"encoding_format": "float", "user": "u"}}),
    "responses": (RESP, {"model": "gpt-4o-mini", "input": "is it good", "max_output_tokens": 9}),
    "messages": (MSG, {"model": "claude-haiku", "max_tokens": 16, "messages": MSGS}),
    "messages extra_body": (MSG, {"model": "claude-haiku", "max_tokens": 16, "messages": MSGS,
                                  "system": "be brief", "extra_body": {"top_k": 2}}),
}
URL = "http://127.0.0.1:9"   # nothing listens: a call that went out would fail


def _client(kind: str, base: str = URL + "/v1") -> Any:
    if kind == "anthropic":
        return anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="x",
                                   max_retries=0)
    cls = openai.AsyncOpenAI if kind == "openai-async" else openai.OpenAI
    return cls(base_url=base, api_key="x", max_retries=0)


def _resource(client: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        client = getattr(client, name)
    return client


def _run(out: Any) -> Any:
    return asyncio.run(_await(out)) if asyncio.iscoroutine(out) else out


async def _await(aw: Any) -> Any:
    return await aw


def _sdk_only(copy: Any) -> Any:
    """The recording copy with the SDK's own create methods and request building again:
    the request is read where it is sent (the HTTP layer)."""
    del copy._build_request
    for known in fastcalls.KNOWN:
        resource = copy
        for name in known.path:
            resource = getattr(resource, name, None)
        if resource is not None:
            vars(resource).pop("create", None)
    return copy


def _recorded(kind: str, path: tuple[str, ...], kwargs: dict[str, Any], tmp: Path,
              sdk: bool = False) -> tuple[str, bytes]:
    seen: list[tuple[str, bytes]] = []
    copy = recording_client(_client(kind), AnswerStore(tmp),
                            lambda e, b: seen.append((e, canonical_body(b))))
    if sdk:
        _sdk_only(copy)
    with pytest.raises(BatchWait):
        _run(_resource(copy, path).create(**kwargs))
    [found] = seen
    return found


def _kinds(case: str) -> list[str]:
    return ["anthropic"] if CALLS[case][0] == MSG else ["openai-sync", "openai-async"]


@pytest.mark.parametrize("case,kind", [(c, k) for c in CALLS for k in _kinds(c)])
def test_the_fast_path_records_what_the_sdk_sends(case, kind, tmp_path):
    path, kwargs = CALLS[case]
    # a resource whose module is not imported yet takes its fast path from its second call
    # (test_a_resource_not_imported_yet_gets_its_fast_path_at_its_first_call)
    importlib.import_module(next(k.module for k in fastcalls.KNOWN if k.path == path))
    fast = _recorded(kind, path, kwargs, tmp_path / "fast")
    assert fast == _recorded(kind, path, kwargs, tmp_path / "sdk", sdk=True)
    client = _client(kind)
    resource = _resource(recording_client(client, AnswerStore(tmp_path), print), path)
    assert fastcalls.took_fast_path(type(client), type(resource))
    body = json.loads(fast[1])
    if path == EMB:  # openai asks for base64 unless told otherwise
        told = "float" in case or "extra_body" in case
        assert body["encoding_format"] == ("float" if told else "base64")
    if case == "chat extra_body":
        assert body["model"] == "x" and body["top_k"] == 3
    if case == "chat omitted":
        assert "temperature" not in body and "top_p" not in body and body["seed"] is None


def test_calls_the_fast_path_leaves_to_the_sdk_behave_as_before(tmp_path):
    """extra_headers (recorded as without them), with_raw_response and stream=True (the
    unbatchable calls' error), an unknown or missing argument, a model class as
    response_format (the SDK's TypeError)."""
    path, kwargs = CALLS["chat"]
    plain = _recorded("openai-sync", path, kwargs, tmp_path / "a")
    headed = {**kwargs, "extra_headers": {"x-trace": "1"}}
    assert _recorded("openai-sync", path, headed, tmp_path / "b") == plain
    copy = recording_client(_client("openai-sync"), AnswerStore(tmp_path / "c"), print)
    with pytest.raises(UnbatchableCall, match="with_raw_response"):
        copy.chat.completions.with_raw_response.create(**kwargs)
    with pytest.raises(UnbatchableCall, match="stream=True"):
        copy.chat.completions.create(**kwargs, stream=True)
    with pytest.raises(UnbatchableCall, match="stream=True"):
        copy.chat.completions.create(**kwargs, extra_body={"stream": True})
    assert not fastcalls.switched_off(openai.OpenAI, openai.resources.chat.Completions)
    with pytest.raises(TypeError):
        copy.chat.completions.create(**kwargs, no_such_param=1)
    with pytest.raises(TypeError):
        copy.embeddings.create(model="emb")  # input missing
    with pytest.raises(TypeError, match="parse"):  # openai's own check of response_format
        copy.chat.completions.create(**kwargs, response_format=_Label)


def test_one_call_site_given_then_omitting_values_records_what_the_sdk_sends(tmp_path):
    """The argument names of a call site are read once (per method and names): the same
    names with a value given, omitted, None, then an extra_headers given (the SDK's way),
    an extra_body given, each recorded as the SDK sends it (one copy for the fast calls)."""
    seen: list[tuple[str, bytes]] = []
    copy = recording_client(_client("openai-sync"), AnswerStore(tmp_path / "fast"),
                            lambda e, b: seen.append((e, canonical_body(b))))
    values = [(0.5, None, None), (openai.omit, None, None), (None, openai.NOT_GIVEN, None),
              (0.5, {"x-trace": "1"}, None), (openai.omit, None, {"seed": 4})]
    for i, (temperature, headers, extra) in enumerate(values):
        kwargs = {"model": "m", "messages": MSGS, "temperature": temperature,
                  "extra_headers": headers, "extra_body": extra}
        with pytest.raises(BatchWait):
            copy.chat.completions.create(**kwargs)
        assert seen[-1] == _recorded("openai-sync", CHAT, kwargs, tmp_path / f"sdk{i}",
                                     sdk=True), (temperature, headers, extra)
    assert len(seen) == len(values)


def test_the_logged_digest_is_the_requests_own(tmp_path):
    """The digest a lookup computed goes to the request log with the body (not hashed
    again): the log's line names the request by its own digest."""
    log = RequestLog(tmp_path)
    copy = recording_client(_client("openai-sync"), AnswerStore(tmp_path), log.record)
    with pytest.raises(BatchWait) as wait:
        copy.chat.completions.create(model="m", messages=MSGS)
    [req] = log.requests()
    assert req.digest == wait.value.digest == request_digest(req.endpoint, json.loads(
        json.dumps(dict(req.body))))


def test_anthropic_refuses_a_long_non_streamed_call_before_recording_it(tmp_path):
    seen: list[Any] = []
    copy = recording_client(_client("anthropic"), AnswerStore(tmp_path), seen.append)
    with pytest.raises(ValueError, match="Streaming is required"):
        copy.messages.create(model="claude-haiku", max_tokens=10**6, messages=MSGS)
    assert not seen


def _wrong(known: fastcalls.Known, **change: Any) -> tuple[fastcalls.Known, ...]:
    return tuple(k._replace(**change) if k is known else k for k in fastcalls.KNOWN)


@pytest.fixture
def fresh_checks(monkeypatch):
    """The fast path's verdicts of this process set aside for the test."""
    monkeypatch.setattr(fastcalls, "_VERDICTS", {})
    monkeypatch.setattr(fastcalls, "_OFF", set())
    monkeypatch.setattr(fastcalls, "_MARKS", {})


def test_the_self_check_switches_a_wrong_fast_path_off(fresh_checks, monkeypatch, tmp_path):
    """A fast path that would get a param wrong (here: the embeddings default) is caught by
    its first call's check: recorded as the SDK sends it, and off for the method after."""
    [emb] = [k for k in fastcalls.KNOWN if k.path == EMB]
    monkeypatch.setattr(fastcalls, "KNOWN", _wrong(emb, defaults={"encoding_format": "float"}))
    sdk = _recorded("openai-sync", *CALLS["embeddings"], tmp_path / "sdk", sdk=True)
    assert json.loads(sdk[1])["encoding_format"] == "base64"
    for i, kind in enumerate(["openai-sync", "openai-sync", "openai-async"]):
        assert _recorded(kind, *CALLS["embeddings"], tmp_path / str(i)) == sdk
    assert fastcalls.switched_off(openai.OpenAI, openai.resources.Embeddings)
    assert not fastcalls.took_fast_path(openai.OpenAI, openai.resources.Embeddings)
    assert fastcalls.switched_off(openai.AsyncOpenAI, openai.resources.AsyncEmbeddings)
    assert not fastcalls.switched_off(openai.OpenAI, openai.resources.chat.Completions)


class _Label(pydantic.BaseModel):
    text: str


class _Params(TypedDict, total=False):
    model: Annotated[str, openai._utils.PropertyInfo(alias="model")]
    messages: list[Annotated[dict[str, Any], openai._utils.PropertyInfo(format="custom")]]


def test_a_param_rewritten_below_its_top_level_never_takes_the_fast_path(fresh_checks,
                                                                        monkeypatch,
                                                                        tmp_path):
    """``messages`` typed (here) with a ``PropertyInfo`` format inside: the SDK's way;
    ``model`` aliased at its top level: the first call's check proves it."""
    [chat] = [k for k in fastcalls.KNOWN if k.path == CHAT]
    monkeypatch.setattr(fastcalls, "KNOWN", _wrong(chat, params=f"{__name__}:_Params"))
    path, kwargs = CALLS["chat"]
    assert _recorded("openai-sync", path, kwargs, tmp_path / "a") == _recorded(
        "openai-sync", path, kwargs, tmp_path / "b", sdk=True)
    assert not fastcalls.took_fast_path(openai.OpenAI, openai.resources.chat.Completions)
    assert not fastcalls.switched_off(openai.OpenAI, openai.resources.chat.Completions)
    monkeypatch.setattr(fastcalls, "_MARKS", {(f"{__name__}:_Params", "messages"): 0})
    _recorded("openai-sync", path, kwargs, tmp_path / "c")
    assert fastcalls.took_fast_path(openai.OpenAI, openai.resources.chat.Completions)


@pytest.mark.parametrize("kind", ["openai-sync", "openai-async", "anthropic"])
def test_answers_equal_the_online_path_and_each_request_is_sent_once(batch_fake, tmp_path,
                                                                     kind):
    fake: BatchServer = batch_fake
    base = fake.base_url
    folder = tmp_path / "b"
    log, answers = RequestLog(folder), AnswerStore(folder)
    copy = recording_client(_client(kind, base), answers, log.record)
    cases = [c for c in CALLS if kind in _kinds(c) and "float" not in c]
    for case in cases * 2:  # twice: identical requests are one line
        path, kwargs = CALLS[case]
        with pytest.raises(BatchWait):
            _run(_resource(copy, path).create(**kwargs))
    if kind == "anthropic":
        transport: Any = AnthropicBatches(_client(kind, base), "m")
    else:
        transport = OpenAIBatches(_client("openai-sync", base), "m")
    drive(BatchDriver(transport, str(folder)), log)
    counts = fake.counts()
    assert len(counts) == len(cases) and all(c == [1, 1] for c in counts.values())
    online = _client("openai-sync" if kind != "anthropic" else kind, base)
    for case in cases:
        path, kwargs = CALLS[case]
        got = _run(_resource(copy, path).create(**kwargs))
        assert type(got).__module__.startswith(kind.split("-")[0])
        assert got == _resource(online, path).create(**kwargs), case


# -- through graph.map: a batch_api node's embeddings and extra_body calls ------------------
@resource
def emb_client(base_url: str):
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10.0)


def _embed(text: str, emb_client) -> list[float]:
    r = emb_client.embeddings.create(model="emb", input=text, extra_body={"user": "u1"})
    return [round(x, 6) for x in r.data[0].embedding]


def test_a_batch_api_map_answers_as_online_and_sends_each_request_once(batch_fake, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv(POLL_ENV, "0.05")
    texts = [f"text {i % 5}" for i in range(12)]
    batched = node(output_name="v", batch_api=True)(_embed)
    graph = Graph([emb_client, batched], cache=DiskCache(tmp_path / "c"))
    res = graph.map({"text": texts, "base_url": batch_fake.base_url}, map_over="text")
    assert res.pending == 0 and not res.errors
    counts = batch_fake.counts()
    assert len(counts) == 5 and all(c == [1, 1] for c in counts.values())
    online = Graph([emb_client, node(output_name="v")(_embed)]).map(
        {"text": texts, "base_url": batch_fake.base_url}, map_over="text")
    assert res.column("v") == online.column("v") and len(res.column("v")[0]) == 8


_LATE = """
import sys
import openai
from hypernodes_dist.batchapi.recording import BatchWait, recording_client
from hypernodes_dist.batchapi.store import AnswerStore
seen = []
copy = recording_client(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x"),
                        AnswerStore(sys.argv[1]), lambda e, b: seen.append(e))
print("imported", "openai.resources.responses.responses" in sys.modules)
for _ in range(2):
    try:
        copy.responses.create(model="m", input="hi")
    except BatchWait:
        print("fast", "create" in vars(copy.responses))
print(seen)
"""


def test_a_resource_not_imported_yet_gets_its_fast_path_at_its_first_call(tmp_path):
    """The recording copy does not make ``responses`` (its import is costly): the first
    call records as the SDK sends it, the fast create is installed then, for the next."""
    out = subprocess.run([sys.executable, "-c", _LATE, str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    assert out[:4] == ["imported False", "fast True", "fast True",
                       "['/v1/responses', '/v1/responses']"]
