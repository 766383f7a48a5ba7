"""The map's Batch API loop (``run/batchloop.py``) with rows stood in for by the real
``openai`` and ``anthropic`` recording clients, against the loopback fake provider."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist.batchapi import BatchNotFoundError, OpenAIBatches, UnsupportedClientError
from hypernodes_dist.batchapi.recording import BatchWait, recording_client
from hypernodes_dist.batchapi.transport import FileLimits
from hypernodes_dist.run.batchloop import Backoff, BatchLoop, batch_folder, transports_for

FAST = Backoff(first=0.05, factor=1.5, most=0.5)


@pytest.fixture
def fake(batch_fake):
    return batch_fake


def _clients(fake: BatchServer) -> dict[str, Any]:
    return {"gpt": openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0),
            "claude": anthropic.Anthropic(base_url=fake.anthropic_base_url, api_key="x",
                                          max_retries=0)}


class Rows:
    """Rows of a map whose node calls both clients; a finished row is not run again."""

    def __init__(self, loop: BatchLoop, clients: dict[str, Any], texts: list[str]) -> None:
        self.clients = {name: recording_client(c, loop.answers, loop.recorder(name))
                        for name, c in clients.items()}
        self.texts, self.out, self.runs = texts, {}, 0

    def node(self, text: str) -> tuple[str, str]:
        a = self.clients["gpt"].chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": text}])
        b = self.clients["claude"].messages.create(
            model="claude-haiku", max_tokens=16, messages=[{"role": "user", "content": text}])
        return a.choices[0].message.content, b.content[0].text

    def __call__(self) -> int:
        self.runs += 1
        waiting = 0
        for i, text in enumerate(self.texts):
            if i in self.out:
                continue
            try:
                self.out[i] = self.node(text)
            except BatchWait:
                waiting += 1
        return waiting


def test_the_loop_runs_rows_until_none_waits(fake, tmp_path):
    clients = _clients(fake)
    loop = BatchLoop(tmp_path, transports_for(clients, "m", "both"), backoff=FAST)
    rows = Rows(loop, clients, [f"row {i}" for i in range(10)])
    assert loop.run(rows) == 0
    assert rows.runs == 3   # waits on gpt, then on claude, then done
    online = Rows.__new__(Rows)
    online.clients = clients
    assert [rows.out[i] for i in range(10)] == [online.node(t) for t in rows.texts]
    assert all(received == 2 for received, _ in fake.counts().values())  # batch + online check


def test_wait_false_returns_pending_then_a_rerun_collects(fake, tmp_path):
    clients = _clients(fake)
    fake.configure(delay=0.3)
    texts = [f"later {i}" for i in range(6)]
    first = BatchLoop(tmp_path, transports_for(clients, "m", "both"), backoff=FAST)
    assert first.run(Rows(first, clients, texts), wait=False) == 6
    again = BatchLoop(tmp_path, transports_for(clients, "m", "both"), backoff=FAST)
    rows = Rows(again, clients, texts)
    assert again.run(rows) == 0 and len(rows.out) == 6
    assert fake.stats()["batches"] == 2   # one per provider: nothing submitted twice
    assert all(c == [1, 1] for c in fake.counts().values())


def test_a_map_needs_into_or_a_cache_and_a_supported_client(tmp_path):
    assert batch_folder(tmp_path / "out", None, "m") == tmp_path / "out" / "_hn_batches"
    assert batch_folder(None, tmp_path, "m").parent == tmp_path / "_hn_batches"
    with pytest.raises(ValueError, match="into="):
        batch_folder(None, None, "m")
    with pytest.raises(UnsupportedClientError, match="node 'classify', resource 'llm'.*openai"):
        transports_for({"llm": object()}, "m", "classify")


def test_a_lost_batch_stops_the_loop_naming_it(fake, tmp_path):
    clients = {"gpt": _clients(fake)["gpt"]}
    loop = BatchLoop(tmp_path, transports_for(clients, "m", "n"), backoff=FAST)
    rows = Rows(loop, clients, ["x"])
    rows.node = lambda text: (  # type: ignore[method-assign]
        rows.clients["gpt"].chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": text}]), "")
    fake.configure(delay=30.0)
    assert loop.run(rows, wait=False) == 1
    ledger = next((tmp_path / "ledgers").rglob("ledger.jsonl"))
    batch_id = json.loads(ledger.read_text().splitlines()[-1])["batch"]
    ledger.write_text(ledger.read_text().replace(batch_id, "batch_other_key"))
    again = BatchLoop(tmp_path, transports_for(clients, "m", "n"), backoff=FAST)
    with pytest.raises(BatchNotFoundError, match="batch_other_key") as err:
        again.run(Rows(again, clients, ["x"]))
    assert "resubmit-lost" in err.value.__notes__[0]


def test_batches_ending_one_by_one_run_the_rows_a_few_times_not_once_per_batch(fake,
                                                                                  tmp_path):
    """8 batches of 5 lines, the provider ending one each time the loop reports progress: a
    round runs the waiting rows again once answers cover half the lines running, so the
    rows run a few times (the waiting lines halve each round), not once per ended batch
    with every waiting row recorded again (before: 6 rounds, 160 row runs)."""
    fake.configure(delay=3600)  # a batch ends only when the test says so
    client = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
    transport = OpenAIBatches(client, "m", limits=FileLimits(5, 10**9, one_model=True))
    loop = BatchLoop(tmp_path, {"gpt": transport}, backoff=FAST)
    gpt = recording_client(client, loop.answers, loop.recorder("gpt"))
    texts, out, calls = [f"row {i}" for i in range(40)], {}, [0]

    def end_one(_summary: Any) -> None:
        running = [b.id for b in client.batches.list(limit=100) if b.status == "in_progress"]
        if running:
            fake.complete(running[-1:])

    def run_rows() -> int:
        for i, text in enumerate(texts):
            if i not in out:
                calls[0] += 1
                try:
                    out[i] = gpt.chat.completions.create(
                        model="gpt-4o-mini", messages=[{"role": "user", "content": text}])
                except BatchWait:
                    pass
        return len(texts) - len(out)

    loop.on_change = end_one
    runs = [0]

    def counted() -> int:
        runs[0] += 1
        return run_rows()

    assert loop.run(counted) == 0 and len(out) == 40
    assert runs[0] <= 5 and calls[0] <= 3 * 40
    received = [r for r, _ in fake.counts().values() if r]  # (earlier tests' batches: 0)
    assert len(received) == 40 and set(received) == {1}
