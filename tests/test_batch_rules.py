"""The providers' rules and what curator's users asked for (issue 32), at the driver's and
the map loop's level: real ``openai`` and ``anthropic`` clients against the loopback fake
provider, whose validation refuses what the real providers refuse (lines or bytes over a
file's limit, two models in a file, a custom_id twice)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from hypernodes_bench.batch_answers import request_key, tokens
from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist import Graph, batch_status, cancel_batches, resubmit_lost_batches
from hypernodes_dist.batchapi import AnthropicBatches, BatchNotFoundError, OpenAIBatches
from hypernodes_dist.batchapi.anthropic_batches import anthropic_limits
from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.recording import recording_client
from hypernodes_dist.batchapi.store import AnswerStore, Ledger, RequestLog
from hypernodes_dist.batchapi.transport import FileLimits
from hypernodes_dist.run.batchloop import BatchLoop
from hypernodes_dist.run.batchmap import KEEP_FILES_ENV, POLL_ENV
from tests.batchrig import (
    CHAT,
    FAST,
    Rows,
    anthropic_client,
    chat,
    chat_body,
    drive,
    message,
    message_body,
    openai_client,
    record,
)
from tests.conformance import batch_api_graphs as B

MESSAGES = "/v1/messages"


@pytest.fixture
def fake(batch_fake):
    return batch_fake


def _received_once(fake: BatchServer, n: int) -> None:
    """Each of ``n`` distinct requests reached the provider once and was answered once."""
    counts = fake.counts()
    assert len(counts) == n and all(c == [1, 1] for c in counts.values()), counts


def _gpt(clients: dict[str, Any], item: Any) -> str:
    text, model = item if isinstance(item, tuple) else (item, "gpt-4o-mini")
    return chat(clients["gpt"], text, model)


def _claude(clients: dict[str, Any], item: Any) -> str:
    return message(clients["claude"], item)


def _loop(folder: Path, transports: dict[str, Any], **kw: Any) -> BatchLoop:
    return BatchLoop(folder, transports, backoff=FAST, **kw)


def _batch_sizes(folder: Path) -> list[int]:
    """Lines per batch the map created, from its ledgers."""
    return sorted(len(f.digests) for p in folder.rglob("ledger.jsonl")
                  for f in Ledger(p.parent).files().values() if f.batch_id)


# -- line and byte limits, one model per file, unique custom_ids -------------------------

def test_openai_files_stay_within_the_line_limit_with_one_model_each(fake, tmp_path):
    fake.configure(max_lines=3)   # the provider fails a file of more lines, or of two models
    client = openai_client(fake)
    transport = OpenAIBatches(client, "lines", limits=FileLimits(3, 10**9, one_model=True))
    items = [(f"row {i}", "m1") for i in range(7)] + [(f"row {i}", "m2") for i in range(2)]
    loop = _loop(tmp_path, {"gpt": transport})
    rows = Rows(loop, {"gpt": client}, items, _gpt)
    assert loop.run(rows) == 0 and not rows.errors
    assert _batch_sizes(tmp_path) == [1, 2, 3, 3]
    assert fake.stats()["batches_failed"] == 0
    _received_once(fake, 9)


def test_anthropic_batches_stay_within_the_request_limit_models_mixed(fake, tmp_path):
    fake.configure(anthropic_max_requests=3)   # the provider refuses a larger batch (400)
    client = anthropic_client(fake)
    transport = AnthropicBatches(client, "requests", limits=anthropic_limits(3))
    items = [f"row {i}" for i in range(7)]
    loop = _loop(tmp_path, {"claude": transport})
    rows = Rows(loop, {"claude": client}, items,
                lambda c, t: message(c["claude"], t, model=f"claude-{int(t[-1]) % 2}"))
    assert loop.run(rows) == 0 and not rows.errors
    assert _batch_sizes(tmp_path) == [1, 3, 3]
    _received_once(fake, 7)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_files_stay_within_the_byte_limit_to_the_byte(fake, tmp_path, provider):
    """Lines of one size L: a file (OpenAI) or a create body (Anthropic: the lines in
    ``{"requests":[...]}``) of the limit's size holds two; one byte less holds one. Were
    the transport to count fewer bytes than the client sends, the provider would refuse."""
    texts = [f"same size {i}" for i in range(4)]
    if provider == "openai":
        client, name, node = openai_client(fake), "gpt", _gpt
        size = len(OpenAIBatches(client, "m").line(CHAT, chat_body(texts[0])).data)
    else:
        client, name, node = anthropic_client(fake), "claude", _claude
        size = len(AnthropicBatches(client, "m").line(MESSAGES, message_body(texts[0])).data)
    for slack, per_batch in ((0, [2, 2]), (-1, [1, 1, 1, 1])):
        if provider == "openai":
            limit = 2 * size + slack
            fake.configure(max_bytes=limit)
            transport: Any = OpenAIBatches(client, f"m{slack}",
                                           limits=FileLimits(100, limit, one_model=True))
        else:
            limit = 2 * size + len(b'{"requests":[]}') - 1 + slack
            fake.configure(anthropic_max_bytes=limit)
            transport = AnthropicBatches(client, f"m{slack}", limits=anthropic_limits(100, limit))
        folder = tmp_path / str(slack)
        loop = _loop(folder, {name: transport})
        rows = Rows(loop, {name: client}, texts, node)
        assert loop.run(rows) == 0 and not rows.errors, rows.errors
        assert _batch_sizes(folder) == per_batch
    assert fake.stats()["batches_failed"] == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_request_recorded_by_many_processes_is_one_line(fake, tmp_path, provider):
    """Two processes' request logs with the same requests (one with its keys in another
    order): one line each, or the provider would refuse the file (a custom_id twice)."""
    folder = tmp_path / "b"
    answers = AnswerStore(folder)
    if provider == "openai":
        base: Any = openai_client(fake)
        transport: Any = OpenAIBatches(base, "dups")
        endpoint, body = CHAT, chat_body
    else:
        base = anthropic_client(fake)
        transport = AnthropicBatches(base, "dups")
        endpoint, body = MESSAGES, message_body
    for _process in range(2):
        log = RequestLog(folder)
        for i in range(5):
            log.record(endpoint, body(f"dup {i}"))
        log.record(endpoint, dict(reversed(list(body("dup 0").items()))))
    driver = BatchDriver(transport, str(folder))
    drive(driver, RequestLog(folder))
    assert driver.counts.batches_created == 1 and fake.stats()["batches_failed"] == 0
    _received_once(fake, 5)
    client = recording_client(base, answers, RequestLog(folder).record)
    call = chat if provider == "openai" else message
    assert call(client, "dup 3") == call(base, "dup 3")


# -- the enqueued-token queue limit, both ways -------------------------------------------

def _tokens(texts: list[str]) -> int:
    return sum(sum(tokens(CHAT, chat_body(t))) for t in texts)


def test_a_batch_failed_for_the_queue_limit_goes_again_when_one_ends(fake, tmp_path):
    """OpenAI accepts a batch over its enqueued-token limit, then fails it with
    token_limit_exceeded: no further file is uploaded while the map's batch runs; when it
    ends, the lines go again (not counted against retries: attempts=1)."""
    texts = [f"queued {i}" for i in range(4)]
    fake.complete()   # the queue counts every running batch of the model: earlier tests'
    fake.reset()      # end here, and their lines do not count as this test's answers
    fake.configure(delay=3600, queue_tokens=_tokens(texts[:2]) + 1)
    folder = tmp_path / "b"
    base = openai_client(fake)
    client = recording_client(base, AnswerStore(folder), RequestLog(folder).record)
    for t in texts:
        record(client, lambda c, t=t: chat(c, t))
    transport = OpenAIBatches(base, "queue", limits=FileLimits(2, 10**9, one_model=True))
    driver = BatchDriver(transport, str(folder), attempts=1)
    requests = RequestLog(folder).new()

    def batches() -> list[str]:
        return [str(f.batch_id) for f in driver.files.values() if f.batch_id]

    async def until_running(batch: str) -> None:
        while (await transport.status(batch)).provider_status != "in_progress":
            await asyncio.sleep(0.02)
    asyncio.run(driver.submit(requests[:2]))
    [first] = batches()
    asyncio.run(until_running(first))
    asyncio.run(driver.submit(requests))            # the second file, over the limit
    [second] = [b for b in batches() if b != first]
    assert fake.complete([second]) == []  # returns once validated: failed, over the limit
    asyncio.run(driver.poll())
    assert driver.held and driver.counts.queue_refusals == 1
    assert asyncio.run(driver.submit(requests)) == 0   # held while the first one runs
    assert fake.stats()["files"] == 2
    fake.configure(delay=0)
    fake.complete()
    drive(driver, RequestLog(folder))
    assert [chat(client, t) for t in texts] == [chat(base, t) for t in texts]
    assert fake.stats()["queue_failed"] == 1
    assert {tuple(c) for c in fake.counts().values()} == {(2, 2)}  # batch + the check above


@pytest.mark.parametrize("refuse", [True, False], ids=["gateway-429", "accepted-then-failed"])
def test_the_queue_limit_is_waited_out_without_running_the_rows_again(fake, tmp_path, refuse):
    """Another job's batch fills the queue: the map's batch is refused at create (a
    gateway's 429) or accepted then failed (OpenAI); the loop submits again with back-off,
    the rows do not run again, and once the queue frees the map completes."""
    texts, theirs = [f"waits {i}" for i in range(3)], [f"another job {i}" for i in range(3)]
    fake.complete()   # the queue counts every running batch of the model
    fake.configure(delay=3600, queue_tokens=_tokens(theirs) + 1, queue_refuse=refuse)
    client = openai_client(fake)
    other = OpenAIBatches(client, "another-job")
    [file] = other.pack([other.line(CHAT, chat_body(t)) for t in theirs])

    async def occupy() -> str:
        info = await other.create(file, await other.upload(file))
        while (await other.status(info.id)).provider_status != "in_progress":
            await asyncio.sleep(0.02)
        return info.id
    occupier = asyncio.run(occupy())
    key = "queue_refused" if refuse else "queue_failed"

    def free_the_queue_after_two_refusals() -> None:
        while fake.stats()[key] < 2:
            threading.Event().wait(0.05)
        fake.configure(delay=0)
        fake.complete([occupier])
    helper = threading.Thread(target=free_the_queue_after_two_refusals, daemon=True)
    helper.start()
    loop = _loop(tmp_path, {"gpt": OpenAIBatches(client, "map")})
    rows = Rows(loop, {"gpt": client}, texts, _gpt)
    assert loop.run(rows) == 0 and not rows.errors
    helper.join(timeout=60)
    assert rows.runs == 2   # recorded, then answered: never run for a refusal
    assert fake.stats()[key] >= 2
    mine = {request_key(CHAT, chat_body(t)) for t in texts}
    assert all(fake.counts()[k] == [1, 1] for k in mine)


def test_a_gateway_refusal_uploads_no_further_file(fake, tmp_path):
    fake.configure(queue_refuse=True, queue_tokens=1)
    folder = tmp_path / "b"
    base = openai_client(fake)
    client = recording_client(base, AnswerStore(folder), RequestLog(folder).record)
    for i in range(6):
        record(client, lambda c, i=i: chat(c, f"refused {i}"))
    transport = OpenAIBatches(base, "m", limits=FileLimits(2, 10**9, one_model=True))
    driver = BatchDriver(transport, str(folder))
    assert asyncio.run(driver.submit(RequestLog(folder).new())) == 0
    assert fake.stats()["files"] == 1 and driver.held   # not three uploads refused


# -- Anthropic: the map's batches found again without metadata --------------------------

def test_anthropic_batch_created_but_not_recorded_is_adopted_by_its_custom_ids(fake, tmp_path):
    """A crash between create and the ledger: Message Batches carry no metadata, so the
    rerun recognizes the map's batch by its custom_ids (``<map tag>_<request digest>``);
    while it runs, nothing is submitted again; once it ends, it is adopted."""
    fake.configure(delay=3600)
    folder = tmp_path / "b"
    base = anthropic_client(fake)
    client = recording_client(base, AnswerStore(folder), RequestLog(folder).record)
    texts = [f"adopt {i}" for i in range(3)]
    for t in texts:
        record(client, lambda c, t=t: message(c, t))
    requests = RequestLog(folder).new()
    asyncio.run(BatchDriver(AnthropicBatches(base, "adopt"), str(folder)).submit(requests))
    ledger = Ledger(folder).path
    ledger.write_text("".join(ln for ln in ledger.read_text().splitlines(keepends=True)
                              if '"ev":"created"' not in ln))   # the crash
    rerun = BatchDriver(AnthropicBatches(base, "adopt"), str(folder))
    assert asyncio.run(rerun.recover()) == 1                 # running: not yet readable
    assert asyncio.run(rerun.submit(requests)) == 0
    fake.configure(delay=0)
    fake.complete()
    assert asyncio.run(rerun.recover()) == 0                 # ended: its custom_ids match
    drive(rerun, RequestLog(folder))
    assert fake.stats()["batches"] == 1
    assert [message(client, t) for t in texts] == [message(base, t) for t in texts]


# -- lines that go again, and lines that never do ----------------------------------------

def test_anthropic_expired_cancelled_and_overloaded_lines_go_again_completed_never(fake, tmp_path):
    folder = tmp_path / "b"
    base = anthropic_client(fake)
    client = recording_client(base, AnswerStore(folder), RequestLog(folder).record)
    texts = ["plain", "[[expire:1]] late", "[[cancel:1]] stopped", "[[status:529:1]] busy"]
    for t in texts:
        record(client, lambda c, t=t: message(c, t))
    driver = BatchDriver(AnthropicBatches(base, "again"), str(folder), attempts=2)
    drive(driver, RequestLog(folder))
    assert all(message(client, t) for t in texts)
    received = {k: v[0] for k, v in fake.counts().items()}
    assert received[request_key(MESSAGES, message_body("plain"))] == 1
    assert sorted(received.values()) == [1, 2, 2, 2]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_whole_batch_failure_fails_its_items_with_the_providers_message(
        fake, tmp_path, provider):
    """The provider refuses every batch as a whole (here: more requests than it takes):
    after the node's attempts the items fail with the client's 400 error carrying the
    provider's message, in the run that gives up even when another saw the failures."""
    if provider == "openai":
        fake.configure(max_lines=1)
        base: Any = openai_client(fake)
        transport: Any = OpenAIBatches(base, "whole")
        call, error, said = chat, openai.BadRequestError, "more than the 1 a batch may have"
    else:
        fake.configure(anthropic_max_requests=1)
        base = anthropic_client(fake)
        transport = AnthropicBatches(base, "whole")
        call, error, said = message, anthropic.BadRequestError, "at most 1 requests a batch"
    folder = tmp_path / "b"
    client = recording_client(base, AnswerStore(folder), RequestLog(folder).record)
    for i in range(2):
        record(client, lambda c, i=i: call(c, f"whole {i}"))
    first = BatchDriver(transport, str(folder), attempts=1)
    asyncio.run(first.submit(RequestLog(folder).new()))
    while first.running:
        asyncio.run(first.poll())
        threading.Event().wait(0.02)
    rerun = BatchDriver(transport, str(folder), attempts=1)   # another process gives up
    drive(rerun, RequestLog(folder))
    for i in range(2):
        with pytest.raises(error, match=said) as err:
            call(client, f"whole {i}")
        assert err.value.status_code == 400
    assert fake.counts() == {}   # no line ever ran


# -- the provider's files, a map's cancel, a lost batch ----------------------------------

@pytest.mark.parametrize("keep", [False, True], ids=["deleted", "kept"])
def test_provider_files_are_deleted_after_download_unless_kept(fake, tmp_path, keep):
    oa, an = openai_client(fake), anthropic_client(fake)
    transports = {"gpt": OpenAIBatches(oa, "files"), "claude": AnthropicBatches(an, "files")}
    loop = _loop(tmp_path, transports, keep_files=keep)
    for name, base, call in (("gpt", oa, chat), ("claude", an, message)):
        client = recording_client(base, loop.answers, loop.recorder(name))
        record(client, lambda c, call=call: call(c, "[[status:400]] bad and good"))
        record(client, lambda c, call=call: call(c, "good"))
    asyncio.run(loop._submit())
    while loop.running:
        asyncio.run(loop._poll())
        threading.Event().wait(0.02)
    openai_batch, anthropic_batch = (
        next(f.batch_id for f in loop.drivers[n].files.values()) for n in ("gpt", "claude"))
    info = oa.batches.retrieve(str(openai_batch))
    ids = [info.input_file_id, info.output_file_id, info.error_file_id]
    assert all(ids)   # an output file and an error file
    for file_id in ids:
        if keep:
            assert oa.files.retrieve(file_id).id == file_id
        else:
            with pytest.raises(openai.NotFoundError):
                oa.files.retrieve(file_id)
    if keep:
        assert an.messages.batches.retrieve(str(anthropic_batch)).processing_status == "ended"
    else:
        with pytest.raises(anthropic.NotFoundError):
            an.messages.batches.retrieve(str(anthropic_batch))


@pytest.mark.parametrize("keep", ["", "1"], ids=["deleted", "kept"])
def test_a_map_deletes_the_providers_files_unless_told_to_keep_them(fake, tmp_path,
                                                                   monkeypatch, keep):
    monkeypatch.setenv(POLL_ENV, "0.05")
    monkeypatch.setenv(KEEP_FILES_ENV, keep)
    res = Graph([B.oa_sync, B.label_sync]).map(
        {"text": ["keep 1", "keep 2"], "base_url": fake.base_url}, map_over="text",
        into=tmp_path / "out")
    assert (res.rows, res.pending) == (2, 0)
    assert fake.stats()["files_deleted"] == (0 if keep else 2)   # the input and the output


def _env(fake: BatchServer) -> dict[str, str]:
    return {**os.environ, "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": "x", "ANTHROPIC_BASE_URL": fake.anthropic_base_url}


def _cli(fake: BatchServer, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "hypernodes_dist.cli", "batches", *args],
                          env=_env(fake), capture_output=True, text=True, timeout=120,
                          check=True).stdout


