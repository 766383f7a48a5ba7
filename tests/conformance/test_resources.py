"""``@resource`` on every engine, with real clients (``openai``, ``httpx``, ``aiohttp``)
against a loopback OpenAI-compatible server that fails 5% of requests: built at most once
per process across maps, never shipped, torn down by ``engine.close()``, a failed build
fails every item with ``ResourceError``; a module-level client works across maps; inputs
named in ``not_in_key`` (endpoint, key) stay out of cache keys and of a dataset map's
identity."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hypernodes_bench.llm_server import label_of
from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.errors import ResourceError

from . import resource_graphs as R

# 64 rows: more partitions or batches than any engine has processes (dask-processes: 10
# partitions of 7 for its 8 flow processes), so a process builds and tears down its clients
# while serving rows of each map
TEXTS = [f"review {i}: " + "good " * (i % 5) for i in range(64)]


@pytest.fixture(scope="module")
def flaky_server(llm_servers):
    return llm_servers(latency=(0.002, 0.010), fail_rate=0.05)


def _labels_ok(res, texts=TEXTS) -> bool:
    errors = [repr(r.error) for r in res if r.status != "complete"]
    assert not errors, errors[:3]
    return [r["label"] for r in res] == [label_of(t) for t in texts]


def _wait_for(log_dir: str, name: str, expected: dict[int, int], timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = R.events(log_dir, "teardown", name)
        if found == expected:
            return found
        time.sleep(0.1)
    return R.events(log_dir, "teardown", name)


def test_openai_client_built_once_per_process_across_maps(engine, flaky_server, logs):
    graph = Graph([R.llm, R.classify], engine=engine)
    assert "llm" not in graph.inputs
    inputs = {"text": TEXTS, "base_url": flaky_server.base_url, "log_dir": logs}
    for _ in range(2):
        assert _labels_ok(graph.map(inputs, map_over="text", on_error="collect"))
    builds = R.events(logs, "build", "llm")
    assert builds and all(n == 1 for n in builds.values())


ASYNC_CLIENTS = {"web": [R.web, R.classify_httpx], "session": [R.session, R.classify_aiohttp]}


def test_async_resources_torn_down_when_the_engine_closes(request, engine, flaky_server, logs):
    """An ``httpx`` and an ``aiohttp`` client, each built once per process across maps and
    torn down by ``close()`` in each process that built it (both on one new engine of this
    kind: a new engine starts its processes, which is what costs)."""
    fresh = request.node.callspec.params["engine"]()  # a new one of this kind, closed here
    try:
        for nodes in ASYNC_CLIENTS.values():
            graph = Graph(nodes, engine=fresh)
            inputs = {"text": TEXTS, "base_url": flaky_server.base_url, "log_dir": logs}
            assert _labels_ok(graph.map(inputs, map_over="text", on_error="collect"))
            assert _labels_ok(graph.map(inputs, map_over="text", on_error="collect"))
    finally:
        fresh.close()
    for name in ASYNC_CLIENTS:
        builds = R.events(logs, "build", name)
        assert builds and all(n == 1 for n in builds.values()), name
        assert _wait_for(logs, name, builds) == builds, name  # each process that built it, once


def test_a_resource_taking_a_resource_with_a_sync_client(engine, flaky_server, logs):
    graph = Graph([R.settings, R.configured, R.classify_sync], engine=engine)
    assert set(graph.inputs) == {"text", "base_url", "log_dir"}
    inputs = {"text": TEXTS[:40], "base_url": flaky_server.base_url, "log_dir": logs}
    assert _labels_ok(graph.map(inputs, map_over="text", on_error="collect"), TEXTS[:40])
    for name in ("settings", "configured"):
        assert all(n == 1 for n in R.events(logs, "build", name).values())


def test_a_failed_build_fails_every_item_naming_resource_and_worker(engine, logs):
    graph = Graph([R.broken, R.needs_broken], engine=engine)
    res = graph.map({"text": TEXTS[:20], "log_dir": logs}, map_over="text", on_error="collect")
    assert len(res.errors) == 20
    for r in res:
        assert isinstance(r.error, ResourceError), r.error
        assert r.error.resource == "broken" and r.error.worker
        assert "'broken'" in str(r.error) and r.error.worker in str(r.error)
        assert isinstance(r.error.__cause__, ConnectionRefusedError)
    with pytest.raises(ResourceError, match="resource 'broken' failed on worker"):
        graph.map({"text": TEXTS[:3], "log_dir": logs}, map_over="text")


def test_a_module_level_client_works_across_maps(engine, flaky_server):
    graph = Graph([R.classify_global], engine=engine)
    inputs = {"text": TEXTS, "base_url": flaky_server.base_url}
    for _ in range(2):  # its connection pool is bound to the loop of its first use
        assert _labels_ok(graph.map(inputs, map_over="text", on_error="collect"))


# ------------------------------------------------------------------ not_in_key


@pytest.fixture(scope="module")
def two_servers(llm_servers):
    """Two endpoints of one (never failing) service: requests counted per endpoint."""
    return llm_servers(latency=(0.001, 0.003)), llm_servers(latency=(0.001, 0.003), seed=1)


def test_cache_hits_survive_a_changed_endpoint_and_key(engine, two_servers, tmp_path, logs):
    a, b = two_servers
    texts, cache = TEXTS[:30], DiskCache(tmp_path / "cache")
    graph = Graph([R.endpoint_llm, R.classify_anywhere], engine=engine, cache=cache)
    graph.map({"text": texts, "base_url": a.base_url, "api_key": "key-1"}, map_over="text")
    b.reset()
    res = graph.map({"text": texts, "base_url": b.base_url, "api_key": "key-2"},
                    map_over="text")
    assert _labels_ok(res, texts) and b.stats()["requests"] == 0  # all hits
    default = Graph([R.llm, R.classify], engine=engine, cache=cache)  # the endpoint counts
    default.map({"text": texts, "base_url": a.base_url, "log_dir": logs}, map_over="text")
    res = default.map({"text": texts, "base_url": b.base_url, "log_dir": logs}, map_over="text")
    assert _labels_ok(res, texts) and b.stats()["requests"] == len(texts)


def test_a_dataset_map_resumes_after_the_endpoint_changes(engine, two_servers, tmp_path, logs):
    a, b = two_servers
    source, out = pa.table({"text": TEXTS[:40]}), tmp_path / "out"
    graph = Graph([R.endpoint_llm, R.classify_anywhere], engine=engine)
    graph.map(source=source, inputs={"base_url": a.base_url, "api_key": "key-1"}, into=out)
    last = sorted(out.glob("part-*.parquet"))[-1]
    lost = pq.read_table(last).num_rows
    last.unlink()  # as if the map had been stopped before writing it
    b.reset()
    again = graph.map(source=source, inputs={"base_url": b.base_url, "api_key": "key-2"},
                      into=out)
    assert again.rows == 40 and again.failed == 0
    table = again.to_arrow().sort_by("_hn_row")
    assert table.column("label").to_pylist() == [label_of(t) for t in TEXTS[:40]]
    assert b.stats()["requests"] == lost  # only the rows with no file, on the new endpoint
    default, out = Graph([R.llm, R.classify], engine=engine), tmp_path / "default"
    default.map(source=source, inputs={"base_url": a.base_url, "log_dir": logs}, into=out)
    with pytest.raises(ValueError, match="broadcast input.s. 'base_url' changed"):
        default.map(source=source, inputs={"base_url": b.base_url, "log_dir": logs}, into=out)
