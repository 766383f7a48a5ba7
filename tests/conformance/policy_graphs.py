"""Nodes of the policy conformance tests, at module level so worker processes import them.

Everything a test measures goes through files in ``log_dir`` (an input), never memory:
worker processes of Dask and Daft do not share it with the driver.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from hypernodes_dist import branch, node


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def attempts(log_dir: str, tag: str, x: int) -> int:
    """Calls recorded so far for ``(tag, x)``."""
    path = Path(log_dir) / f"{tag}-{x}.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _attempt(log_dir: str, tag: str, x: int) -> int:
    _append(Path(log_dir) / f"{tag}-{x}.log", str(os.getpid()))
    return attempts(log_dir, tag, x)


class FlakyError(ConnectionError):
    """A simulated provider failure."""


# --------------------------------------------------------------------------- retries


@node(output_name="y", retries=2, backoff=0.01)
def pol_flaky(x: int, log_dir: str) -> int:
    """Fails on its first two calls for each item, then succeeds."""
    if _attempt(log_dir, "flaky", x) <= 2:
        raise FlakyError(f"provider hiccup for {x}")
    return x * 10


@node(output_name="y", retries=2, backoff=lambda attempt: 0.005 * attempt)
async def pol_aflaky(x: int, log_dir: str) -> int:
    await asyncio.sleep(0)
    if _attempt(log_dir, "aflaky", x) <= 2:
        raise FlakyError(f"provider hiccup for {x}")
    return x * 10


@node(output_name="z")
def pol_after(y: int) -> int:
    return y + 1


@node(output_name="y", retries=1, backoff=0.01)
def pol_always_fails(x: int, log_dir: str) -> int:
    n = _attempt(log_dir, "fails", x)
    raise ValueError(f"attempt {n} failed for item {x}")


@node(output_name="y", retries=3, backoff=0.001, retry_on=(ConnectionError, TimeoutError))
async def pol_selective(x: int, log_dir: str) -> int:
    """Even items: a transient error once (retried); odd items: a permanent one (not)."""
    n = _attempt(log_dir, "selective", x)
    if x % 2:
        raise ValueError(f"bad input {x}")
    if n == 1:
        raise FlakyError(f"provider hiccup for {x}")
    return x * 10


@node(output_name="y", retries=1, backoff=0.2)
async def pol_backoff(x: int, log_dir: str) -> int:
    """Fails its first call for each item, then succeeds after the 0.2 s back-off."""
    if _attempt(log_dir, "backoff", x) == 1:
        raise FlakyError(f"provider hiccup for {x}")
    return x


# retries in the per-item scheduler path (a branch makes the plan dynamic)
@branch(when_true="pol_flaky", when_false="pol_skip")
def pol_route(x: int) -> bool:
    return x >= 0


@node(output_name="y")
def pol_skip(x: int) -> int:
    return -1


# --------------------------------------------------------------------------- timeouts


HOLD = 60.0  # seconds a held call waits for its release at most


def release(log_dir: str) -> None:
    """Let held calls (``pol_sleepy``, ``pol_asleepy``) run on to their end."""
    (Path(log_dir) / "release").touch()


def finished(log_dir: str) -> bool:
    """Whether a held call ran to its end."""
    return (Path(log_dir) / "finished").exists()


@node(output_name="y", timeout=0.2)
def pol_sleepy(x: int, log_dir: str) -> int:
    if x == 1:  # held until released: abandoned after 0.2 s (a sync call cannot be killed)
        deadline = time.monotonic() + HOLD
        while not (Path(log_dir) / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        _append(Path(log_dir) / "finished", str(x))
    return x


@node(output_name="y", timeout=0.2)
async def pol_asleepy(x: int, log_dir: str) -> int:
    if x == 1:  # held until released: cancelled after 0.2 s
        deadline = time.monotonic() + HOLD
        while not (Path(log_dir) / "release").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        _append(Path(log_dir) / "finished", str(x))
    return x


# --------------------------------------------------------------------------- limits


def _interval(log_dir: str, t0: float) -> None:
    _append(Path(log_dir) / "intervals.log", f"{t0!r} {time.time()!r}")


@node(output_name="y", concurrency=2)
async def pol_conc2(x: int, log_dir: str) -> int:
    t0 = time.time()
    await asyncio.sleep(0.04)
    _interval(log_dir, t0)
    return x


@node(output_name="y", concurrency=1)
def pol_conc1(x: int, log_dir: str) -> int:
    t0 = time.time()
    time.sleep(0.02)
    _interval(log_dir, t0)
    return x


RATE = 5.0  # calls per second: slow enough that calls contend (and are throttled) under load


@node(output_name="y", rate_limit=(RATE, 1.0))
def pol_rated(x: int, log_dir: str) -> int:
    _append(Path(log_dir) / "starts.log", repr(time.time()))
    return x


def max_overlap(log_dir: str) -> tuple[int, int]:
    """``(calls, most calls running at once)`` from the recorded intervals."""
    lines = (Path(log_dir) / "intervals.log").read_text().split("\n")
    marks = []
    for line in filter(None, lines):
        a, b = map(float, line.split())
        marks += [(a, 1), (b, -1)]
    marks.sort(key=lambda m: (m[0], m[1]))  # an end at the same instant frees before a start
    running = peak = 0
    for _, step in marks:
        running += step
        peak = max(peak, running)
    return len(marks) // 2, peak


@node(output_name="backend")
def pol_backend(x: int) -> str:
    """Which limits backend a policy node would use where this item runs."""
    from hypernodes_dist.policies.limits import backend

    return backend().name
