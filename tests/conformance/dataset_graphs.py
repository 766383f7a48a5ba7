"""Graphs of the dataset conformance tests (module level: worker processes import them)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

from hypernodes_dist import node


@node(output_name="clean")
def normalize(text: str) -> str:
    if text == "boom":
        raise ValueError("cannot normalize 'boom'")
    return text.strip().lower()


@node(output_name=("words", "chars"))
def measure(clean):
    return len(clean.split()), len(clean)


@node(output_name="label")
def label(words, bonus: int = 0):
    return {"size": "long" if words + bonus > 2 else "short", "n": words + bonus}


@node(output_name="shape")
def shape(clean):
    return (len(clean), clean[:1])  # a tuple: stored pickled, read back as a tuple


ENRICH = [normalize, measure, label]
WITH_OBJECT = [normalize, measure, shape]


def expected(text: str, bonus: int = 0) -> dict:
    clean = text.strip().lower()
    words = len(clean.split())
    return {"clean": clean, "words": words, "chars": len(clean),
            "label": {"size": "long" if words + bonus > 2 else "short", "n": words + bonus}}


def texts(n: int) -> list[str]:
    return [f"  Row {i} " + "w " * (i % 4) for i in range(n)]


# ------------------------------------------------------------------ counting executions

_FDS: dict[tuple[int, str], int] = {}


@node(output_name="y")
def logged_square(x: int, log_dir: str, delay: float = 0.0) -> int:
    """Sleeps ``delay``, then appends ``x`` to this process's log in ``log_dir``."""
    if delay:
        time.sleep(delay)
    key = (os.getpid(), log_dir)
    fd = _FDS.get(key)
    if fd is None:
        fd = _FDS[key] = os.open(os.path.join(log_dir, f"{os.getpid()}.log"),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"{x} {threading.get_ident()}\n".encode())
    return x * x


def logged(log_dir, suffix: str = ".log") -> list[int]:
    """Every ``x`` logged so far in ``*.log`` files, over all processes."""
    out = []
    for f in sorted(n for n in os.listdir(log_dir) if n.endswith(suffix)):
        with open(os.path.join(log_dir, f)) as fh:
            out += [int(line.split()[0]) for line in fh if len(line.split()) == 2]
    return out


# ------------------------------------------------------------------ one file per execution


@node(output_name="y")
def timed_square(x, log_dir: str, delay: float = 0.0):  # no annotation: rows fix the type
    """Sleeps ``delay``, then records this execution as its own file in ``log_dir`` (the
    row, and when it finished), so a process killed at any moment leaves whole records."""
    if delay:
        time.sleep(delay)
    name = f"{x}.{os.getpid()}.{threading.get_ident()}.{time.perf_counter_ns()}"
    with open(os.path.join(log_dir, name), "w") as f:
        f.write(repr(time.time()))
    return x * x


@node(output_name="y", concurrency=32)
async def timed_call(x, log_dir: str, delay: float = 0.0):
    """``timed_square`` as an async call taking ``delay`` give or take half (32 in flight),
    like a paid API call."""
    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
    name = f"{x}.{os.getpid()}.{threading.get_ident()}.{time.perf_counter_ns()}"
    with open(os.path.join(log_dir, name), "w") as f:
        f.write(repr(time.time()))
    return x * x


def executions(log_dir) -> list[tuple[int, float]]:
    """``(row, finished at)`` of every execution of ``timed_square`` recorded in ``log_dir``."""
    out = []
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name)) as f:
            text = f.read()
        if text:
            out.append((int(name.split(".")[0]), float(text)))
    return out
