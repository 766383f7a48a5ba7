"""``@node(batch_api=True)`` on every engine: the real ``openai`` (async and sync) and
``anthropic`` clients against the loopback fake provider (Files + Batches, Message
Batches): answers equal to the online path, each distinct request received once, a 400
line failing only its item with the client's own error type in the node's code."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.run.batchmap import POLL_ENV

from . import batch_api_graphs as B

TEXTS = [f"review {i}: " + "good " * (i % 4) for i in range(24)] + ["review 3: good good good "]


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setenv(POLL_ENV, "0.05")


def _inputs(fake, url: str, texts: list[str]) -> dict:
    base = fake.anthropic_base_url if url == "anthropic_url" else fake.base_url
    return {"text": texts, url: base}


@pytest.mark.parametrize("kind", list(B.KINDS))
def test_answers_equal_the_online_path_and_each_request_is_sent_once(engine, batch_fake,
                                                                      tmp_path, kind):
    nodes, online, url = B.KINDS[kind]
    graph = Graph([*nodes, B.shout], engine=engine, cache=DiskCache(tmp_path / "c"))
    res = graph.map(_inputs(batch_fake, url, TEXTS), map_over="text")
    counts = batch_fake.counts()
    assert len(counts) == len(set(TEXTS)) and all(c == [1, 1] for c in counts.values())
    assert res.pending == 0 and not res.errors and res.rows == len(TEXTS)
    assert batch_fake.stats()["online_requests"] == 0
    direct = Graph(online, engine=engine).map(_inputs(batch_fake, url, TEXTS), map_over="text")
    assert res.column("label") == direct.column("label")
    assert res.column("shout") == [t.upper() for t in direct.column("label")]
    name, online_name = nodes[1].name, online[1].name
    used = res.usage[name]  # in_batch_api() is True in the node's code, after the answer
    assert used["batched"] == used["calls"] == used["batch_calls"] >= len(set(TEXTS))
    assert direct.usage[online_name].get("batched", 0) == 0


def test_a_400_line_fails_only_its_item_with_the_clients_error(engine, batch_fake, tmp_path):
    texts = [f"fine {i}" for i in range(10)] + ["bad [[status:400]]"]
    graph = Graph([B.oa_sync, B.label_sync], engine=engine, cache=DiskCache(tmp_path / "c"))
    res = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text",
                    on_error="collect")
    assert [r.status for r in res] == ["complete"] * 10 + ["error"]
    err = res[10].error
    assert type(err).__name__ == "BadRequestError" and err.status_code == 400
    assert err.hn_item == 10 and err.hn_node == "label_sync"
    assert all(c == [1, 1] for c in batch_fake.counts().values())  # never sent twice
    guarded = Graph([B.oa_sync, B.guarded], engine=engine, cache=DiskCache(tmp_path / "g"))
    res = guarded.map(_inputs(batch_fake, "base_url", texts), map_over="text")
    assert res.column("label")[10] == "refused 400" and not res.errors


def _online_labels(engine, fake, texts: list[str]) -> list[str]:
    res = Graph([B.oa_async, B.online_async], engine=engine).map(
        _inputs(fake, "base_url", texts), map_over="text")
    return res.column("label")


def test_a_dataset_map_writes_every_row_once(engine, batch_fake, tmp_path):
    texts = [f"row {i}: " + "good " * (i % 3) for i in range(30)]
    graph = Graph([B.oa_async, B.label_async, B.shout], engine=engine)
    res = graph.map(source=pa.table({"text": texts}), inputs={"base_url": batch_fake.base_url},
                    into=tmp_path / "out")
    assert (res.rows, res.pending, res.failed, res.unfinished) == (30, 0, 0, 0)
    assert all(c == [1, 1] for c in batch_fake.counts().values())
    table = res.to_arrow().sort_by("_hn_row")
    assert table.column("_hn_row").to_pylist() == list(range(30))
    assert table.column("label").to_pylist() == _online_labels(engine, batch_fake, texts)


@pytest.mark.parametrize("into", [True, False], ids=["into", "memory"])
def test_wait_false_returns_pending_then_a_rerun_collects(engine, batch_fake, tmp_path, into):
    texts = [f"later {i}" for i in range(12)]
    graph = Graph([B.oa_sync, B.label_sync], engine=engine, cache=DiskCache(tmp_path / "c"))
    where = {"into": tmp_path / "out"} if into else {}
    batch_fake.configure(delay=0.4)
    first = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text", wait=False,
                      **where)
    assert first.pending == 12 and first.rows == 0
    if not into:
        assert {r.status for r in first} == {"pending"}
    again = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text", **where)
    assert again.pending == 0 and again.rows == 12
    assert batch_fake.stats()["batches"] == 1  # nothing submitted twice
    assert all(c == [1, 1] for c in batch_fake.counts().values())
    labels = (sorted(zip(again.to_arrow().column("_hn_row").to_pylist(),
                         again.to_arrow().column("label").to_pylist())) if into else None)
    expected = _online_labels(engine, batch_fake, texts)
    assert ([v for _, v in labels] if into else again.column("label")) == expected


def test_expired_cancelled_and_failed_lines_go_again_completed_ones_never(engine, batch_fake,
                                                                          tmp_path):
    texts = [f"ok {i}" for i in range(8)] + ["late [[expire:1]]", "stopped [[cancel:1]]"]
    graph = Graph([B.oa_sync, B.label_retried], engine=engine, cache=DiskCache(tmp_path / "c"))
    res = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text")
    assert not res.errors and res.pending == 0
    counts = batch_fake.counts()
    assert sorted(received for received, _ in counts.values()) == [1] * 8 + [2, 2]
    assert all(answered == 1 for _, answered in counts.values())
    batch_fake.reset()
    batch_fake.configure(fail_batches=1)  # the next batch fails validation as a whole
    other = [f"again {i}" for i in range(6)]
    res = graph.map(_inputs(batch_fake, "base_url", other), map_over="text")
    assert not res.errors and batch_fake.stats()["batches_failed"] == 1
    assert all(answered == 1 for _, answered in batch_fake.counts().values())


def _lift_after_refusal(fake, key: str) -> None:
    """The provider's queue frees once it has refused a batch."""
    deadline = time.monotonic() + 120
    while fake.stats()[key] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    fake.configure(queue_refuse=False, queue_tokens=None)


