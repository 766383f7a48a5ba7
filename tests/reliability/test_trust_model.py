"""Cache files are never unpickled without an integrity check; the README's trust model.

A planted entry whose pickle would run code on load (it creates a marker file) and whose
checksum does not match is a miss and the code never runs — in a DiskCache (SQLite row)
and an ObjectStoreCache (segment file) alike. The README's "Trust model of the cache" section says
what this guarantees and what it does not (a checksum is not a signature).

Resume after a driver crash (only unfinished items recomputed) is covered by
``tests/test_resume_map.py`` (owned by the main-job tests) and, for the killed-writer case,
by ``test_cache_faults.py::test_writer_killed_mid_write_leaves_nothing_that_reads_back_wrong``.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph, ObjectStoreCache
from hypernodes_dist.cache.segments import _BLOCK, _BLOCK_MAGIC

from . import graphs as R

ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this calls ``open(marker, "w")``: proof that code ran on load."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _hostile(marker: Path, count: int, length: int) -> bytes:
    """A block with the right magic and count, a checksum that does not match and a
    code-running pickle, padded to ``length`` (``pickle.loads`` ignores trailing bytes)."""
    payload = pickle.dumps([Payload(str(marker))] * count, protocol=5)
    block = _BLOCK.pack(_BLOCK_MAGIC, count, b"\x00" * 16) + payload
    return block + b"." * max(0, length - len(block))


def _plant(kind: str, path: Path, marker: Path) -> int:
    """Replace every stored segment by a hostile one; returns how many."""
    if kind == "disk":
        con = sqlite3.connect(path / "hn-cache.db")
        rows = con.execute("SELECT id, entries, length(data) FROM hn_segments").fetchall()
        with con:
            for i, n, length in rows:
                con.execute("UPDATE hn_segments SET data = ? WHERE id = ?",
                            (_hostile(marker, n, length), i))
        con.close()
        return len(rows)
    segs = list(path.rglob("*.seg"))
    for seg in segs:
        n = int(seg.stem.rsplit("-", 1)[1])
        seg.write_bytes(_hostile(marker, n, seg.stat().st_size))
    return len(segs)


@pytest.mark.parametrize("kind", ["disk", "objects"])
def test_planted_pickles_never_run(tmp_path, kind):
    path = tmp_path / "cache"

    def cache():
        return DiskCache(path) if kind == "disk" else ObjectStoreCache(str(path))

    xs = [1, 2]
    for size in (64, 64 * 1024):
        Graph([R.make_blob], cache=cache()).map({"x": xs, "size": size}, map_over="x")
    marker = tmp_path / "pwned"
    assert _plant(kind, path, marker) == 2
    res = Graph([R.make_blob], cache=cache()).map({"x": xs, "size": 64}, map_over="x")
    res2 = Graph([R.make_blob], cache=cache()).map({"x": xs, "size": 64 * 1024}, map_over="x")
    assert [r["blob"] for r in res] == [R.make_blob.func(x, 64) for x in xs]
    assert [r["blob"] for r in res2] == [R.make_blob.func(x, 64 * 1024) for x in xs]
    assert not marker.exists(), "a cache entry was unpickled unchecked"
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
    # the claim holds in the code: the cache unpickles only in segments.py, after the digests
    cache_dir = ROOT / "hypernodes_dist" / "cache"
    for module in cache_dir.glob("*.py"):
        if module.name != "segments.py":
            assert "pickle.loads(" not in module.read_text(), module.name
    src = (cache_dir / "segments.py").read_text()
    assert src.count("pickle.loads(") == 2
    for name, check in (("decode_block", "xxh3_128_digest(payload) != digest"),
                        ("decode_index", "xxh3_128_digest(body) != digest")):
        decode = src.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
        assert decode.index(check) < decode.index("pickle.loads(")
    assert os.path.exists(ROOT / "tests" / "reliability" / "test_cache_faults.py")
