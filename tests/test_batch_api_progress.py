"""What a user sees of a map's provider batches: the progress bar names them by state,
with the lines answered; outside a map (``run()``) a batch node calls online."""

from __future__ import annotations

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.run.batchmap import POLL_ENV
from tests.conformance import batch_api_graphs as B


def test_the_bar_shows_batches_by_state_and_lines(batch_fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(POLL_ENV, "0.05")
    graph = Graph([B.oa_sync, B.label_sync], cache=DiskCache(tmp_path / "c"))
    res = graph.map({"text": [f"bar {i}" for i in range(5)], "base_url": batch_fake.base_url},
                    map_over="text", progress=True)
    assert res.rows == 5
    err = capsys.readouterr().err
    assert "batches=1 done, lines=5 done 0 failed" in err
    # the node meters no cost: what the batch saved is said as a share of the online price
    assert "saved=50% of the online price of 5 calls" in err


def test_run_calls_online(batch_fake):
    graph = Graph([B.oa_sync, B.label_sync])  # no cache, no into: run() needs neither
    out = graph.run({"text": "one review", "base_url": batch_fake.base_url})
    assert out["label"] and batch_fake.stats()["online_requests"] == 1
    assert batch_fake.stats()["batches"] == 0
