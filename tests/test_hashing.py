"""Unit tests of canonical value hashing and code identity (hypernodes_dist.cache.hashing)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import functools
import importlib.util
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from hypernodes_dist.cache.codeid import hash_code
from hypernodes_dist.cache.hashing import (
    UnhashableValueError,
    combine,
    hash_value,
    node_key,
)

ROOT = str(pathlib.Path(__file__).resolve().parents[1])


def test_ids_are_32_hex_chars() -> None:
    for value in (1, "x", None, [1, {"a": (2.5, b"z")}]):
        h = hash_value(value)
        assert len(h) == 32 and int(h, 16) >= 0


def test_type_tagged_values_are_distinct() -> None:
    values = [
        1, "1", 1.0, True, (1,), [1], {1}, frozenset({1}), b"1", bytearray(b"1"), None,
        0, 0.0, -0.0, False, "", b"", (), [], {}, set(), frozenset(), {"1": 1}, {1: "1"},
        ((1,),), [[1]], (1, 2), (2, 1), 1 + 0j, decimal.Decimal("1"), "None",
    ]  # fmt: skip
    ids = [hash_value(v) for v in values]
    assert len(set(ids)) == len(values)


def test_floats_are_deterministic() -> None:
    nan = float("nan")
    assert hash_value(nan) == hash_value(-nan) == hash_value(float("inf") - float("inf"))
    assert hash_value(-0.0) != hash_value(0.0)
    assert hash_value([nan]) == hash_value([float("nan")])


def test_dict_order_and_nesting() -> None:
    a = {"x": 1, "y": [1, {"z": {3, 4}}], 3: None}
    b = {3: None, "y": [1, {"z": {4, 3}}], "x": 1}
    assert hash_value(a) == hash_value(b)
    assert hash_value(a) != hash_value({**a, "x": 2})
    assert hash_value([1, 2]) != hash_value([2, 1])


def test_cycles_do_not_recurse_forever() -> None:
    lst: list = [1]
    lst.append(lst)
    d: dict = {}
    d["me"] = d
    assert hash_value(lst) == hash_value(lst)
    assert hash_value(d) != hash_value(lst)


def test_set_dict_hashes_stable_across_hash_seeds() -> None:
    code = (
        "from hypernodes_dist.cache.hashing import hash_value;"
        "print(hash_value({'a','b','c','d'}), hash_value(frozenset({'x','y',('z',1)})),"
        " hash_value({'k'+str(i): {str(i)} for i in range(20)}))"
    )
    outs = set()
    for seed in ("0", "123", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": ROOT}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(run.stdout)
    assert len(outs) == 1
    local = " ".join(
        [
            hash_value({"a", "b", "c", "d"}),
            hash_value(frozenset({"x", "y", ("z", 1)})),
            hash_value({"k" + str(i): {str(i)} for i in range(20)}),
        ]
    )
    assert outs.pop().strip() == local


def test_import_does_not_pull_heavy_libraries() -> None:
    code = (
        "import sys, hypernodes_dist.cache.hashing, hypernodes_dist.cache;"
        "print([m for m in ('numpy','pandas','pyarrow') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


@dataclasses.dataclass
class Point:
    x: int
    tags: set


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Plain:
    def __init__(self, items: set) -> None:
        self.items = items


class Custom:
    def __init__(self, ident: str) -> None:
        self.ident = ident
        self.lock = threading.Lock()

    def __hypernodes_hash__(self) -> str:
        return self.ident


def test_stdlib_and_user_types() -> None:
    assert hash_value(Point(1, {"a", "b"})) == hash_value(Point(1, {"b", "a"}))
    assert hash_value(Point(1, {"a"})) != hash_value(Point(2, {"a"}))
    assert hash_value(Color.RED) != hash_value(Color.BLUE)
    assert hash_value(Color.RED) != hash_value(1)
    nt = collections.namedtuple("NT", "a b")
    assert hash_value(nt(1, 2)) != hash_value((1, 2))
    assert hash_value(collections.OrderedDict(a=1)) != hash_value({"a": 1})
    dt = datetime.datetime(2024, 1, 2, 3, 4, 5)
    assert hash_value(dt) != hash_value(dt.date())
    assert hash_value(dt) == hash_value(datetime.datetime(2024, 1, 2, 3, 4, 5))
    assert hash_value(datetime.timedelta(1)) != hash_value(datetime.timedelta(2))
    assert hash_value(decimal.Decimal("1.10")) != hash_value(decimal.Decimal("1.1"))
    u = uuid.UUID(int=5)
    assert hash_value(u) == hash_value(uuid.UUID(int=5)) != hash_value(str(u))
    assert hash_value(pathlib.Path("/a/b")) != hash_value("/a/b")
    assert hash_value(Plain({"x", "y"})) == hash_value(Plain({"y", "x"}))
    assert hash_value(Plain({"x"})) != hash_value(Plain({"z"}))
    assert hash_value(Custom("a")) == hash_value(Custom("a")) != hash_value(Custom("b"))


def test_unhashable_values_name_their_type() -> None:
    with pytest.raises(UnhashableValueError, match="lock"):
        hash_value(threading.Lock())
    with pytest.raises(UnhashableValueError, match="generator"):
        hash_value(x for x in range(3))
    with socket.socket() as sock, pytest.raises(UnhashableValueError, match="socket"):
        hash_value({"conn": sock})
    assert issubclass(UnhashableValueError, TypeError)


def test_numpy_content_hash() -> None:
    np = pytest.importorskip("numpy")
    a = np.arange(12, dtype="int64").reshape(3, 4)
    assert hash_value(a) == hash_value(a.copy())
    assert hash_value(a) == hash_value(np.asfortranarray(a))
    b = a.copy()
    b[1, 2] = 99
    assert hash_value(a) != hash_value(b)
    assert hash_value(a) != hash_value(a.astype("int32"))
    assert hash_value(a) != hash_value(a.reshape(4, 3))
    assert hash_value(np.int64(1)) != hash_value(1) != hash_value(np.float64(1.0))
    assert hash_value(np.array(["2024-01-01"], dtype="M8[D]")) == hash_value(
        np.array(["2024-01-01"], dtype="M8[D]")
    )
    obj = np.array([{"a": 1}, None], dtype=object)
    assert hash_value(obj) == hash_value(np.array([{"a": 1}, None], dtype=object))


def test_pandas_content_hash() -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    assert hash_value(df) == hash_value(df.copy())
    changed = df.copy()
    changed.loc[1, "b"] = "Y"
    assert hash_value(df) != hash_value(changed)
    assert hash_value(df) != hash_value(df.rename(columns={"a": "c"}))
    assert hash_value(df) != hash_value(df.astype({"a": "float64"}))
    assert hash_value(df["a"]) == hash_value(df["a"].copy()) != hash_value(df["a"] + 1)
    assert hash_value(df.index) != hash_value(df["a"])
    lists = pd.DataFrame({"a": [[1], [2]]})
    assert hash_value(lists) == hash_value(pd.DataFrame({"a": [[1], [2]]}))
    assert hash_value(lists) != hash_value(pd.DataFrame({"a": [[1], [3]]}))


def test_pyarrow_content_hash() -> None:
    pa = pytest.importorskip("pyarrow")
    t = pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    rechunked = pa.concat_tables([t.slice(0, 1), t.slice(1)])
    assert hash_value(t) == hash_value(rechunked)
    t2 = pa.table({"a": [1, 2, 4], "b": ["x", "y", "z"]})
    assert hash_value(t) != hash_value(t2)
    assert hash_value(pa.array([1, 2])) == hash_value(pa.array([1, 2]))
    assert hash_value(pa.array([1, 2])) != hash_value(pa.array([1, 3]))
    ca = pa.chunked_array([[1], [2, 3]])
    assert hash_value(ca) == hash_value(pa.chunked_array([[1, 2], [3]]))
    batch = t.to_batches()[0]
    assert hash_value(batch) == hash_value(pa.RecordBatch.from_pydict(t.to_pydict()))
    assert hash_value(batch) != hash_value(t)


def test_combine_and_node_key() -> None:
    assert combine("a", "b") != combine("b", "a")
    assert combine("ab", "c") != combine("a", "bc")
    code = hash_code(len)
    k = node_key(code, [("x", hash_value(1)), ("y", hash_value(2))])
    assert k == node_key(code, [("y", hash_value(2)), ("x", hash_value(1))])
    assert k != node_key(code, [("x", hash_value(2)), ("y", hash_value(1))])
    assert k != node_key(code, [("x", hash_value(1)), ("y", hash_value(2))], "sess_1")
    assert node_key(code, [], "run_1") != node_key(code, [], "run_2")
    assert node_key(code, [], "") != node_key(code, [])


# ------------------------------------------------------------------------ hash_code


def _load(tmp_path: pathlib.Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MOD = """
import functools

