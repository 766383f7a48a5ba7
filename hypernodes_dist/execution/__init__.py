"""The one plan executor every engine runs: ``batch.execute_batch`` over a ``job.Chunk``.

``job`` holds the types engine plugins import (``MapJob``, ``Chunk``, ``BatchSettings``,
``BatchResult``); ``state.BatchState`` is a batch's explicit state, driven by two
strategies (``columnar``: node by node; ``flow``: item by item under a window), and
``scheduler`` runs the plans they cannot (cycles, interrupts); ``invoke`` calls one node; ``guard`` applies its policy; ``syncio`` is the one sync/async code path.
"""