@pytest.mark.parametrize("refuse", [True, False], ids=["gateway", "openai"])
def test_a_queue_limit_refusal_is_waited_out(engine, batch_fake, tmp_path, refuse):
    texts = [f"queued {i}" for i in range(6)]
    graph = Graph([B.oa_sync, B.label_sync], engine=engine, cache=DiskCache(tmp_path / "c"))
    # a gateway refuses at create (429); OpenAI accepts, then fails token_limit_exceeded
    batch_fake.configure(queue_refuse=refuse, queue_tokens=1)
    key = "queue_refused" if refuse else "queue_failed"
    lift = threading.Thread(target=_lift_after_refusal, args=(batch_fake, key), daemon=True)
    lift.start()
    res = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text")
    lift.join()
    assert not res.errors and res.rows == 6
    assert batch_fake.stats()[key] >= 1
    assert all(answered == 1 for _, answered in batch_fake.counts().values())


def test_online_after_sends_the_rest_online_and_keeps_finished_lines(engine, batch_fake,
                                                                     tmp_path):
    texts = [f"slow {i}" for i in range(20)]
    graph = Graph([B.oa_sync, B.label_soon], engine=engine, cache=DiskCache(tmp_path / "c"))
    batch_fake.configure(delay=3.0)  # a third of its lines a second, cancelled after 0.3 s
    res = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text")
    assert not res.errors and res.pending == 0
    stats = batch_fake.stats()
    assert 0 < stats["online_requests"] < 20  # the lines the batch had finished are kept
    assert stats["lines_succeeded"] + stats["online_requests"] == 20
    assert all(answered == 1 for _, answered in batch_fake.counts().values())
    assert res.column("label") == _online_labels(engine, batch_fake, texts)


def test_a_budget_stops_submission(engine, batch_fake, tmp_path):
    texts = [f"budget {i}: " + "word " * (i % 3) for i in range(12)]
    nodes = [B.oa_sync, B.label_sync, B.explain]
    measure = Graph(nodes, engine=engine, cache=DiskCache(tmp_path / "m")).map(
        _inputs(batch_fake, "base_url", texts), map_over="text")
    labels = measure.usage["label_sync"]["tokens"]
    batch_fake.reset()
    graph = Graph(nodes, engine=engine, cache=DiskCache(tmp_path / "c"))
    res = graph.map(_inputs(batch_fake, "base_url", texts), map_over="text",
                    on_error="collect", budget={"tokens": labels * 1.5})
    refused = [r for r in res if r.status == "error"]
    assert refused and all(type(r.error).__name__ == "BudgetExceededError" for r in refused)
    assert res.unfinished == len(refused) < len(texts)
    sent = batch_fake.stats()["batch_lines"]  # refused requests were never submitted
    assert sent == 2 * len(texts) - len(refused)  # an answered line is never refused


def test_an_untyped_batch_node_types_its_column_from_answered_rows(engine, batch_fake,
                                                                  tmp_path):
    texts = [f"untyped {i}" for i in range(9)]
    graph = Graph([B.oa_sync, B.label_untyped], engine=engine)
    res = graph.map(source=pa.table({"text": texts}), inputs={"base_url": batch_fake.base_url},
                    into=tmp_path / "out")
    assert res.rows == 9 and res.pending == 0
    table = res.to_arrow().sort_by("_hn_row")
    assert table.schema.field("label").type == pa.string()  # not pickled
    assert table.column("label").to_pylist() == _online_labels(engine, batch_fake, texts)


def test_a_cycle_waits_for_each_revisions_batch(engine, batch_fake, tmp_path):
    topics = [f"topic {i}" for i in range(5)] + ["bad [[status:400]]"]
    graph = Graph(B.CYCLE, engine=engine, cache=DiskCache(tmp_path / "c"))
    assert not graph.plan.columnar  # items run through the reactive scheduler
    res = graph.map({"topic": topics, "base_url": batch_fake.base_url}, map_over="topic",
                    on_error="collect")
    assert [r.status for r in res] == ["complete"] * 5 + ["error"]
    assert type(res[5].error).__name__ == "BadRequestError" and res[5].error.hn_item == 5
    assert all(f.count("+") == 2 for f in res.column("final")[:5])
    assert batch_fake.stats()["batches"] == 2  # one per revision round
    assert all(c == [1, 1] for c in batch_fake.counts().values())
