"""Datasets: chat records to Harmony token ids with a loss mask, and rollouts parsed, at scale.

``render_example`` / ``parse_example`` take one record; ``render_batch`` /
``parse_batch`` take columns (Hugging Face ``datasets.Dataset.map(batched=True)``),
and ``RenderBatches`` / ``ParseBatches`` are callable classes for Ray Data's
``map_batches``. ``harmonykit data render|parse`` runs them over JSONL or Parquet
files with worker processes.
"""

from .examples import COT, IGNORE, TRAIN_ON, parse_example, render_example

__all__ = ["COT", "IGNORE", "TRAIN_ON", "parse_example", "render_example"]
