"""Checkpointers: where checkpoints live between runs and across processes.

``Checkpointer`` is the protocol the engine calls directly (durability is infrastructure,
not a callback): ``save_checkpoint``, ``load_checkpoint``, ``load_latest`` and
``list_checkpoints``. Bring your own (Postgres, Redis, S3...) by implementing those four.

Built in:

* ``MemoryCheckpointer``: in this process (dev, tests).
* ``FileCheckpointer(root)``: one JSON file per checkpoint under ``root/<session>/``.
* ``SQLiteCheckpointer(path)``: one row per checkpoint in a single SQLite file; safe for
  several processes.

**Storage format and trust model.** The metadata (ids, status, step, pending interrupt,
graph hash, creation time) is plain JSON, readable by any tool. The payload (state values,
history, scheduler counters) holds arbitrary user objects, so it is pickled (cloudpickle
when available, for values defined in ``__main__`` or closures) together with a SHA-256
digest that detects corruption. Unpickling runs code: load checkpoints only from storage
you trust as much as your own code (the same rule as any pickle-based cache). A corrupt
payload raises ``CheckpointCorruptError`` instead of returning a wrong state.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import sqlite3
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hypernodes_dist.run.checkpoint import Checkpoint

__all__ = [
    "Checkpointer",
    "MemoryCheckpointer",
    "FileCheckpointer",
    "SQLiteCheckpointer",
    "CheckpointCorruptError",
    "dumps_checkpoint",
    "loads_checkpoint",
]


@runtime_checkable
class Checkpointer(Protocol):
    """Checkpoint persistence: the engine saves at step boundaries, interrupts and the end."""

    def save_checkpoint(self, checkpoint: Checkpoint) -> None: ...

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint | None: ...

    def load_latest(self, session_id: str) -> Checkpoint | None: ...

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]: ...


class CheckpointCorruptError(ValueError):
    """A stored checkpoint whose payload does not match its digest (or does not unpickle)."""


# ----------------------------------------------------------------------------- encoding

_PAYLOAD = ("history", "state", "scheduler")


def _meta(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": ckpt.checkpoint_id,
        "session_id": ckpt.session_id,
        "run_id": ckpt.run_id,
        "status": ckpt.status,
        "step_index": ckpt.step_index,
        "pending_interrupt": ckpt.pending_interrupt,
        "graph_hash": ckpt.graph_hash,
        "created_at": ckpt.created_at.isoformat(),
    }


def _pickle(obj: Any) -> bytes:
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle is a core dependency
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def dumps_checkpoint(ckpt: Checkpoint) -> tuple[dict[str, Any], bytes]:
    """``(metadata, payload)``: JSON-able metadata and the pickled values."""
    payload = _pickle({k: getattr(ckpt, k) for k in _PAYLOAD})
    meta = _meta(ckpt)
    meta["sha256"] = hashlib.sha256(payload).hexdigest()
    return meta, payload


def loads_checkpoint(meta: dict[str, Any], payload: bytes) -> Checkpoint:
    """Inverse of ``dumps_checkpoint``; verifies the digest before unpickling."""
    digest = meta.get("sha256")
    if digest is not None and hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointCorruptError(
            f"checkpoint {meta.get('checkpoint_id')!r} is corrupt (payload digest mismatch)"
        )
    try:
        body = pickle.loads(payload)
    except Exception as exc:
        raise CheckpointCorruptError(
            f"checkpoint {meta.get('checkpoint_id')!r} cannot be read: {exc}"
        ) from exc
    return Checkpoint(
        checkpoint_id=meta["checkpoint_id"],
        session_id=meta["session_id"],
        run_id=meta["run_id"],
        history=body["history"],
        state=body["state"],
        step_index=int(meta["step_index"]),
        pending_interrupt=meta.get("pending_interrupt"),
        graph_hash=meta["graph_hash"],
        scheduler=body["scheduler"],
        created_at=datetime.fromisoformat(meta["created_at"]),
        status=meta.get("status", "running"),
    )


def check_keep(keep: int | None) -> int | None:
    """``keep``: how many checkpoints of each session a checkpointer keeps (the newest);
    older ones are deleted as new ones are saved. ``None`` keeps every checkpoint (the
    history of a long cycle grows by one per step); resuming needs only the latest."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be None or an integer >= 1, got {keep!r}")
    return keep


# ----------------------------------------------------------------------------- memory


class MemoryCheckpointer:
    """Checkpoints in this process's memory (stored as copies: later changes to the run's
    values do not leak into a saved checkpoint). ``keep``: see ``check_keep``."""

    def __init__(self, keep: int | None = None) -> None:
        self.keep = check_keep(keep)
        self._by_id: dict[str, tuple[dict[str, Any], bytes]] = {}
        self._by_session: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        record = dumps_checkpoint(checkpoint)
        with self._lock:
            ids = self._by_session.setdefault(checkpoint.session_id, [])
            if checkpoint.checkpoint_id not in self._by_id:
                ids.append(checkpoint.checkpoint_id)
            self._by_id[checkpoint.checkpoint_id] = record
            if self.keep is not None:
                for old in ids[: -self.keep]:
                    del self._by_id[old]
                del ids[: -self.keep]

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        record = self._by_id.get(checkpoint_id)
        return None if record is None else loads_checkpoint(*record)

    def load_latest(self, session_id: str) -> Checkpoint | None:
        ids = self._by_session.get(session_id)
        return self.load_checkpoint(ids[-1]) if ids else None

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]:
        return [loads_checkpoint(*self._by_id[i]) for i in self._by_session.get(session_id, [])]

    def __repr__(self) -> str:
        return f"MemoryCheckpointer({len(self._by_id)} checkpoints)"


