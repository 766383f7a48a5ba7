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

import asyncio
import contextvars
import fcntl
import hashlib
import os
import random
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from .syncio import run_sync

__all__ = [
    "Policy",
    "NodeTimeoutError",
    "Exponential",
    "exponential",
    "make_policy",
    "parse_rate_limit",
    "backoff_delay",
    "Guard",
    "guarded_call",
    "limits_dir",
    "register_backend",
    "stats",
    "reset_stats",
]

ITEM: contextvars.ContextVar[int | None] = contextvars.ContextVar("hn_policy_item", default=None)


# ============================================================================ the policy


class NodeTimeoutError(TimeoutError):
    """A node call exceeded its ``timeout``; names the node, the item and the limit."""

    def __init__(self, message: str, node: str = "", item: int | None = None,
                 limit: float = 0.0) -> None:
        super().__init__(message)
        self.node, self.item, self.limit = node, item, limit

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.node, self.item, self.limit), self.__dict__)


@dataclass(frozen=True)
class Exponential:
    """``backoff="exponential"``: ``base * 2**(attempt-1)`` seconds, capped, with jitter.

    Jitter draws the wait uniformly from ``[d/2, d]`` so the workers of a cluster that fail
    together do not retry together.
    """

    base: float = 0.5
    cap: float = 30.0
    jitter: bool = True

    def __call__(self, attempt: int) -> float:
        d = min(self.cap, self.base * 2 ** (attempt - 1))
        return random.uniform(d / 2, d) if self.jitter else d


def exponential(base: float = 0.5, cap: float = 30.0, jitter: bool = True) -> Exponential:
    """A tuned exponential backoff: ``@node(retries=5, backoff=exponential(base=1))``."""
    if base < 0 or cap < 0:
        raise ValueError("exponential backoff: base and cap must be >= 0 seconds")
    return Exponential(float(base), float(cap), jitter)


@dataclass(frozen=True)
class Policy:
    """What a node's keywords ask for; picklable (it travels with the plan)."""

    node: str
    retries: int = 0
    backoff: Any = None  # None | seconds | Exponential | callable(attempt) -> seconds
    timeout: float | None = None
    concurrency: int | None = None
    rate: tuple[float, float] | None = None  # (count, per seconds)

    @property
    def rate_text(self) -> str:
        assert self.rate is not None
        count, per = self.rate
        return f"{count:g}/{per:g}s"


_UNITS = {
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-zA-Z]+)\s*$")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_rate_limit(value: Any, node: str = "?") -> tuple[float, float]:
    """``"100/minute"``, ``"5/s"``, ``"30/10s"`` or ``(count, seconds)`` -> ``(count, seconds)``."""
    hint = ('use "100/minute", "10/s", "30/10s" (units s, m/min/minute, h/hour, d/day) '
            "or a (count, seconds) tuple")
    if isinstance(value, str):
        m = _RATE.match(value)
        unit = _UNITS.get(m.group(3).lower()) if m else None
        if m is None or unit is None:
            raise ValueError(f"node {node!r}: cannot read rate_limit={value!r}; {hint}")
        count, per = float(m.group(1)), float(m.group(2) or 1) * unit
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_number, value)):
        count, per = float(value[0]), float(value[1])
    else:
        raise ValueError(f"node {node!r}: rate_limit must be a string or a (count, seconds) "
                         f"tuple, got {value!r}; {hint}")
    if count <= 0 or per <= 0:
        raise ValueError(f"node {node!r}: rate_limit={value!r} needs a positive count and period")
    return count, per


