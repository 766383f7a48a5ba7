"""Tests of ``hypernodes-dist cache info|clear`` run as real subprocesses."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from hypernodes_dist.cache.disk import DiskCache
from hypernodes_dist.cli import build_parser, main

ROOT = str(pathlib.Path(__file__).resolve().parents[1])


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "hypernodes_dist.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def filled(tmp_path: pathlib.Path) -> str:
    path = str(tmp_path / "cache")
    DiskCache(path).set_many({f"g{i}": i for i in range(4)}, node="clean")
    DiskCache(path, scope="session").set_many({"s0": "x", "s1": b"y" * 100_000}, node="fetch")
    DiskCache(path, scope="run").set_many({"r0": None}, node="clean")
    return path


def test_info_reports_entries_size_and_scopes(filled: str) -> None:
    out = _cli("cache", "info", filled)
    assert out.returncode == 0, out.stderr
    assert "entries: 7" in out.stdout
    assert "scope global: 4 entries" in out.stdout
    assert "scope session: 2 entries" in out.stdout
    assert "scope run: 1 entries" in out.stdout
    assert "node clean: 5 entries" in out.stdout and "node fetch: 2 entries" in out.stdout
    js = _cli("cache", "info", filled, "--json")
    stats = json.loads(js.stdout)
    assert stats["entries"] == 7 and stats["size_bytes"] > 100_000
    assert stats["by_scope"]["session"]["bytes"] > 100_000
    assert stats["by_node"]["fetch"] == stats["by_scope"]["session"]


def test_clear_one_scope_then_all(filled: str) -> None:
    out = _cli("cache", "clear", filled, "--scope", "session")
    assert out.returncode == 0, out.stderr
    assert "removed 2 entries" in out.stdout
    cache = DiskCache(filled)
    assert cache.get_many(["s0", "s1", "g0"]) == {"g0": 0}
    assert DiskCache(filled, scope="run").get_many(["r0"]) == {"r0": None}  # a handle reads its scope
    out = _cli("cache", "clear", filled)
    assert out.returncode == 0 and "removed 5 entries" in out.stdout
    assert json.loads(_cli("cache", "info", filled, "--json").stdout)["entries"] == 0


def test_errors(tmp_path: pathlib.Path, filled: str) -> None:
    missing = _cli("cache", "info", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no cache" in missing.stderr
    assert not (tmp_path / "nope").exists()  # info never creates a cache
    bad_scope = _cli("cache", "clear", filled, "--scope", "forever")
    assert bad_scope.returncode == 2 and "invalid choice" in bad_scope.stderr
    assert _cli().returncode == 2
    assert _cli("cache").returncode == 2


def test_in_process_main_and_parser(filled: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["cache", "info", filled]) == 0
    assert "entries: 7" in capsys.readouterr().out
    assert main(["cache", "clear", filled, "--scope", "run"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert "cache" in commands


def test_clear_one_node_on_both_backends(tmp_path: pathlib.Path) -> None:
    from hypernodes_dist import ObjectStoreCache

    disk, objects = str(tmp_path / "disk"), str(tmp_path / "objects")
    for cache in (DiskCache(disk), ObjectStoreCache(objects)):
        cache.set_many({"a1": 1, "a2": 2}, node="alpha")
        cache.set_many({"b1": 1}, node="beta")
    for path, cls in ((disk, DiskCache), (objects, ObjectStoreCache)):
        out = _cli("cache", "clear", path, "--node", "alpha")
        assert out.returncode == 0, out.stderr
        assert "removed 2 entries (all scopes, node 'alpha')" in out.stdout
        assert cls(path).get_many(["a1", "a2", "b1"]) == {"b1": 1}
        info = _cli("cache", "info", path)
        assert "node beta: 1 entries" in info.stdout and "alpha" not in info.stdout
    assert DiskCache(disk).clear(node="beta") == 1  # the Python equivalent
    assert ObjectStoreCache(objects).clear(node="beta") == 1


@pytest.mark.parametrize("kind", ["disk", "objects"])
def test_prune_by_age_then_by_size(tmp_path: pathlib.Path, kind: str) -> None:
    """Entries not used for the given age go; then the least recently used beyond the size."""
    from hypernodes_dist.cache.objectstore import ObjectStoreCache

    make = DiskCache if kind == "disk" else ObjectStoreCache
    for age in (1, 4, 16):  # a loaded machine may start the CLI more than 1 s after the read
        path = str(tmp_path / f"cache-{age}")
        cache = make(path)
        cache.set_many({f"old{i}": "x" * 5000 + str(i) for i in range(4)}, node="old")
        cache.set_many({f"used{i}": "y" * 5000 + str(i) for i in range(4)}, node="used")
        time.sleep(age + 0.3)
        since = time.monotonic()  # the oldest entry that must stay: new0-*
        for batch in range(3):
            cache.set_many({f"new{batch}-{i}": "z" * 5000 + str(i) for i in range(4)},
                           node="new")
            time.sleep(0.02)
        reader = make(path, size_limit="1GB")  # a reader records what it uses (for eviction)
        assert len(reader.get_many([f"used{i}" for i in range(4)], node="used")) == 4
        reader.close()
        out = _cli("cache", "prune", path, "--older-than", f"{age}s")
        if time.monotonic() - since < age:  # the prune ran within `age` of the new writes
            break
    assert out.returncode == 0, out.stderr
    assert "removed 1 segments (4 entries" in out.stdout, out.stdout
    assert f"not used for {age}s" in out.stdout
    assert "kept 16 entries" in out.stdout
    assert make(path).get_many(["old0", "used0"]) == {"used0": "y" * 5000 + "0"}

    out = _cli("cache", "prune", path, "--max-size", "45KB", "--older-than", "7d")
    assert out.returncode == 0, out.stderr
    assert "removed 2 segments (8 entries" in out.stdout and "beyond 45KB" in out.stdout
    left = make(path).get_many([f"{k}" for k in ("used0", "new0-0", "new1-0", "new2-0")])
    assert sorted(left) == ["new2-0", "used0"]  # the newest write and the latest read


def test_prune_errors(tmp_path: pathlib.Path, filled: str) -> None:
    out = _cli("cache", "prune", filled)
    assert out.returncode == 2 and "--older-than AGE and/or --max-size SIZE" in out.stderr
    out = _cli("cache", "prune", filled, "--older-than", "soon")
    assert out.returncode == 2 and "is not an age" in out.stderr
    out = _cli("cache", "prune", filled, "--max-size", "big")
    assert out.returncode == 2 and "is not a size" in out.stderr
    out = _cli("cache", "prune", str(tmp_path / "nothing"), "--max-size", "1GB")
    assert out.returncode == 2 and "no cache at" in out.stderr