# ----------------------------------------------------------------------------- files


def _safe(name: str) -> str:
    """A file-name-safe, reversible spelling of ``name`` (no separators, no dots)."""
    return "".join(c if c.isalnum() or c in "-_" else f"%{ord(c):02X}" for c in name) or "%"


class FileCheckpointer:
    """One JSON file per checkpoint: ``root/<session>/<seq>_<checkpoint_id>.json``.

    Each file holds the metadata as JSON fields and the pickled payload (base64) with its
    digest. Files are written atomically (temporary file + rename). ``keep``: see
    ``check_keep``.
    """

    def __init__(self, root: str | os.PathLike[str] = "./checkpoints",
                 keep: int | None = None) -> None:
        self.keep = check_keep(keep)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, session_id: str) -> Path:
        return self.root / _safe(session_id)

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        meta, payload = dumps_checkpoint(checkpoint)
        meta["payload"] = base64.b64encode(payload).decode("ascii")
        folder = self._dir(checkpoint.session_id)
        folder.mkdir(parents=True, exist_ok=True)
        existing = list(folder.glob(f"*_{_safe(checkpoint.checkpoint_id)}.json"))
        target = existing[0] if existing else folder / (
            f"{time.time_ns():020d}_{_safe(checkpoint.checkpoint_id)}.json"
        )
        tmp = target.with_suffix(f".tmp{os.getpid()}_{threading.get_ident()}")
        tmp.write_text(json.dumps(meta), encoding="utf-8")
        os.replace(tmp, target)
        if self.keep is not None:
            for old in self._files(checkpoint.session_id)[: -self.keep]:
                old.unlink(missing_ok=True)

    @staticmethod
    def _read(path: Path) -> Checkpoint:
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            payload = base64.b64decode(meta.pop("payload"))
        except (ValueError, KeyError) as exc:
            raise CheckpointCorruptError(f"checkpoint file {path} is corrupt: {exc}") from exc
        return loads_checkpoint(meta, payload)

    def _files(self, session_id: str) -> list[Path]:
        folder = self._dir(session_id)
        return sorted(folder.glob("*.json")) if folder.is_dir() else []

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        found = sorted(self.root.glob(f"*/*_{_safe(checkpoint_id)}.json"))
        return self._read(found[0]) if found else None

    def load_latest(self, session_id: str) -> Checkpoint | None:
        files = self._files(session_id)
        return self._read(files[-1]) if files else None

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]:
        return [self._read(p) for p in self._files(session_id)]

    def __repr__(self) -> str:
        return f"FileCheckpointer({str(self.root)!r})"


# ----------------------------------------------------------------------------- sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    checkpoint_id TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    meta TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_session ON checkpoints (session_id, seq);
"""


class SQLiteCheckpointer:
    """Checkpoints as rows of one SQLite file (``meta`` JSON + pickled ``payload``).

    A connection is opened per operation, so the object pickles, and several threads or
    processes may share the file (SQLite's locking, ``timeout`` seconds of waiting).
    ``keep``: see ``check_keep``.
    """

    def __init__(self, path: str | os.PathLike[str] = "./checkpoints.db", timeout: float = 30.0,
                 keep: int | None = None):
        self.keep = check_keep(keep)
        self.path = str(path)
        self.timeout = timeout
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        else:
            raise ValueError("SQLiteCheckpointer needs a file; use MemoryCheckpointer in memory")
        db = self._connect()
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.timeout)
        # WAL: readers never block the writer; NORMAL sync survives process crashes (a
        # power loss may lose the last checkpoints, never corrupt the file).
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[str, bytes]]:
        db = self._connect()
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        meta, payload = dumps_checkpoint(checkpoint)
        db = self._connect()
        try:
            with db:
                db.execute(
                    "INSERT INTO checkpoints (checkpoint_id, session_id, run_id, created_at, meta,"
                    " payload) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(checkpoint_id) DO UPDATE SET"
                    " meta = excluded.meta, payload = excluded.payload",
                    (checkpoint.checkpoint_id, checkpoint.session_id, checkpoint.run_id,
                     meta["created_at"], json.dumps(meta), sqlite3.Binary(payload)),
                )
                if self.keep is not None:
                    db.execute(
                        "DELETE FROM checkpoints WHERE session_id = ? AND seq NOT IN (SELECT seq"
                        " FROM checkpoints WHERE session_id = ? ORDER BY seq DESC LIMIT ?)",
                        (checkpoint.session_id, checkpoint.session_id, self.keep),
                    )
        finally:
            db.close()

    @staticmethod
    def _decode(row: tuple[str, bytes]) -> Checkpoint:
        try:
            meta = json.loads(row[0])
        except ValueError as exc:
            raise CheckpointCorruptError(f"checkpoint metadata is corrupt: {exc}") from exc
        return loads_checkpoint(meta, bytes(row[1]))

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        rows = self._query("SELECT meta, payload FROM checkpoints WHERE checkpoint_id = ?",
                           (checkpoint_id,))
        return self._decode(rows[0]) if rows else None

    def load_latest(self, session_id: str) -> Checkpoint | None:
        rows = self._query(
            "SELECT meta, payload FROM checkpoints WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
            (session_id,),
        )
        return self._decode(rows[0]) if rows else None

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]:
        rows = self._query(
            "SELECT meta, payload FROM checkpoints WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
        return [self._decode(r) for r in rows]

    def __repr__(self) -> str:
        return f"SQLiteCheckpointer({self.path!r})"
