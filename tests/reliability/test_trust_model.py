"""Cache files are never unpickled without an integrity check; the README's trust model.

A planted entry whose pickle would run code on load (it creates a marker file) and whose
checksum does not match is a miss and the code never runs — inline (SQLite row) and
file-backed (``.val`` file) alike. The README's "Trust model of the cache" section says
what this guarantees and what it does not (a checksum is not a signature).

Resume after a driver crash (only unfinished items recomputed) is covered by
``tests/test_resume_map.py`` (owned by the main-job tests) and, for the killed-writer case,
by ``test_cache_faults.py::test_writer_killed_mid_write_leaves_nothing_that_reads_back_wrong``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import diskcache

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.cache.disk import _HEADER, _MAGIC

from . import graphs as G

ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this calls ``open(marker, "w")``: proof that code ran on load."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _hostile(marker: Path, pad: int = 0) -> bytes:
    """Right magic and format, a checksum that does not match, a code-running pickle
    (plus ``pad`` trailing bytes, which ``pickle.loads`` would ignore)."""
    payload = pickle.dumps(Payload(str(marker)), protocol=5)
    return _HEADER.pack(_MAGIC, 1, 0, b"\x00" * 16) + payload + b"." * pad


def test_planted_pickles_never_run(tmp_path):
    path = tmp_path / "cache"
    xs = [1, 2]
    g = Graph([G.make_blob], cache=DiskCache(path))
    for size in (64, 64 * 1024):
        g.map({"x": xs, "size": size}, map_over="x")
    raw = diskcache.Cache(str(path))
    keys = list(raw.iterkeys())
    assert len(keys) == 4
    markers = []
    for i, key in enumerate(keys):
        marker = tmp_path / f"pwned-{i}"
        markers.append(marker)
        # small keys stay inline; pad the others past 32 KiB so they are file-backed
        raw.set(key, _hostile(marker, pad=0 if i % 2 else 40 * 1024))
    raw.close()
    assert len(list(path.rglob("*.val"))) >= 2  # file-backed hostile entries exist
    res = Graph([G.make_blob], cache=DiskCache(path)).map(
        {"x": xs, "size": 64}, map_over="x")
    res2 = Graph([G.make_blob], cache=DiskCache(path)).map(
        {"x": xs, "size": 64 * 1024}, map_over="x")
    assert [r["blob"] for r in res] == [G.make_blob.func(x, 64) for x in xs]
    assert [r["blob"] for r in res2] == [G.make_blob.func(x, 64 * 1024) for x in xs]
    assert not any(m.exists() for m in markers), "a cache entry was unpickled unchecked"
    # control: the same pickle DOES run when loaded without the check
    pickle.loads(pickle.dumps(Payload(str(tmp_path / "control"))))
    assert (tmp_path / "control").exists()


def test_readme_trust_model_is_accurate():
    readme = (ROOT / "README.md").read_text()
    assert "## Trust model of the cache" in readme
    section = readme.split("## Trust model of the cache", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())
    for claim in ("trusted local data", "checksum", "before", "unpickling",
                  "not a signature"):
        assert claim in section, claim
    # the claim holds in the code: the only unpickling in cache.py is after the digest check
    src = (ROOT / "hypernodes_dist" / "cache" / "disk.py").read_text()
    assert src.count("pickle.loads(") == 1
    decode = src.split("def decode(", 1)[1].split("\ndef ", 1)[0]
    assert decode.index("xxh3_128_digest(payload) != digest") < decode.index("pickle.loads(")
    assert os.path.exists(ROOT / "tests" / "reliability" / "test_cache_faults.py")
