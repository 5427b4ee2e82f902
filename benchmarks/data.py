"""`make bench`, datasets: rendering a 10k-record dataset with tools (one worker, against a plain
loop over the reference in the same run, its records already converted to Conversations),
the second worker's gain, and parse throughput.

Run alone: ``python benchmarks/data.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import openai_harmony as oh
import reference  # noqa: F401 - sets up the reference's vocabulary, offline

import harmonykit as hk
from harmonykit.data import parse_example, render_example
from harmonykit.openai import render_chat_request

N = 10_000
TOOLS = [{"type": "function", "function": {"name": f"tool_{k}", "description": "Looks something up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
         for k in range(3)]


def record(i: int) -> dict[str, Any]:
    return {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Please look up item {i} and summarise it."},
        {"role": "assistant", "reasoning_content": f"I should call the tool for item {i}.", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "tool_1", "arguments": json.dumps({"query": f"item {i}"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"Item {i} is a widget of size {i % 17}."},
        {"role": "assistant", "reasoning_content": "Summarise.", "content": f"Item {i} is a size {i % 17} widget."},
    ], "tools": TOOLS}


def main() -> None:
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    ref = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    records = [record(i) for i in range(N)]
    conversations = [oh.Conversation.from_json(render_chat_request(enc, r).conversation.to_json()) for r in records]
    print(f"\nDatasets ({N} chat records with 3 tools, a tool call and its result each):")
    t = time.perf_counter()
    ref_tokens = sum(len(ref.render_conversation_for_training(c)) for c in conversations)
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    ours = [render_example(enc, r) for r in records]
    t_ours = time.perf_counter() - t
    tokens = sum(len(x["input_ids"]) for x in ours)
    print(f"  render, one worker        harmonykit {N / t_ours:9,.0f} records/s {tokens / t_ours / 1e6:6.2f} M tok/s   "
          f"reference loop {N / t_ref:7,.0f} records/s {ref_tokens / t_ref / 1e6:5.2f} M tok/s   ratio {t_ref / t_ours:5.1f}x")
    print("    (harmonykit's time includes reading the records from their JSON shape; the reference's does not)")
    # The command line end to end (a 10k-record JSONL file), as users run it: records/s over the run.
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="harmonykit-data-"))
    src = folder / "records.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    rates = {}
    for workers in (1, 2):
        proc = subprocess.run([sys.executable, "-m", "harmonykit", "data", "render", str(src), "-o",
                               str(folder / f"out{workers}.jsonl"), "--workers", str(workers)],
                              capture_output=True, text=True, check=True)
        rates[workers] = json.loads(proc.stderr.strip().splitlines()[-1])["records_per_second"]
    print(f"  harmonykit data render (JSONL, end to end): 1 worker {rates[1]:,} records/s, 2 workers "
          f"{rates[2]:,} records/s ({rates[2] / rates[1]:.2f}x from the second worker; {os.cpu_count()} cores)")
    # Rollouts as a model writes them: reasoning, then an answer or a call (~300 tokens each).
    words = " ".join(f"step {k} checks the widget size and the catalogue entry" for k in range(120))
    completions = [enc.encode(f"<|channel|>analysis<|message|>{words} for item {i}.<|end|><|start|>assistant"
                              + (f"<|channel|>final<|message|>Item {i} is a widget. {words[:1500]}<|return|>"
                                 if i % 2 else f" to=functions.tool_1<|channel|>commentary <|constrain|>json"
                                 f'<|message|>{{"query": "item {i}"}}<|call|>'), allowed_special="all")
                   for i in range(2000)]
    total = sum(len(c) for c in completions)
    t = time.perf_counter()
    for c in completions:
        enc.parse_completion(c)
    t_parse = time.perf_counter() - t
    t = time.perf_counter()
    for c in completions:
        parse_example(enc, c)
    t_example = time.perf_counter() - t
    print(f"  parse rollouts ({total / len(completions):.0f} tokens each): parse_completion {total / t_parse / 1e6:5.2f} M tok/s, "
          f"parse_example (JSON-ready dicts) {total / t_example / 1e6:5.2f} M tok/s, one core")


if __name__ == "__main__":
    sys.exit(main())
