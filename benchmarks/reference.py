"""The reference, ready to measure against: its vocabulary (the hash-checked copy harmonykit
loads offline) written into a temporary folder, which openai_harmony reads through
$TIKTOKEN_ENCODINGS_BASE (offline). Import this before openai_harmony."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from harmonykit.vocab import export_vocabulary

_folder = tempfile.mkdtemp(prefix="harmonykit-bench-")
atexit.register(shutil.rmtree, _folder, True)
export_vocabulary(_folder)
os.environ["TIKTOKEN_ENCODINGS_BASE"] = _folder
