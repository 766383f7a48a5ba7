"""Scratch directories engines keep in the temp directory (e.g. Dask's payload files).

``Scratch(prefix)`` creates ``<tmp>/<prefix>-<pid>-<random>`` holding a ``.lock`` file that the
owner keeps locked (``flock``) for the directory's life. The directory goes away on
``close()``, when the ``Scratch`` is garbage collected, and at interpreter exit. A killed run
cannot do that, so creating one first removes the stale directories of the same prefix: those
whose lock can be taken (the kernel releases a dead process's locks, so a reused pid does not
matter), or, without a lock file (killed before it was made), whose pid is not alive. A live
run's directory is never removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: only the pid tells
    fcntl = None  # type: ignore[assignment]  # no fcntl (Windows): folders are not locked

__all__ = ["Scratch", "remove_stale", "pid_alive"]

LOCK = ".lock"


class Scratch:
    """One owned scratch directory (see the module docstring); ``path`` is its location."""

    def __init__(self, prefix: str, directory: str | None = None) -> None:
        base = directory or tempfile.gettempdir()
        remove_stale(prefix, base)
        self.path = tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=base)
        fd = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        self._finalizer = weakref.finalize(self, _remove, self.path, fd, os.getpid())

    def close(self) -> None:
        """Remove the directory now (idempotent)."""
        self._finalizer()


def _remove(path: str, fd: int, owner: int) -> None:
    if os.getpid() != owner:  # a forked child exiting: the directory is its parent's
        return
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.close(fd)
    except OSError:
        pass


def remove_stale(prefix: str, directory: str | None = None) -> list[str]:
    """Remove the directories ``<prefix>-<pid>-*`` in ``directory`` (default: the temp
    directory) whose owner is gone; return their paths."""
    base = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        pid = _owner(name, prefix)
        if pid is None:
            continue
        path = os.path.join(base, name)
        if _stale(path, pid):
            removed.append(path)
    return removed


def _owner(name: str, prefix: str) -> int | None:
    if not name.startswith(f"{prefix}-"):
        return None
    pid = name[len(prefix) + 1:].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def _stale(path: str, pid: int) -> bool:
    """Remove ``path`` if its owner is gone (holding its lock meanwhile); whether it was."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR)
    except FileNotFoundError:
        if pid_alive(pid) or not os.path.isdir(path):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    except OSError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its owner holds the lock: a live run
                return False
        elif pid_alive(pid):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a signal could reach it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True
