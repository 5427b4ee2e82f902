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


def _interleaved(enc: hk.HarmonyEncoding, ref: Any, records: list[dict[str, Any]],
                 conversations: list[Any]) -> tuple[float, float]:
    """Seconds for both over all records, in slices taking turns (a change in this machine's
    speed during the run falls on both alike); each counts its tokens and lets them go."""
    n = len(records)
    t_ref = t_ours = 0.0
    for k in range(0, n, n // 10):
        t = time.perf_counter()
        sum(len(ref.render_conversation_for_training(c)) for c in conversations[k:k + n // 10])
        t_ref += time.perf_counter() - t
        t = time.perf_counter()
        sum(len(render_example(enc, r)["input_ids"]) for r in records[k:k + n // 10])
        t_ours += time.perf_counter() - t
    return t_ours, t_ref


def own_heads(enc: hk.HarmonyEncoding, ref: Any) -> None:
    """#17: records that each have their own system prompt and 1-3 tools of a 500-tool catalogue,
    every record rendered once (cold caches at the start)."""
    import gc

    from workloads import dataset_records

    from harmonykit.cache import disabled

    records = dataset_records(N)
    with disabled():
        conversations = [oh.Conversation.from_json(render_chat_request(enc, r).conversation.to_json())
                         for r in records]
    gc.collect()
    gc.freeze()  # the inputs, held for the run, are not the work: no collection walks them
    try:
        t_ours, t_ref = _interleaved(enc, ref, records, conversations)
    finally:
        gc.unfreeze()
    print(f"  render, records each with their own system prompt and 1-3 tools (of 500): harmonykit "
          f"{N / t_ours:7,.0f} records/s, reference loop {N / t_ref:6,.0f} records/s: ratio {t_ref / t_ours:5.1f}x")


def main() -> None:
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    ref = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    records = [record(i) for i in range(N)]
    conversations = [oh.Conversation.from_json(render_chat_request(enc, r).conversation.to_json()) for r in records]
    print(f"\nDatasets ({N} chat records with 3 tools, a tool call and its result each):")
    tokens = sum(len(render_example(enc, r)["input_ids"]) for r in records)
    ref_tokens = sum(len(ref.render_conversation_for_training(c)) for c in conversations)
    t_ours, t_ref = _interleaved(enc, ref, records, conversations)
    print(f"  render, one worker        harmonykit {N / t_ours:9,.0f} records/s {tokens / t_ours / 1e6:6.2f} M tok/s   "
          f"reference loop {N / t_ref:7,.0f} records/s {ref_tokens / t_ref / 1e6:5.2f} M tok/s   ratio {t_ref / t_ours:5.1f}x")
    print("    (harmonykit's time includes reading the records from their JSON shape; the reference's does not)")
    own_heads(enc, ref)
    # The command line end to end, as users run it: records/s over the whole run, the
    # vocabulary's load and the workers' start included (the fixed cost: the run's seconds on
    # a one-record file). The 10k-record file shows that cost; 40k records (the same ones
    # four times) the rate it settles to. Best of five runs each, 1 and 2 workers taking turns
    # (this shared machine's speed moves by a third from one run to the next).
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="harmonykit-data-"))
    lines = [json.dumps(r) + "\n" for r in records]

    def seconds(src: Path, workers: int) -> tuple[int, float]:
        proc = subprocess.run([sys.executable, "-m", "harmonykit", "data", "render", str(src), "-o",
                               str(folder / f"out{workers}.jsonl"), "--workers", str(workers)],
                              capture_output=True, text=True, check=True)
        summary = json.loads(proc.stderr.strip().splitlines()[-1])
        return summary["records"], summary["seconds"]

    one = folder / "one.jsonl"
    one.write_text(lines[0], encoding="utf-8")
    fixed = {w: min(seconds(one, w)[1] for _ in range(3)) for w in (1, 2)}
    print(f"  harmonykit data render, fixed cost of a run (vocabulary, workers' start): "
          f"{fixed[1]:.2f} s with 1 worker, {fixed[2]:.2f} s with 2")
    for size in (N, 4 * N):
        src = folder / f"records{size}.jsonl"
        src.write_text("".join(lines * (size // N)), encoding="utf-8")
        best: dict[int, float] = {1: float("inf"), 2: float("inf")}
        for _ in range(5):
            for workers in (1, 2):
                best[workers] = min(best[workers], seconds(src, workers)[1])
        rate = {w: size / best[w] for w in best}
        steady = {w: size / (best[w] - fixed[w]) for w in best}
        print(f"  harmonykit data render, JSONL, {size:,} records: 1 worker {rate[1]:,.0f} records/s, "
              f"2 workers {rate[2]:,.0f} records/s: {rate[2] / rate[1]:.2f}x from the second worker; "
              f"{steady[2] / steady[1]:.2f}x past the fixed cost ({os.cpu_count()} cores)")
    # Rollouts as a model writes them: reasoning, then an answer or a call; long and short.
    # Best of three passes (one core).
    for steps in (120, 20):
        words = " ".join(f"step {k} checks the widget size and the catalogue entry" for k in range(steps))
        completions = [enc.encode(f"<|channel|>analysis<|message|>{words} for item {i}.<|end|><|start|>assistant"
                                  + (f"<|channel|>final<|message|>Item {i} is a widget. {words[:1500]}<|return|>"
                                     if i % 2 else f" to=functions.tool_1<|channel|>commentary <|constrain|>json"
                                     f'<|message|>{{"query": "item {i}"}}<|call|>'), allowed_special="all")
                       for i in range(2000)]
        total = sum(len(c) for c in completions)
        rates = []
        for fn in (enc.parse_completion, lambda c: parse_example(enc, c)):
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                for c in completions:
                    fn(c)
                best = min(best, time.perf_counter() - t)
            rates.append(total / best / 1e6)
        print(f"  parse rollouts ({total / len(completions):4.0f} tokens each): parse_completion {rates[0]:5.2f} M tok/s, "
              f"parse_example (JSON-ready dicts) {rates[1]:5.2f} M tok/s, one core")

if __name__ == "__main__":
    sys.exit(main())