def deco(f):
    return f

def helper(x):
    return x * 2

def unrelated():
    return {unrelated}

@deco
def node_fn(x, y=3):
    return helper(x) + y{extra}
"""


def test_hash_code_tracks_body_helpers_and_ignores_unrelated(tmp_path: pathlib.Path) -> None:
    base = _load(tmp_path, "m_base", MOD.format(unrelated=1, extra=""))
    same = _load(tmp_path, "m_same", MOD.format(unrelated=1, extra=""))
    other = _load(tmp_path, "m_other", MOD.format(unrelated=2, extra=""))
    body = _load(tmp_path, "m_body", MOD.format(unrelated=1, extra=" + 1"))
    helper = _load(
        tmp_path, "m_helper", MOD.format(unrelated=1, extra="").replace("x * 2", "x * 3")
    )
    redecorated = _load(
        tmp_path, "m_redeco", MOD.format(unrelated=1, extra="").replace("@deco\n", "")
    )
    h = hash_code(base.node_fn)
    assert h == hash_code(same.node_fn)
    assert h == hash_code(other.node_fn)
    assert h == hash_code(redecorated.node_fn)
    assert h != hash_code(body.node_fn)
    assert h != hash_code(helper.node_fn)
    base.node_fn.__defaults__ = (4,)
    assert hash_code(base.node_fn) != h


def test_hash_code_stable_across_processes(tmp_path: pathlib.Path) -> None:
    _load(tmp_path, "m_proc", MOD.format(unrelated=1, extra=""))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import m_proc;"
        "from hypernodes_dist.cache.codeid import hash_code; print(hash_code(m_proc.node_fn))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "99", "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import m_proc  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    assert out.stdout.strip() == hash_code(m_proc.node_fn), out.stderr


def _make(factor):
    def scaled(x):
        return x * factor

    return scaled


def test_hash_code_closures_partials_instances_version() -> None:
    assert hash_code(_make(2)) == hash_code(_make(2))
    assert hash_code(_make(2)) != hash_code(_make(3))
    assert hash_code(_make({"a", "b"})) == hash_code(_make({"b", "a"}))
    lock_closure = _make(threading.Lock())
    assert hash_code(lock_closure) == hash_code(lock_closure)  # opaque values count by type

    def add(a, b):
        return a + b

    assert hash_code(functools.partial(add, 1)) == hash_code(functools.partial(add, 1))
    assert hash_code(functools.partial(add, 1)) != hash_code(functools.partial(add, 2))

    class Scale:
        def __init__(self, k: int) -> None:
            self.k = k

        def __call__(self, x: int) -> int:
            return x * self.k

    assert hash_code(Scale(2)) == hash_code(Scale(2)) != hash_code(Scale(3))
    assert hash_code(len) == hash_code(len) != hash_code(abs)
    assert hash_code(add, version="1") == hash_code(add, version="1")
    assert hash_code(add, version="1") != hash_code(add, version="2")

    @functools.wraps(add)
    def wrapper(*a):
        return add(*a)

    assert hash_code(wrapper) == hash_code(add)


def test_hash_code_without_source() -> None:
    ns: dict = {}
    exec("f = lambda x: x + 1\ng = lambda x: x + 2\nh = lambda x: x + 1", ns)
    assert hash_code(ns["f"]) == hash_code(ns["h"])
    assert hash_code(ns["f"]) != hash_code(ns["g"])
    exec("def r(n):\n    return r(n - 1) if n else 0", ns)
    assert hash_code(ns["r"]) == hash_code(ns["r"])  # self-recursion terminates


def test_functions_as_values_hash_by_code() -> None:
    assert hash_value(_make(2)) == hash_value(_make(2)) != hash_value(_make(3))


def test_hash_column_equals_hash_value_per_value() -> None:
    from hypernodes_dist.cache.hashing import hash_column

    for column in ([0, 1, -5, 2**70], ["a", "é", "", "x" * 1000], ["a", "\ud800"],
                   [1, True, 1.0, "1", None], [], [(1,), [1], {1}]):
        assert hash_column(column) == [hash_value(v) for v in column]
