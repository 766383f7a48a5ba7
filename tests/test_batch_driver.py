"""The batch path below the executor: the recording client (real ``openai`` sync/async and
``anthropic`` clients), the request log, ledger and answer store, and the driver's
submit/poll/download cycle, against the loopback fake provider."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from hypernodes_bench.batch_answers import request_key
from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist.batchapi import AnthropicBatches, OpenAIBatches
from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.recording import (
    BatchWait,
    BudgetRefusal,
    UnbatchableCall,
    answered_scope,
    in_batch_api,
    recording_client,
)
from hypernodes_dist.batchapi.store import AnswerStore, Ledger, RequestLog
from hypernodes_dist.errors import BudgetExceededError
from tests.batch_kill_child import main as drive_to_the_end
from tests.batchrig import drive

CHAT = "/v1/chat/completions"


@pytest.fixture
def fake(batch_fake):
    return batch_fake


def _openai(server: BatchServer, kind: str) -> Any:
    cls = openai.AsyncOpenAI if kind == "async" else openai.OpenAI
    return cls(base_url=server.base_url, api_key="x", max_retries=0)


def _recording(fake: BatchServer, tmp_path: Path) -> tuple[Path, RequestLog, AnswerStore, Any]:
    """A map's batch folder, its request log and answers, a recording sync openai client."""
    folder = tmp_path / "b"
    log, answers = RequestLog(folder), AnswerStore(folder)
    return folder, log, answers, recording_client(_openai(fake, "sync"), answers, log.record)


def _chat(client: Any, text: str) -> Any:
    """The node's code: one chat call (awaited for an async client)."""
    out = client.chat.completions.create(model="gpt-4o-mini",
                                         messages=[{"role": "user", "content": text}])
    return asyncio.run(_await(out)) if asyncio.iscoroutine(out) else out


async def _await(aw: Any) -> Any:
    return await aw


def _node(client: Any, text: str) -> Any:
    """Run the node's code: (response, in_batch_api()), or the BatchWait it raised."""
    async def node() -> Any:
        r = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": text}])
        return r, in_batch_api()
    try:
        with answered_scope():
            if isinstance(client, openai.AsyncOpenAI):
                return asyncio.run(node())
            return _chat(client, text), in_batch_api()
    except BatchWait as wait:
        return wait


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_openai_answers_equal_online_and_each_request_once(fake, tmp_path, kind):
    folder = tmp_path / "b"
    log, answers = RequestLog(folder), AnswerStore(folder)
    online = _openai(fake, "sync")
    client = recording_client(_openai(fake, kind), answers, log.record)
    texts = ["good film", "bad film", "good film", "[[status:400]] nope"]
    assert all(isinstance(_node(client, t), BatchWait) for t in texts)
    assert fake.stats()["online_requests"] == 0   # nothing left the recording client
    transport = OpenAIBatches(_openai(fake, "async" if kind == "async" else "sync"), "map-1")
    drive(BatchDriver(transport, str(folder)), log)
    fake.reset()
    for text in ["good film", "bad film"]:
        got, batched = _node(client, text)
        assert batched and got == _chat(online, text)
        assert type(got) is openai.types.chat.ChatCompletion
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, "[[status:400]] nope")
    assert err.value.status_code == 400
    counts = fake.counts()
    assert all(received == 1 for received, _ in counts.values())  # only the online calls


