"""Benchmark tooling (not part of the core package): the ``hypernodes-dist bench`` runner
(``runner``) and its built-in workloads (``workloads``)."""