@pytest.mark.parametrize("how", ["function", "cli"])
def test_cancelling_a_maps_batches_stops_it_and_a_rerun_completes(fake, tmp_path, how):
    """The map waits on its batches; the user cancels them (from another thread here, any
    process alike): the map returns with its rows pending, nothing failed; a rerun submits
    the unanswered requests again (attempts=1: a cancel is no attempt) and completes."""
    fake.configure(delay=3600)
    oa, an = openai_client(fake), anthropic_client(fake)
    clients = {"gpt": oa, "claude": an}
    texts = [f"cancel me {i}" for i in range(3)]

    def both(c: dict[str, Any], t: str) -> tuple[str, str]:
        return _gpt(c, t), _claude(c, t)

    def transports() -> dict[str, Any]:
        return {"gpt": OpenAIBatches(oa, "cancel"), "claude": AnthropicBatches(an, "cancel")}
    loop = _loop(tmp_path, transports(), attempts=1)
    rows = Rows(loop, clients, texts, both)
    left: list[int] = []
    waiting = threading.Thread(target=lambda: left.append(loop.run(rows)), daemon=True)
    waiting.start()
    while not any(s.running for s in batch_status(tmp_path)):
        threading.Event().wait(0.05)
    if how == "function":
        assert len(cancel_batches(tmp_path, clients)) == 1   # the openai one: rows wait on it
    else:
        assert "cancelled 1 batches" in _cli(fake, "cancel", str(tmp_path))
    waiting.join(timeout=120)
    assert left == [3] and not rows.errors
    fake.configure(delay=0)
    again = _loop(tmp_path, transports(), attempts=1)
    rows = Rows(again, clients, texts, both)
    assert again.run(rows) == 0 and not rows.errors
    assert [rows.out[i] for i in range(3)] == [both(clients, t) for t in texts]
    status = _cli(fake, "status", str(tmp_path))
    assert "resource 'gpt' (openai): 2 done" in status and "claude" in status


