"""Machine-wide limit state: kernel semaphores for concurrency, a locked file for rates.

Every process of one machine (Dask worker processes, a LocalCluster, Daft, several maps at
once) shares the limits without anything shipped to it:

- ``concurrency=N`` is a System V semaphore of value N, created on first use (key derived
  from ``limits_dir()``, the node and N). Taking a unit is one ``semop`` (non-blocking, or
  blocking in the kernel: a waiting process sleeps until a unit is returned, it never
  polls). Every operation carries ``SEM_UNDO``: the kernel gives back the units a crashed
  process held. The semaphore is created with value 0 and its creator then adds N, so a
  process that opens it in between simply waits for the capacity (no initialisation race).
- ``rate_limit`` of R per S seconds is a GCRA reservation in one ``flock``-protected file:
  a reservation of ``k`` starts takes the next free start time and moves it ``k*S/R``
  seconds on (blocking ``flock``: the kernel wakes the next process). A metered quantity's
  rate is the same file, reserved by amounts (a negative amount gives time back).
- A map's budget totals and a node's Retry-After hold-off are small JSON values, each in one
  ``flock``-protected file (``FileValue``).

Semaphores outlive their processes (like the lock files); ``remove_semaphores(directory)``
deletes those created for one limits directory (tests use it to clean up).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from hypernodes_dist.policies.backend import LimitsBackend

__all__ = ["limits_dir", "MachineLimits", "KernelSemaphore", "FileRate", "FileValue",
           "remove_semaphores"]

IPC_CREAT, IPC_EXCL, IPC_NOWAIT, IPC_RMID = 0o1000, 0o2000, 0o4000, 0
SEM_UNDO = 0x1000
_REGISTRY = "semaphores.txt"  # keys created for one limits directory


class _SemBuf(ctypes.Structure):
    _fields_ = [("sem_num", ctypes.c_ushort), ("sem_op", ctypes.c_short),
                ("sem_flg", ctypes.c_short)]


_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return _libc


_MADE: dict[str | None, str] = {}  # $HYPERNODES_LIMITS_DIR -> the directory, made


def limits_dir() -> str:
    """Where this machine's limit state lives (``$HYPERNODES_LIMITS_DIR`` overrides); made
    once per process and setting (a lookup after that: ``limits.backend()`` asks per use)."""
    env = os.environ.get("HYPERNODES_LIMITS_DIR")
    path = _MADE.get(env)
    if path is None or not os.path.isdir(path):  # (an existing path: one stat)
        path = env or os.path.join(tempfile.gettempdir(), f"hypernodes-limits-{os.getuid()}")
        os.makedirs(path, exist_ok=True)
        _MADE[env] = path
    return path


def _file_key(key: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:60]
    return f"{safe}-{hashlib.blake2b(key.encode(), digest_size=4).hexdigest()}"


def _ipc_key(directory: str, key: str, n: int) -> int:
    digest = hashlib.blake2b(f"{os.path.realpath(directory)}\0{key}\0{n}".encode(),
                             digest_size=4).digest()
    return (int.from_bytes(digest, "little") & 0x7FFFFFFF) or 1


class KernelSemaphore:
    """N units shared by every process of the machine (a System V semaphore)."""

    def __init__(self, directory: str, key: str, n: int) -> None:
        self.n = n
        self.ipc_key = _ipc_key(directory, key, n)
        self.directory = directory
        self.sid = self._open()
        self._bufs = (_SemBuf(0, -1, IPC_NOWAIT | SEM_UNDO), _SemBuf(0, -1, SEM_UNDO),
                      _SemBuf(0, 1, SEM_UNDO))
        # made once: a call of the limit is one foreign call each way, nothing built per call
        self._semop = _c().semop
        self._take, self._wait, self._give = (ctypes.byref(b) for b in self._bufs)
        self._withhold_buf = _SemBuf(0, -1, IPC_NOWAIT)
        self._withhold = ctypes.byref(self._withhold_buf)
        self._retire_bufs = (_SemBuf * 2)(_SemBuf(0, 1, SEM_UNDO), _SemBuf(0, -1, IPC_NOWAIT))
        self._retire = ctypes.byref(self._retire_bufs)

    def _open(self) -> int:
        c = _c()
        sid = c.semget(self.ipc_key, 1, IPC_CREAT | IPC_EXCL | 0o600)
        if sid >= 0:  # ours: record it, then add the capacity (openers meanwhile wait)
            with open(os.path.join(self.directory, _REGISTRY), "a") as f:
                f.write(f"{self.ipc_key}\n")
            if c.semop(sid, ctypes.byref(_SemBuf(0, self.n, 0)), 1) != 0:
                raise _os_error("semop")
            return sid
        if ctypes.get_errno() != errno.EEXIST:
            raise _os_error("semget")
        sid = c.semget(self.ipc_key, 1, 0o600)
        if sid < 0:
            raise _os_error("semget")
        return sid

    def try_take(self) -> bool:
        """One unit if one is free now (one system call, never blocks)."""
        if self._semop(self.sid, self._take, 1) == 0:
            return True
        code = ctypes.get_errno()
        if code in (errno.EAGAIN, errno.EINTR):
            return False
        raise _os_error("semop", code)

    def take(self) -> None:
        """One unit; sleeps in the kernel until another process returns one."""
        while self._semop(self.sid, self._wait, 1) != 0:
            code = ctypes.get_errno()
            if code != errno.EINTR:
                raise _os_error("semop", code)

    def give(self) -> None:
        if self._semop(self.sid, self._give, 1) != 0:
            raise _os_error("semop")

    def withhold(self, k: int) -> int:
        """Up to ``k`` free units out of circulation (no ``SEM_UNDO``: they belong to no
        process; ``shrink.Shrink`` counts them); how many were taken."""
        taken = 0
        while taken < k and self._semop(self.sid, self._withhold, 1) == 0:
            taken += 1
        return taken

    def retire(self) -> None:
        """A unit this process holds, kept out of circulation instead of given back: one
        atomic pair of operations (+1 cancelling this process's undo, -1 without undo)."""
        if self._semop(self.sid, self._retire, 2) != 0:
            raise _os_error("semop")

    def restore(self, k: int) -> None:
        """``k`` withheld units back into circulation."""
        if k > 0 and self._semop(self.sid, ctypes.byref(_SemBuf(0, k, 0)), 1) != 0:
            raise _os_error("semop")

    def value(self) -> int:
        """Units free now (for tests and diagnostics)."""
        return int(_c().semctl(self.sid, 0, 12))  # GETVAL


def _os_error(call: str, code: int | None = None) -> OSError:
    code = ctypes.get_errno() if code is None else code
    return OSError(code, f"hypernodes concurrency limit: {call} failed: {os.strerror(code)}")


def remove_semaphores(directory: str) -> int:
    """Delete the semaphores created for ``directory``; returns how many were removed."""
    path = os.path.join(directory, _REGISTRY)
    try:
        keys = {int(line) for line in open(path).read().split()}
    except OSError:
        return 0
    removed = 0
    c = _c()
    for key in keys:
        sid = c.semget(key, 1, 0o600)
        if sid >= 0 and c.semctl(sid, 0, IPC_RMID) == 0:
            removed += 1
    os.unlink(path)
    return removed


class _Fd:
    """A file descriptor reopened after a fork (a forked child must not share lock state)."""

    def __init__(self, path: str) -> None:
        self.path, self.pid, self.fd = path, -1, -1

    def get(self) -> int:
        if self.pid != os.getpid():
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self.pid = os.getpid()
        return self.fd


class FileRate:
    """A rate limit of ``count`` per ``per`` seconds: a GCRA reservation in one locked file.

    ``reserve(k)`` takes the next ``k`` start times (spaced ``per/count`` seconds) and
    returns the first one (wall clock). FIFO, no polling, no burst.
    """

    def __init__(self, directory: str, key: str, count: float, per: float) -> None:
        self.interval = per / count
        self.fd = _Fd(os.path.join(directory, f"{_file_key(key)}.r{count:g}-{per:g}.rate"))
        self.local = threading.Lock()

    def reserve(self, k: float = 1) -> float:
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
                os.pwrite(fd, repr(start + k * self.interval).encode().ljust(64), 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        return start


class FileValue:
    """A small JSON value shared by every process of the machine: one ``flock``'d file."""

    def __init__(self, directory: str, key: str) -> None:
        self.path = os.path.join(directory, f"{_file_key(key)}.json")
        self.fd = _Fd(self.path)
        self.local = threading.Lock()

    def _read(self, fd: int) -> Any:
        raw = os.pread(fd, 1 << 16, 0).rstrip(b"\0 ")
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # torn by a killed writer: start over
            return None

    def get(self) -> Any:
        """The value (``None`` before the first update)."""
        with self.local:
            fd = self.fd.get()
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                return self._read(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def update(self, change: Callable[[Any], Any]) -> Any:
        """Replace the value by ``change(value)`` atomically across processes; return it."""
        with self.local:
            fd = self.fd.get()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                value = change(self._read(fd))
                data = b"" if value is None else json.dumps(value).encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                return value
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def remove(self) -> None:
        """Forget the value (emptied in place: processes holding the file open see it go)."""
        if os.path.exists(self.path):
            self.update(lambda old: None)


class MachineLimits(LimitsBackend):
    """The default backend: one machine, every process of it."""

    name = "machine"

    def __init__(self) -> None:
        self.directory = limits_dir()

    def semaphore(self, key: str, n: int) -> KernelSemaphore:
        return KernelSemaphore(self.directory, key, n)

    def rate(self, key: str, count: float, per: float) -> FileRate:
        return FileRate(self.directory, key, count, per)

    def shared(self, key: str) -> FileValue:
        return FileValue(self.directory, key)