def make_policy(node: str, retries: Any = 0, backoff: Any = None, timeout: Any = None,
                concurrency: Any = None, rate_limit: Any = None) -> Policy | None:
    """Validate a node's policy keywords; ``None`` when none is set (no wrapper at all)."""
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"node {node!r}: retries must be an int >= 0, got {retries!r}")
    if backoff is not None and not callable(backoff):
        if backoff == "exponential":
            backoff = Exponential()
        elif not _number(backoff) or backoff < 0:
            raise ValueError(
                f"node {node!r}: backoff must be None, 'exponential', seconds >= 0 or a "
                f"callable(attempt) -> seconds, got {backoff!r}"
            )
    if timeout is not None and (not _number(timeout) or timeout <= 0):
        raise ValueError(f"node {node!r}: timeout must be positive seconds, got {timeout!r}")
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise ValueError(f"node {node!r}: concurrency must be an int >= 1, got {concurrency!r}")
    rate = parse_rate_limit(rate_limit, node) if rate_limit is not None else None
    if not retries and timeout is None and concurrency is None and rate is None:
        return None
    return Policy(node, retries, backoff, float(timeout) if timeout is not None else None,
                  concurrency, rate)


def backoff_delay(backoff: Any, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    if backoff is None:
        return 0.0
    if _number(backoff):
        return float(backoff)
    wait = float(backoff(attempt))
    if wait < 0:
        raise ValueError(f"backoff({attempt}) returned {wait} seconds; it must be >= 0")
    return wait


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


Report = Callable[[Any], Any]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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


def _limiter(kind: str, key: str, *spec: Any) -> Any:
    backend = _backend()
    cache_key = (backend.name, getattr(backend, "directory", ""), kind, key, *spec)
    with _LIMITERS_LOCK:
        found = _LIMITERS.get(cache_key)
        if found is None:
            found = _LIMITERS[cache_key] = getattr(backend, kind)(key, *spec)
    return found


_POLL_MIN, _POLL_MAX = 0.001, 0.025


class _Sleep(NamedTuple):
    """Effect: wait ``seconds`` (``time.sleep`` / ``asyncio.sleep``)."""

    seconds: float


class _Block(NamedTuple):
    """Effect: call ``fn()``, which blocks (in place / in a worker thread); its value is sent back."""

    fn: Callable[[], Any]


class _Invoke(NamedTuple):
    """Effect: one attempt of the node call, holding ``token`` (a concurrency slot or None,
    released by the driver when the call really ends); its value or error is sent back."""

    token: Any
    attempt: int


Steps = Generator["_Sleep | _Block | _Invoke", Any, Any]


def _acquire(slots: Any) -> Steps:
    """A concurrency slot: ``(token, seconds waited)``; blocks, or polls with backoff."""
    token = slots.try_acquire()
    if token is not None:
        return token, 0.0
    t0 = time.perf_counter()
    if getattr(slots, "acquire", None) is not None:
        return (yield _Block(slots.acquire)), time.perf_counter() - t0
    poll = _POLL_MIN
    while True:
        yield _Sleep(poll * random.uniform(0.5, 1.0))
        token = slots.try_acquire()
        if token is not None:
            return token, time.perf_counter() - t0
        poll = min(_POLL_MAX, poll * 2)


# ============================================================================ the guard


class Guard:
    """Applies one node's policy to its calls (one per node per batch, or per scheduler call).

    ``report(event)`` receives each ``PolicyEvent`` (the caller fills in the run ids).
    """

    def __init__(self, node: Any, report: Report | None = None) -> None:
        self.node = node
        self.policy: Policy = node.policy
        self.report = report
        p = self.policy
        self.slots = _limiter("slots", p.node, p.concurrency) if p.concurrency else None
        self.rate = _limiter("rate", p.node, *p.rate) if p.rate else None

    # -- events ------------------------------------------------------------------------
    def _event(self, kind: str, item: int | None, attempt: int, wait: float, reason: str) -> None:
        with _STATS_LOCK:
            _STATS[(self.policy.node, kind)] += 1
        if self.report is not None:
            from .events import PolicyEvent

            self.report(PolicyEvent(node_id=self.policy.node, tags=self.node.tags,
                                    item_index=item, kind=kind, attempt=attempt, wait=wait,
                                    reason=reason))

    def _timeout_error(self, item: int | None) -> NodeTimeoutError:
        p = self.policy
        where = f"node {p.node!r}" if item is None else f"node {p.node!r} (item {item})"
        return NodeTimeoutError(f"{where} timed out after {p.timeout:g} s (timeout={p.timeout:g})",
                                p.node, item, p.timeout or 0.0)

    def _give_up(self, exc: BaseException, attempt: int) -> BaseException:
        exc.hn_attempts = attempt  # type: ignore[attr-defined]
        if self.policy.retries:
            try:
                exc.add_note(f"hypernodes retries: gave up after {attempt} attempts "
                             f"(retries={self.policy.retries}); this is the last attempt's error")
            except AttributeError:
                pass
        return exc

    def _retry(self, exc: Exception, item: int | None, attempt: int) -> float:
        if attempt > self.policy.retries:
            raise self._give_up(exc, attempt)
        wait = backoff_delay(self.policy.backoff, attempt)
        self._event("retry", item, attempt, wait, _describe(exc))
        return wait

    # -- one guarded call, as effects (the sync and async drivers below perform them) -----
    def _steps(self, item: int | None, failed: Exception | None) -> Steps:
        """Attempts until one succeeds or retries run out (``failed``: a first attempt's
        error, already made by the caller)."""
        attempt, error = (1, failed) if failed is not None else (0, None)
        while True:
            if error is not None:
                wait = self._retry(error, item, attempt)  # raises once out of attempts
                if wait > 0:
                    yield _Sleep(wait)
            attempt += 1
            try:
                return (yield from self._attempt(item, attempt))
            except Exception as exc:
                error = exc

    def _attempt(self, item: int | None, attempt: int) -> Steps:
        """Concurrency slot -> rate-limit reservation -> the call."""
        p, slots, token = self.policy, self.slots, None
        if slots is not None:
            token, waited = yield from _acquire(slots)
            if waited > 0:
                self._event("throttle", item, attempt, waited, f"concurrency={p.concurrency}")
        try:
            if self.rate is not None:
                wait = self.rate.reserve()
                if wait > 0:
                    self._event("throttle", item, attempt, wait, f"rate_limit={p.rate_text}")
                    yield _Sleep(wait)
            held, token = token, None  # from here on the driver releases it
            return (yield _Invoke(held, attempt))
        finally:
            if token is not None:
                slots.release(token)  # type: ignore[union-attr]

    def _release(self, token: Any) -> None:
        if token is not None:
            self.slots.release(token)  # type: ignore[union-attr]

    # -- drivers: one loop, effects performed blocking (sync) or awaited (async) -------------
    async def _drive(self, steps: Steps, perform: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``steps`` to its result, performing each effect with ``perform``."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                reply = await perform(effect)
            except Exception as exc:
                error = exc

    def call(self, thunk: Callable[[], Any], item: int | None = None,
             failed: Exception | None = None) -> Any:
        """Run ``thunk()`` (one call of the node) under the policy; blocking waits.

        ``failed``: the error of a first attempt the caller already made.
        """
        async def perform(effect: Any) -> Any:  # never suspends: driven without a loop
            if type(effect) is _Sleep:
                return time.sleep(effect.seconds)
            if type(effect) is _Block:
                return effect.fn()
            return self._invoke(thunk, item, effect)

        return run_sync(self._drive(self._steps(item, failed), perform), needs_loop=False)

    def _invoke(self, thunk: Callable[[], Any], item: int | None, effect: _Invoke) -> Any:
        if self.policy.timeout is None:
            try:
                return thunk()
            finally:
                self._release(effect.token)
        return self._in_thread(thunk, item, effect.attempt, effect.token)

    def positional(self, fn: Callable[..., Any], items: Any) -> Callable[..., Any]:
        """``fn`` (positional arguments, one call per item in ``items`` order) guarded."""
        nxt = iter(items).__next__
        call = self.call
        p = self.policy
        if p.timeout is None and self.slots is None and self.rate is None:
            def retried(*args: Any) -> Any:  # retries only: the first attempt is a plain call
                item = nxt()
                try:
                    return fn(*args)
                except Exception as exc:
                    return call(lambda: fn(*args), item, exc)

            return retried

        def guarded(*args: Any) -> Any:
            return call(lambda: fn(*args), nxt())

        return guarded

    def _in_thread(self, thunk: Callable[[], Any], item: int | None, attempt: int,
                   token: Any) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = thunk()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                self._release(token)
                done.set()

        ctx = contextvars.copy_context()
        threading.Thread(target=ctx.run, args=(work,), daemon=True,
                         name=f"hn-timeout-{self.policy.node}").start()
        if not done.wait(self.policy.timeout):
            err = self._timeout_error(item)
            self._event("timeout", item, attempt, self.policy.timeout or 0.0, str(err))
            raise err
        if "error" in box:
            raise box["error"]
        return box["value"]

    async def acall(self, athunk: Callable[[], Awaitable[Any]], item: int | None = None) -> Any:
        """Await ``athunk()`` (one call of the node) under the policy."""
        async def perform(effect: Any) -> Any:
            if type(effect) is _Sleep:
                return await asyncio.sleep(effect.seconds)
            if type(effect) is _Block:
                return await asyncio.to_thread(effect.fn)
            return await self._ainvoke(athunk, item, effect)

        return await self._drive(self._steps(item, None), perform)

    async def _ainvoke(self, athunk: Callable[[], Awaitable[Any]], item: int | None,
                       effect: _Invoke) -> Any:
        timeout = self.policy.timeout
        try:
            if timeout is None:
                return await athunk()
            try:
                async with asyncio.timeout(timeout) as scope:
                    return await athunk()
            except TimeoutError:
                if not scope.expired():
                    raise  # the node's own TimeoutError
                err = self._timeout_error(item)
                self._event("timeout", item, effect.attempt, timeout, str(err))
                raise err from None
        finally:
            self._release(effect.token)


def awaits(node: Any) -> bool:
    """Whether calling ``node`` may suspend (async functions, async/lazy streams)."""
    return bool(node.is_async or (node.streaming and not node.is_generator))


async def guarded_call(node: Any, kwargs: dict[str, Any], on_chunk: Any, ctx: Any,
                       base: dict[str, Any]) -> Any:
    """The scheduler's call of a policy node (``run``/``iter``/per-item ``map``).

    ``ctx`` is the run's ``RunContext``; ``base`` the event fields of this execution.
    """
    from .invoke import call_node

    emit = ctx.emit
    item = ctx.item_index
    if awaits(node):
        report = _reporter(emit, base, None)
        return await Guard(node, report).acall(lambda: call_node(node, kwargs, on_chunk), item)
    if not ctx.parallel:  # sync graph driven without a loop: blocking waits, no suspension
        guard = Guard(node, _reporter(emit, base, None))
        return guard.call(lambda: run_sync(call_node(node, kwargs, on_chunk), needs_loop=False),
                          item)
    loop = asyncio.get_running_loop()  # parallel waves: keep the loop free, like _in_thread
    relay = None
    if on_chunk is not None:
        def relay(chunk: Any, index: int) -> None:
            loop.call_soon_threadsafe(on_chunk, chunk, index)

    guard = Guard(node, _reporter(emit, base, loop))
    return await asyncio.to_thread(
        guard.call, lambda: run_sync(call_node(node, kwargs, relay), needs_loop=False), item
    )


def _reporter(emit: Any, base: dict[str, Any], loop: Any) -> Report | None:
    if emit is None:
        return None

    def report(event: Any) -> None:
        for k, v in base.items():
            setattr(event, k, v)
        if loop is None:
            emit(event)
        else:
            loop.call_soon_threadsafe(emit, event)

    return report
