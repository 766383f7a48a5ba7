"""Run machinery: one local run (``runner``), the interactive ``GraphRun`` (``graphrun``),
checkpoints and checkpointers, a map (``maprun``) and graphs used as nodes (``nested``)."""
