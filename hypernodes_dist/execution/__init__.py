"""The one plan executor every engine runs: ``batch.execute_batch`` over a ``job.Chunk``.

``job`` holds the types engine plugins import (``MapJob``, ``Chunk``, ``BatchSettings``,
``BatchResult``); ``columnar`` and ``scheduler`` are the two strategies; ``invoke`` calls
one node; ``guard`` applies its policy; ``syncio`` is the one sync/async code path.
"""