def test_each_distinct_request_reaches_the_provider_once(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    texts = [f"text {i % 7}" for i in range(30)]
    for t in texts:
        _node(client, t)
    drive(BatchDriver(OpenAIBatches(_openai(fake, "sync"), "m"), str(folder)), log)
    body = lambda t: {"messages": [{"role": "user", "content": t}], "model": "gpt-4o-mini"}  # noqa: E731
    counts = fake.counts()
    assert {request_key(CHAT, body(t)) for t in texts} == set(counts)
    assert all(c == [1, 1] for c in counts.values())


def test_expired_cancelled_and_failed_lines_go_again_completed_never(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    texts = ["plain", "[[expire:1]] late", "[[cancel:1]] stopped", "[[status:500:1]] flaky"]
    for t in texts:
        _node(client, t)
    fake.configure(fail_batches=1)
    driver = BatchDriver(OpenAIBatches(_openai(fake, "sync"), "m"), str(folder), attempts=4)
    drive(driver, log)
    for t in texts:
        got, batched = _node(client, t)
        assert batched and got.choices[0].message.content
    received = {k: v[0] for k, v in fake.counts().items()}
    plain = request_key(CHAT, {"messages": [{"role": "user", "content": "plain"}],
                               "model": "gpt-4o-mini"})
    assert received[plain] == 1   # the failed batch never reached its lines; the rest: once
    assert sorted(received.values()) == [1, 2, 2, 2]
    assert fake.stats()["batches_failed"] == 1


def test_retries_exhausted_fail_the_item_with_the_clients_error(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    _node(client, "[[status:500:5]] down")
    drive(BatchDriver(OpenAIBatches(_openai(fake, "sync"), "m"), str(folder), attempts=2), log)
    with pytest.raises(openai.InternalServerError):
        _chat(client, "[[status:500:5]] down")
    assert list(fake.counts().values()) == [[2, 0]]


def test_queue_limit_refusal_is_waited_out(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    for i in range(3):
        _node(client, f"q {i}")
    fake.configure(queue_refuse=True, queue_tokens=1)
    driver = BatchDriver(OpenAIBatches(_openai(fake, "sync"), "m"), str(folder))
    requests = log.new()
    asyncio.run(driver.submit(requests))
    assert driver.counts.queue_refusals == 1
    fake.configure(queue_refuse=False, queue_tokens=None)
    asyncio.run(driver.submit(requests))
    drive(driver, log)
    assert all(_node(client, f"q {i}")[1] for i in range(3))


def test_anthropic_messages_replay_as_message(fake, tmp_path):
    folder = tmp_path / "b"
    log, answers = RequestLog(folder), AnswerStore(folder)
    base = anthropic.Anthropic(base_url=fake.anthropic_base_url, api_key="x", max_retries=0)
    client = recording_client(base, answers, log.record)

    def call(text: str) -> Any:
        return client.messages.create(model="claude-haiku", max_tokens=16,
                                      messages=[{"role": "user", "content": text}])
    for text in ["hello", "[[status:400]] bad"]:
        with pytest.raises(BatchWait):
            call(text)
    drive(BatchDriver(AnthropicBatches(base, "m"), str(folder)), log)
    got = call("hello")
    assert type(got) is anthropic.types.Message
    assert got == base.messages.create(model="claude-haiku", max_tokens=16,
                                       messages=[{"role": "user", "content": "hello"}])
    with pytest.raises(anthropic.BadRequestError):
        call("[[status:400]] bad")


def test_calls_no_batch_carries_are_refused_by_name(fake, tmp_path):
    answers, log = AnswerStore(tmp_path), RequestLog(tmp_path)
    client = recording_client(_openai(fake, "sync"), answers, log.record)
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(UnbatchableCall, match="stream=True"):
        client.chat.completions.create(model="m", messages=msgs, stream=True)
    with pytest.raises(UnbatchableCall, match="with_raw_response"):
        client.chat.completions.with_raw_response.create(model="m", messages=msgs)
    with pytest.raises(UnbatchableCall, match="images/generations"):
        client.images.generate(prompt="a cat")
    assert "batch_api=False" in str(UnbatchableCall("POST /v1/x").error("node 'f'"))
    assert log.new() == []


def test_a_rerun_adopts_a_batch_created_but_not_recorded(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    _node(client, "lost answer")
    transport = OpenAIBatches(_openai(fake, "sync"), "m")
    driver = BatchDriver(transport, str(folder))
    asyncio.run(driver.submit(log.new()))
    lines = Ledger(folder).path.read_text().splitlines()
    Ledger(folder).path.write_text("\n".join(lines[:-1]) + "\n")  # the crash: no "created"
    again = BatchDriver(transport, str(folder))
    assert asyncio.run(again.recover()) == 0
    drive(again, RequestLog(folder))
    assert _node(client, "lost answer")[1]
    assert fake.stats()["batches"] == 1


def test_online_after_keeps_finished_lines_and_sends_the_rest_online(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    texts = [f"slow {i}" for i in range(8)]
    for t in texts:
        _node(client, t)
    fake.configure(delay=3.0)
    driver = BatchDriver(OpenAIBatches(_openai(fake, "sync"), "m"), str(folder),
                         online_after=0.5)
    drive(driver, log, rounds=200)
    assert driver.counts.lines_online > 0
    results = [_node(client, t) for t in texts]
    online = [t for t, (_, batched) in zip(texts, results) if not batched]
    assert len(online) == driver.counts.lines_online
    assert fake.stats()["online_requests"] == len(online)
    # each request answered once; a cancelled line was received by its batch, then online
    assert sorted(fake.counts().values()) == sorted(
        [[1, 1]] * (len(texts) - len(online)) + [[2, 1]] * len(online))


def test_a_rerun_collects_and_submits_nothing_twice(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    for i in range(5):
        _node(client, f"later {i}")
    fake.configure(delay=0.5)
    transport = OpenAIBatches(_openai(fake, "sync"), "m")
    requests = log.new()
    asyncio.run(BatchDriver(transport, str(folder)).submit(requests))  # wait=False returns
    again = BatchDriver(transport, str(folder))                        # the rerun
    assert list(again.to_submit(requests)) == []
    assert asyncio.run(again.recover()) == 0
    drive(again, RequestLog(folder))
    assert all(_node(client, f"later {i}")[1] for i in range(5))
    assert fake.stats()["batches"] == 1
    assert all(c == [1, 1] for c in fake.counts().values())


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("kill_at", ["upload", "create", "poll", "download"])
def test_sigkill_then_rerun_sends_each_request_once(fake, tmp_path, provider, kill_at):
    folder = tmp_path / "b"
    log, answers = RequestLog(folder), AnswerStore(folder)
    if provider == "openai":
        base: Any = _openai(fake, "sync")
        url = fake.base_url

        def call(c: Any, t: str) -> Any:
            return c.chat.completions.create(model="gpt-4o-mini",
                                             messages=[{"role": "user", "content": t}])
    else:
        base = anthropic.Anthropic(base_url=fake.anthropic_base_url, api_key="x", max_retries=0)
        url = fake.anthropic_base_url

        def call(c: Any, t: str) -> Any:
            return c.messages.create(model="claude-haiku", max_tokens=16,
                                     messages=[{"role": "user", "content": t}])
    client = recording_client(base, answers, log.record)
    texts = [f"kill {kill_at} {i}" for i in range(6)]
    for t in texts:
        with pytest.raises(BatchWait):
            call(client, t)
    child = [sys.executable, str(Path(__file__).with_name("batch_kill_child.py")), provider,
             url, str(folder)]
    killed = subprocess.run([*child, kill_at], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    # the rerun: a new driver on the folder, in this process (which never drove it; a child
    # would import the provider's client again: ~1-2 CPU s each)
    asyncio.run(drive_to_the_end(provider, url, str(folder), ""))
    for t in texts:
        assert call(client, t) == call(base, t)
    counts = fake.counts()
    assert len(counts) == len(texts)
    assert all(c == [2, 2] for c in counts.values())  # once by a batch, once online above
    assert fake.stats()["batches"] == 1


def test_a_batch_the_provider_no_longer_knows_is_resubmitted_only_when_asked(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    _node(client, "gone")
    transport = OpenAIBatches(_openai(fake, "sync"), "m")
    requests = log.new()
    asyncio.run(BatchDriver(transport, str(folder)).submit(requests))
    ledger = Ledger(folder).path
    text = ledger.read_text()
    batch_id = [e["batch"] for e in Ledger(folder).events() if e["ev"] == "created"][0]
    ledger.write_text(text.replace(batch_id, "batch_other_key"))   # another API key's batch
    driver = BatchDriver(transport, str(folder))
    asyncio.run(driver.poll())
    assert driver.lost == ["batch_other_key"]
    assert list(driver.to_submit(requests)) == []
    again = BatchDriver(transport, str(folder), resubmit_lost=True)
    assert [r.digest for r in again.to_submit(requests)] == [requests[0].digest]


def test_a_budget_stops_submission_and_a_rerun_asks_again(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    texts = [f"paid {i}" for i in range(5)]
    for t in texts:
        _node(client, t)
    requests = log.new()
    taken: list[str] = []

    def reserve(req: Any) -> BudgetExceededError | None:
        if len(taken) == 2:
            return BudgetExceededError("node 'classify': budget tokens=100 spent", "tokens",
                                       100.0, 100.0, "classify")
        taken.append(req.digest)
        return None
    transport = OpenAIBatches(_openai(fake, "sync"), "m")
    driver = BatchDriver(transport, str(folder), reserve=reserve)
    asyncio.run(driver.submit(requests))
    drive(driver, RequestLog(folder))
    refused = []
    for t in texts:
        try:
            _node(client, t)
        except BudgetRefusal as r:
            refused.append(r.error())
    assert len(refused) == 3 and all(isinstance(e, BudgetExceededError) for e in refused)
    assert refused[0].quantity == "tokens" and refused[0].node == "classify"
    assert len(fake.counts()) == 2    # the refused requests never reached the provider
    again = BatchDriver(transport, str(folder))   # a rerun with a larger budget
    asyncio.run(again.submit(requests))
    drive(again, RequestLog(folder))
    assert all(_node(client, t)[1] for t in texts)
    assert all(c == [1, 1] for c in fake.counts().values()) and len(fake.counts()) == 5


def test_embeddings_and_responses_replay_as_online(fake, tmp_path):
    folder, log, answers, client = _recording(fake, tmp_path)
    online = _openai(fake, "sync")

    def embed(c: Any) -> Any:
        return c.embeddings.create(model="text-embedding-3-small", input=["a", "b"])

    def respond(c: Any) -> Any:
        return c.responses.create(model="gpt-4o-mini", input="hello")
    for call in (embed, respond):
        with pytest.raises(BatchWait):
            call(client)
    recorded = log.new()
    assert any(r.body.get("encoding_format") == "base64" for r in recorded)  # what openai sends
    drive(BatchDriver(OpenAIBatches(_openai(fake, "sync"), "m"), str(folder)),
           RequestLog(folder))
    assert embed(client) == embed(online)
    assert respond(client) == respond(online)
