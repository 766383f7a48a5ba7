"""Checkpointers (contract import path): ``MemoryCheckpointer``, ``FileCheckpointer``,
``SQLiteCheckpointer``; implemented in ``hypernodes_dist.run.checkpointers``."""

from hypernodes_dist.run.checkpointers import (
    CheckpointCorruptError,
    Checkpointer,
    FileCheckpointer,
    MemoryCheckpointer,
    SQLiteCheckpointer,
)

__all__ = ["Checkpointer", "CheckpointCorruptError", "MemoryCheckpointer", "FileCheckpointer", "SQLiteCheckpointer"]
