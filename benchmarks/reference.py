"""The reference, ready to measure against: its vocabulary decompressed from the copy that
bpe-openai ships into a temporary folder, which openai_harmony reads through
$TIKTOKEN_ENCODINGS_BASE (offline). Import this before openai_harmony."""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import tempfile
from pathlib import Path

from harmonykit.vocab import candidate_sources

_folder = tempfile.mkdtemp(prefix="harmonykit-bench-")
atexit.register(shutil.rmtree, _folder, True)
_bundled = candidate_sources()[-1][1]
assert _bundled is not None, "bpe-openai is not installed"
with gzip.open(_bundled) as _src:
    (Path(_folder) / "o200k_base.tiktoken").write_bytes(_src.read())
os.environ["TIKTOKEN_ENCODINGS_BASE"] = _folder
