"""Datasets in, datasets out: ``map(source=..., into=...)`` over tables larger than the driver.

``source.py`` normalizes every accepted source into row-range parts workers read
themselves; ``job.py`` is what a worker runs on one part; ``schema.py`` fixes the output
types; ``manifest.py`` makes reruns resume; ``result.py`` is the returned ``DatasetResult``.
The Parquet writer is ``hypernodes_dist.sinks.parquet``.
"""

from __future__ import annotations

from .job import DatasetJob, PartReport, PartTask, run_parts
from .parts import Part
from .result import DatasetResult
from .run import default_part_rows, reject_frames, run_dataset
from .source import Source, open_source

__all__ = ["DatasetResult", "DatasetJob", "PartTask", "PartReport", "Part", "Source",
           "open_source", "run_dataset", "run_parts", "default_part_rows", "reject_frames"]
