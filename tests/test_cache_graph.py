"""DiskCache through the local engine: code identity, canonical keys across processes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hypernodes_dist import DiskCache, Graph, ObjectStoreCache, node

ROOT = Path(__file__).resolve().parents[1]


class Ends:
    def __init__(self) -> None:
        self.events = []

    def on_node_end(self, event) -> None:
        self.events.append(event)

    def cached(self) -> dict:
        return {e.node_id: e.cached for e in self.events}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PIPELINE = """
from hypernodes_dist import node

@node(output_name="a")
def first(x):
    return x + 1

@node(output_name="b")
def second(a):
    return a * {factor}

@node(output_name="c")
def third(b):
    return b - {offset}
"""


def test_editing_a_node_misses_that_node_only(tmp_path):
    v1 = tmp_path / "pipe_v1.py"
    v2 = tmp_path / "pipe_v2.py"
    v1.write_text(PIPELINE.format(factor=2, offset=1))
    v2.write_text(PIPELINE.format(factor=2, offset=5))  # only `third` changed
    cache = DiskCache(tmp_path / "c")
    m1, m2 = load(v1, "pipe_v1"), load(v2, "pipe_v2")
    Graph([m1.first, m1.second, m1.third], cache=cache).run({"x": 1})
    ends = Ends()
    r = Graph([m2.first, m2.second, m2.third], cache=cache, callbacks=[ends]).run({"x": 1})
    assert r["c"] == -1
    assert ends.cached() == {"first": True, "second": True, "third": False}


def test_editing_an_upstream_node_misses_it_and_its_descendants(tmp_path):
    """Keys chain: a node's output identity is its key, so downstream keys change too."""
    v1 = tmp_path / "up_v1.py"
    v2 = tmp_path / "up_v2.py"
    v1.write_text(PIPELINE.format(factor=2, offset=1))
    v2.write_text(PIPELINE.format(factor=3, offset=1))
    cache = DiskCache(tmp_path / "c")
    m1, m2 = load(v1, "up_v1"), load(v2, "up_v2")
    Graph([m1.first, m1.second, m1.third], cache=cache).run({"x": 1})
    ends = Ends()
    Graph([m2.first, m2.second, m2.third], cache=cache, callbacks=[ends]).run({"x": 1})
    assert ends.cached() == {"first": True, "second": False, "third": False}


def test_version_overrides_code_identity(tmp_path):
    cache = DiskCache(tmp_path / "c")

    @node(output_name="y", version="1")
    def f(x):
        return x + 1

    Graph([f], cache=cache).run({"x": 1})

    @node(output_name="y", version="1")
    def f(x):  # noqa: F811 - a new body, same declared version
        return x + 100

    assert Graph([f], cache=cache).run({"x": 1})["y"] == 2


SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from hypernodes_dist import DiskCache, Graph, node

@node(output_name="size")
def size(items: frozenset, meta: dict, tags: set) -> int:
    return len(items) + len(meta) + len(tags)

class Ends:
    def __init__(self): self.cached = []
    def on_node_end(self, e): self.cached.append(e.cached)

ends = Ends()
g = Graph([size], cache=DiskCache({cache!r}), callbacks=[ends])
inputs = [frozenset({{"a", "b", "c"}}), frozenset({{1, 2}})]
res = g.map({{"items": inputs, "meta": {{"z": 1, "a": 2, "m": 3}}, "tags": {{"x", "y", "q"}}}},
            map_over="items")
