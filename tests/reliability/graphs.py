"""Importable node definitions for the reliability suite (its tests import them as ``R``;
the conformance suite's graphs are ``G``).

Everything here lives at module level so worker processes (Dask processes, ``dask worker``
processes, spawned writers) import it by name instead of unpickling closures.

``POOL`` is the fixed pool the property-based tests draw random DAGs from: simple
arithmetic nodes over a small alphabet of names. Each node reads one or two names and
writes one, so a random subset is a DAG whenever no name is both read and written in a
cycle; ``pick_dag`` keeps a subset valid (one producer per name, no cycles) by
construction.
"""

from __future__ import annotations

import os
import signal
import time

from hypernodes_dist import node

# --------------------------------------------------------------------------- random-DAG pool
# Inputs the pool can read: a, b, c (graph inputs, numbers). Produced names: p, q, r, s, t.
# Every node is total on numbers and raises TypeError on anything else (like real code).


@node(output_name="p")
def add_ab(a: int, b: int) -> int:
    return a + b


@node(output_name="p", name="mul_ab")
def mul_ab(a: int, b: int = 3) -> int:
    return a * b


@node(output_name="q")
def neg_a(a: int) -> int:
    return -a


@node(output_name="q", name="sq_c")
def sq_c(c: int) -> int:
    return c * c


@node(output_name="r")
def sub_pq(p: int, q: int) -> int:
    return p - q


@node(output_name="r", name="inc_p")
def inc_p(p: int, step: int = 1) -> int:
    return p + step


@node(output_name="s")
def twice_r(r: int) -> int:
    return 2 * r


@node(output_name="s", name="mix_qc")
def mix_qc(q: int, c: int = 0) -> int:
    return q * 10 + c


@node(output_name="t")
def div_s(s: int, b: int = 1) -> float:
    return s / b  # ZeroDivisionError when b == 0: a node's own exception at run time


@node(output_name="t", name="abs_r")
def abs_r(r: int) -> int:
    return abs(r)


# producers grouped by the name they write (at most one of each group in a graph)
POOL: dict[str, list] = {
    "p": [add_ab, mul_ab],
    "q": [neg_a, sq_c],
    "r": [sub_pq, inc_p],
    "s": [twice_r, mix_qc],
    "t": [div_s, abs_r],
}
LEVELS = ("p", "q", "r", "s", "t")
# each node reads only graph inputs (a, b, c, step) or names of an earlier level: acyclic.

# --------------------------------------------------------------------------- fault nodes


@node(output_name="y")
def slow_inc(x: int, delay: float = 0.02) -> int:
    time.sleep(delay)
    return x + 1


@node(output_name="z")
def slow_square(y: int, delay: float = 0.02) -> int:
    time.sleep(delay)
    return y * y


@node(output_name="boom")
def kill_my_worker(x: int, poison: int = 3) -> int:
    """Kills its own process (SIGKILL: no exception, no cleanup) on the poison item."""
    if x == poison:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@node(output_name="prep")
def prepare(x: int) -> int:
    return x * 10


@node(output_name="boom")
def kill_after_prepare(prep: int, poison: int = 30) -> int:
    if prep == poison:
        os.kill(os.getpid(), signal.SIGKILL)
    return prep + 1


@node(output_name="blob")
def make_blob(x: int, size: int = 64) -> bytes:
    """Deterministic bytes: ``size`` >= 32 KiB makes a file-backed cache entry."""
    seed = x.to_bytes(8, "little", signed=True)
    return (seed * (size // 8 + 1))[:size]


@node(output_name="length")
def blob_len(blob: bytes) -> int:
    return len(blob)


@node(output_name="w")
def tagged(x: int, tag: str) -> str:
    return f"{tag}:{x}"


@node(output_name="echo")
def echo(x: int, handle: object = None) -> int:
    return x


CALLS_ENV = "HN_RELIABILITY_CALLS"


@node(output_name="y")
def counted_inc(x: int) -> int:
    """``x + 1``; appends one line per call to the file named by ``$HN_RELIABILITY_CALLS``."""
    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{x}\n")
    return x + 1


@node(output_name="y")
def logged_inc(x: int, log_dir: str) -> int:
    """``x + 1``; leaves one file per call in ``log_dir`` (proves whether work started)."""
    import uuid

    with open(os.path.join(log_dir, uuid.uuid4().hex), "w") as f:
        f.write(str(x))
    return x + 1


class Handle:
    """An object with no canonical hash that cannot be pickled (it holds a lock)."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()


class HashableHandle(Handle):
    """Same, with the documented fallback: ``__hypernodes_hash__``."""

    __slots__ = ()

    def __hypernodes_hash__(self) -> str:
        return "handle-v1"
