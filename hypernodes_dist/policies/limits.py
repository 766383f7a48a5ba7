"""Per-node call policies: retries with backoff, timeouts, concurrency and rate limits.

``@node(retries=2, backoff="exponential", timeout=30, concurrency=4, rate_limit="100/minute")``
builds a ``Policy`` (``node.policy``; ``None`` when no keyword is set, and then nothing here
runs: the executors call the function exactly as before). Executors wrap the *call* of a
policy node once per batch (or per scheduler call) in a ``Guard``:

    for each attempt:  concurrency slot -> rate-limit reservation -> call (under timeout)
    on an exception:   PolicyEvent(kind="retry"), sleep backoff(attempt), next attempt
    out of attempts:   the last attempt's exception, with ``hn_attempts`` and a note

Only the failed node of the failed item is re-run; a cache hit never calls the function, so
it takes no slot and no rate token. Retries count against the rate limit (each attempt is a
request to the provider).

Timeouts: async nodes run under ``asyncio.timeout`` (the coroutine is cancelled). A sync
function cannot be killed from Python: it runs in a helper thread and the caller stops
waiting; the thread is abandoned and runs to its end in the background (it keeps its
concurrency slot until then, so "at most N executions overlap" stays true). The error is a
``NodeTimeoutError`` (a ``TimeoutError``) naming the node, the item and the limit.

Limits hold across every thread and process of one machine: the state lives in lock files
under ``limits_dir()`` (``$HYPERNODES_LIMITS_DIR``, default ``<tmp>/hypernodes-limits-<uid>``),
keyed by node name and limit, so all workers of a Dask process pool, a LocalCluster or Daft
agree without anything shipped to them. A concurrency limit of N is N slot files locked with
``fcntl.flock`` (a crashed process releases its slots with its file descriptors); a rate
limit of R per S seconds is a GCRA reservation in one flock-protected file: calls start at
least ``S/R`` seconds apart (no burst), so N calls take at least ``(N-1)*S/R`` seconds. On a
multi-machine cluster, an engine plugin registers another backend (``register_backend``):
``hypernodes_dask`` uses the scheduler's ``distributed.Semaphore`` / ``Lock`` + ``Variable``
inside ``distributed`` workers, so limits hold cluster-wide there.

Observability: ``PolicyEvent`` (``kind`` = ``"retry"`` | ``"throttle"`` | ``"timeout"``, with
``attempt``, ``wait`` seconds and ``reason``) reaches callbacks like every other event, on
every engine; ``stats()`` counts the same per process.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["limits_dir", "register_backend", "limiter", "record", "stats", "reset_stats",
           "FileLimits", "FileSlots", "FileRate"]

# ============================================================================ observability

_STATS: Counter[tuple[str, str]] = Counter()
_STATS_LOCK = threading.Lock()


def stats() -> dict[tuple[str, str], int]:
    """Per-process counts ``{(node, kind): n}`` of retries, throttling waits and timeouts."""
    with _STATS_LOCK:
        return dict(_STATS)


def reset_stats() -> None:
    with _STATS_LOCK:
        _STATS.clear()


def record(node: str, kind: str) -> None:
    """Count one ``kind`` event (retry, throttle, timeout) of ``node`` in this process."""
    with _STATS_LOCK:
        _STATS[(node, kind)] += 1


# ============================================================================ limits


def limits_dir() -> str:
    """Where this machine's limit state lives (``$HYPERNODES_LIMITS_DIR`` overrides)."""
    path = os.environ.get("HYPERNODES_LIMITS_DIR") or os.path.join(
        tempfile.gettempdir(), f"hypernodes-limits-{os.getuid()}"
    )
    os.makedirs(path, exist_ok=True)
    return path


def _file_key(key: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:60]
    return f"{safe}-{hashlib.blake2b(key.encode(), digest_size=4).hexdigest()}"