def test_a_lost_batch_is_resubmitted_once_the_user_says_so(fake, tmp_path):
    client = openai_client(fake)
    fake.configure(delay=3600)
    loop = _loop(tmp_path, {"gpt": OpenAIBatches(client, "lost")})
    assert loop.run(Rows(loop, {"gpt": client}, ["gone"], _gpt), wait=False) == 1
    ledger = next(tmp_path.rglob("ledger.jsonl"))
    batch_id = [json.loads(ln)["batch"] for ln in ledger.read_text().splitlines()
                if '"ev":"created"' in ln][0]
    ledger.write_text(ledger.read_text().replace(batch_id, "batch_other_key"))  # a key change
    again = _loop(tmp_path, {"gpt": OpenAIBatches(client, "lost")})
    with pytest.raises(BatchNotFoundError, match="batch_other_key"):
        again.run(Rows(again, {"gpt": client}, ["gone"], _gpt))
    assert batch_status(tmp_path)[0].lost == ["batch_other_key"]
    assert "resubmit-lost" in str(BatchNotFoundError("b", "openai"))
    assert "1 lost batches: batch_other_key" in _cli(fake, "resubmit-lost", str(tmp_path))
    assert resubmit_lost_batches(tmp_path) == []   # said once is enough
    fake.configure(delay=0)
    last = _loop(tmp_path, {"gpt": OpenAIBatches(client, "lost")})
    rows = Rows(last, {"gpt": client}, ["gone"], _gpt)
    assert last.run(rows) == 0 and rows.out[0] == chat(client, "gone")
    fake.complete()   # the batch the ledger lost track of
