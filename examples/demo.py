"""`make demo`: what the reference raises on real gpt-oss outputs, and what harmonykit recovers.

Each example is a completion from a bug report (examples/completions.json). For
each, the strict reference-compatible parser and, when it is installed,
openai_harmony itself are tried first; then ``harmonykit inspect`` shows what
the tolerant parser recovered, and ``harmonykit parse`` prints the first
example's JSON.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

from harmonykit import HarmonyEncodingName, HarmonyError, Role, load_harmony_encoding
from harmonykit.cli import main as cli
from harmonykit.openai import completion_to_chat_choice
from harmonykit.vocab import candidate_sources

HERE = Path(__file__).resolve().parent


def reference_encoding():  # type: ignore[no-untyped-def]
    """openai_harmony's encoding, reading the vocabulary from a temporary folder (or None)."""
    try:
        bundled = candidate_sources()[-1][1]
        assert bundled is not None
        folder = tempfile.mkdtemp(prefix="harmonykit-demo-")
        with gzip.open(bundled) as src:
            (Path(folder) / "o200k_base.tiktoken").write_bytes(src.read())
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = folder
        import openai_harmony

        return openai_harmony, openai_harmony.load_harmony_encoding("HarmonyGptOss")
    except Exception:
        return None, None


def main() -> int:
    examples = json.loads((HERE / "completions.json").read_text(encoding="utf-8"))
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    oh, ref = reference_encoding()
    work = Path(tempfile.mkdtemp(prefix="harmonykit-demo-"))
    for n, ex in enumerate(examples, 1):
        print(f"\n=== {n}. {ex['name']}\n{ex['note']}\n")
        tokens = enc.encode(ex["text"], allowed_special="all")
        if ref is not None:
            try:
                msgs = ref.parse_messages_from_completion_tokens(tokens, oh.Role.ASSISTANT)
                print(f"openai_harmony 0.0.8: {len(msgs)} messages")
            except oh.HarmonyError as e:
                print(f"openai_harmony 0.0.8 raises: HarmonyError: {str(e)[:110]}")
        try:
            enc.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
            print("harmonykit strict: parses")
        except HarmonyError as e:
            print(f"harmonykit strict raises the same: {str(e)[:90]} (token {e.token_index})")
        print("harmonykit tolerant recovers:")
        path = work / f"{ex['name']}.txt"
        path.write_text(ex["text"], encoding="utf-8")
        tools = [a for t in ex["tools"] for a in ("--tool", t)]
        cli(["inspect", str(path), *tools])
        request = {"tools": [{"type": "function", "function": {"name": t}} for t in ex["tools"]]}
        choice = completion_to_chat_choice(enc, tokens, request=request,
                                           finish_reason=ex.get("engine_finish_reason", "stop"))
        message = {k: v for k, v in choice["message"].items() if v is not None}
        print("a Chat Completions client gets:",
              json.dumps({"message": message, "finish_reason": choice["finish_reason"]},
                         ensure_ascii=False)[:300])
    first = examples[0]
    print(f"\n=== harmonykit parse {first['name']}.txt (JSON for programs)")
    cli(["parse", str(work / f"{first['name']}.txt")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