print(json.dumps({{"cached": ends.cached, "size": [r["size"] for r in res]}}))
"""


def test_keys_identical_across_processes_and_hash_seeds(tmp_path):
    script = SCRIPT.format(root=str(ROOT), cache=str(tmp_path / "c"))
    runs = []
    for seed in ("1", "987"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == {"cached": [False, False], "size": [9, 8]}
    assert runs[1] == {"cached": [True, True], "size": [9, 8]}


def test_distinct_values_get_distinct_keys(tmp_path):
    calls = []

    @node(output_name="r")
    def ident(v):
        calls.append(v)
        return repr(v)

    g = Graph([ident], cache=DiskCache(tmp_path / "c"))
    values = [1, "1", 1.0, True, (1,), [1], {1}, frozenset({1}), b"1", None]
    first = g.map({"v": values}, map_over="v")
    assert len(calls) == len(values)
    second = g.map({"v": values}, map_over="v")
    assert len(calls) == len(values)
    assert [r["r"] for r in second] == [r["r"] for r in first] == [repr(v) for v in values]


def test_duplicates_inside_one_map_run_once(tmp_path):
    calls = []

    @node(output_name="r")
    def work(v):
        calls.append(v)
        return v * 2

    res = Graph([work], cache=DiskCache(tmp_path / "c")).map({"v": [5, 5, 6, 5, 6]}, map_over="v")
    assert sorted(calls) == [5, 6]
    assert [r["r"] for r in res] == [10, 10, 12, 10, 12]


def test_large_entry_corruption_is_a_miss(tmp_path):
    calls = []

    @node(output_name="blob")
    def big(n):
        calls.append(n)
        return b"x" * n

    cache_dir = tmp_path / "c"
    g = Graph([big], cache=ObjectStoreCache(str(cache_dir)))
    assert len(g.run({"n": 2_000_000})["blob"]) == 2_000_000
    (seg,) = cache_dir.rglob("*.seg")
    seg.write_bytes(seg.read_bytes()[:1000])  # truncate
    assert len(g.run({"n": 2_000_000})["blob"]) == 2_000_000
    assert calls == [2_000_000, 2_000_000]


def test_streaming_node_hit_emits_no_chunks(tmp_path):
    chunks = []

    class Watch:
        def on_streaming_chunk(self, event):
            chunks.append(event.chunk)

    @node(output_name="text")
    def talk(prompt):
        yield from prompt.split()

    g = Graph([talk], cache=DiskCache(tmp_path / "c"), callbacks=[Watch()])
    assert g.run({"prompt": "a b c"})["text"] == "abc"
    assert chunks == ["a", "b", "c"]
    assert g.run({"prompt": "a b c"})["text"] == "abc"
    assert chunks == ["a", "b", "c"]


def test_script_source_unavailable_still_caches(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from hypernodes_dist import DiskCache, Graph, ObjectStoreCache, node
        f = node(lambda x: x * 2, output_name="y", name="double")
        g = Graph([f], cache=DiskCache({str(tmp_path / 'c')!r}))
        print(g.run({{"x": 4}})["y"], g.run({{"x": 4}}).history[0].cached)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["8", "True"]


def test_slow_sync_calls_reach_the_disk_while_the_batch_runs(tmp_path):
    """A crash mid-batch loses at most ~0.5 s of finished work, however slow each call is."""
    import time as _time

    cache_dir = tmp_path / "c"
    seen: list[int] = []

    @node(output_name="y")
    def slow(x: int) -> int:
        if x == 6:  # by now ~0.9 s of finished calls: most must already be on disk
            seen.append(DiskCache(cache_dir).stats()["entries"])
        _time.sleep(0.15)
        return x * 2

    res = Graph([slow], cache=DiskCache(cache_dir)).map({"x": list(range(8))}, map_over="x")
    assert [r["y"] for r in res] == [x * 2 for x in range(8)]
    assert seen and seen[0] >= 3, seen


def test_unhashable_mapped_value_fails_only_its_item(tmp_path):
    import threading

    from hypernodes_dist.cache.hashing import UnhashableValueError

    @node(output_name="r")
    def show(v) -> str:
        return type(v).__name__

    values = [1, threading.Lock(), "x"]
    res = Graph([show], cache=DiskCache(tmp_path / "c")).map(
        {"v": values}, map_over="v", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert isinstance(res[1].error, UnhashableValueError)
    assert "'v'" in str(res[1].error) and "item 1" in " ".join(res[1].error.__notes__)
    assert [res[0]["r"], res[2]["r"]] == ["int", "str"]
