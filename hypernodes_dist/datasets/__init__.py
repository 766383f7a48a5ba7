"""Datasets in, datasets out: ``map(source=..., into=...)`` over tables larger than the driver.

``source.py`` normalizes every accepted source into row-range parts workers read
themselves; ``job.py`` is what a worker runs on one part; ``schema.py`` fixes the output
types; ``commit.py`` is the part pipeline every engine runs (steps, files by time);
``manifest.py`` makes reruns resume; ``result.py`` is the returned ``DatasetResult``.
The Parquet writer is ``hypernodes_dist.sinks.parquet``.
"""

from __future__ import annotations

from hypernodes_dist.datasets.commit import run_parts
from hypernodes_dist.datasets.job import DatasetJob, PartReport, PartTask
from hypernodes_dist.datasets.parts import Part
from hypernodes_dist.datasets.result import DatasetResult
from hypernodes_dist.datasets.source import Source, open_source

__all__ = ["DatasetResult", "DatasetJob", "PartTask", "PartReport", "Part", "Source",
           "open_source", "run_parts"]