class _Fd:
    """A file descriptor reopened after a fork (a forked child must not share lock state)."""

    def __init__(self, path: str) -> None:
        self.path, self.pid, self.fd = path, -1, -1

    def get(self) -> int:
        if self.pid != os.getpid():
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self.pid = os.getpid()
        return self.fd


class FileSlots:
    """N concurrency slots: slot files locked with ``flock`` (per machine, any process)."""

    def __init__(self, directory: str, key: str, n: int) -> None:
        base = os.path.join(directory, f"{_file_key(key)}.c{n}")
        self.n = n
        self.fds = [_Fd(f"{base}.{k}.lock") for k in range(n)]
        # flock is per open file: threads of one process sharing it need their own exclusion
        self.local = [threading.Lock() for _ in range(n)]

    def try_acquire(self) -> int | None:
        start = random.randrange(self.n)
        for j in range(self.n):
            k = (start + j) % self.n
            if not self.local[k].acquire(blocking=False):
                continue
            try:
                fcntl.flock(self.fds[k].get(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return k
            except BlockingIOError:
                self.local[k].release()
            except BaseException:
                self.local[k].release()
                raise
        return None

    def release(self, token: int) -> None:
        try:
            fcntl.flock(self.fds[token].get(), fcntl.LOCK_UN)
        finally:
            self.local[token].release()


class FileRate:
    """A rate limit of ``count`` per ``per`` seconds: a GCRA reservation in one locked file.

    Each call reserves the next start time ``max(tat, now)`` and moves ``tat`` one interval
    ``per/count`` later; the caller sleeps until its start. FIFO, no polling, no burst.
    """

    def __init__(self, directory: str, key: str, count: float, per: float) -> None:
        self.interval = per / count
        self.fd = _Fd(os.path.join(directory, f"{_file_key(key)}.r{count:g}-{per:g}.rate"))
        self.local = threading.Lock()

    def reserve(self) -> float:
        with self.local:
            fd = self.fd.get()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(fd, 64, 0)
                now = time.time()
                try:
                    tat = float(raw.decode() or 0.0)
                except ValueError:
                    tat = 0.0
                if tat - now > 86400:  # a clock that jumped back: start over
                    tat = 0.0
                start = max(tat, now)
                data = repr(start + self.interval).encode().ljust(64)
                os.pwrite(fd, data, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        return start - now


class FileLimits:
    """The default backend: limit state in lock files of one directory (one machine)."""

    name = "file"

    def __init__(self) -> None:
        self.directory = limits_dir()

    def slots(self, key: str, n: int) -> Any:
        return FileSlots(self.directory, key, n)

    def rate(self, key: str, count: float, per: float) -> Any:
        return FileRate(self.directory, key, count, per)


_PROBES: list[Callable[[], Any]] = []
_LIMITERS: dict[tuple[Any, ...], Any] = {}
_LIMITERS_LOCK = threading.Lock()
_FILE: FileLimits | None = None


def register_backend(probe: Callable[[], Any]) -> None:
    """Register ``probe() -> backend | None``; the first backend a probe returns is used.

    A backend has ``name``, ``slots(key, n)`` (``try_acquire() -> token | None``,
    ``release(token)``, optionally blocking ``acquire() -> token``) and
    ``rate(key, count, per)`` (``reserve() -> seconds to wait``).
    """
    if probe not in _PROBES:
        _PROBES.append(probe)


def _backend() -> Any:
    global _FILE
    for probe in _PROBES:
        found = probe()
        if found is not None:
            return found
    if _FILE is None or _FILE.directory != limits_dir():
        _FILE = FileLimits()
    return _FILE


def limiter(kind: str, key: str, *spec: Any) -> Any:
    backend = _backend()
    cache_key = (backend.name, getattr(backend, "directory", ""), kind, key, *spec)
    with _LIMITERS_LOCK:
        found = _LIMITERS.get(cache_key)
        if found is None:
            found = _LIMITERS[cache_key] = getattr(backend, kind)(key, *spec)
    return found


