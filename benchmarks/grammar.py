"""`make bench`, guided decoding: mask time by region, grammar compile time, against llguidance
on a bare JSON schema of the same size (measured in the same run).

Run alone: ``python benchmarks/grammar.py``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import llguidance
import numpy as np

import harmonykit as hk
from harmonykit.grammar import HarmonyMatcher
from harmonykit.grammar.lark import GRAMMARS
from harmonykit.grammar.matcher import COMPILED, lltokenizer

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)


def schema(i: int) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": ["path", "mode"],
            "properties": {"path": {"type": "string", "description": f"file {i}"},
                           "mode": {"enum": ["r", "w", "a"]}, "lines": {"type": "array", "items": {"type": "integer"}},
                           "options": {"type": "object", "properties": {"force": {"type": "boolean"}}}}}


def request(n: int) -> dict[str, Any]:
    return {"messages": [], "tools": [{"type": "function", "function": {"name": f"tool_{i}", "parameters": schema(i)}}
                                      for i in range(n)]}


def percentiles(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times), times[min(n - 1, int(n * 0.99))]


def mask_times(m: HarmonyMatcher, prefix: str, n: int = 400) -> tuple[float, float, float, float]:
    for t in ENC.encode(prefix, allowed_special="all"):
        assert m.consume(t), prefix
    words = np.zeros((201089 + 31) // 32, dtype=np.int32)
    packed = percentiles(lambda: m.fill_bitmask(words), n)
    unpacked = percentiles(m.allowed_mask, n)
    return packed + unpacked


def main() -> None:
    print("\nGuided decoding (llguidance under harmonykit.grammar):")
    t = time.perf_counter()
    tokenizer = lltokenizer(ENC)
    print(f"  llguidance tokenizer from the encoding (once per process): {(time.perf_counter() - t) * 1e3:.0f} ms")
    m10 = HarmonyMatcher(ENC, request(10))
    regions = {
        "envelope (start of the turn)": "",
        "free text (analysis)": "<|channel|>analysis<|message|>Let me think about",
        "inside a JSON schema (arguments)": '<|channel|>commentary to=functions.tool_3 <|constrain|>json<|message|>'
                                            '{"path": "src/ma',
        "JSON, after a key": '<|channel|>commentary to=functions.tool_3 <|constrain|>json<|message|>'
                             '{"path": "a", "mode": ',
    }
    print("  mask per token, 10 tools (median / p99):       packed bits            one bool per id")
    for name, prefix in regions.items():
        m = HarmonyMatcher(ENC, request(10))
        p50, p99, u50, u99 = mask_times(m, prefix)
        print(f"    {name:<36} {p50 * 1e6:7.1f} / {p99 * 1e6:7.1f} us   {u50 * 1e6:7.1f} / {u99 * 1e6:7.1f} us")
    del m10
    print("  grammar compile (cold: compiled now; cached: a request shape seen before):")
    for n in (1, 10, 50):
        req = request(n)
        cold = []
        for _ in range(3):
            COMPILED.clear()
            GRAMMARS.clear()
            t = time.perf_counter()
            HarmonyMatcher(ENC, req)
            cold.append(time.perf_counter() - t)
        cached = percentiles(lambda req=req: HarmonyMatcher(ENC, req), 50)[0]
        # llguidance on a bare JSON schema of the same size: the tools' schemas as one anyOf
        bare = llguidance.LLMatcher.grammar_from_json_schema({"anyOf": [schema(i) for i in range(n)]})
        base = []
        for _ in range(3):
            t = time.perf_counter()
            llguidance.LLMatcher(tokenizer, bare, log_level=0)
            base.append(time.perf_counter() - t)
        print(f"    {n:>2} tools: cold {min(cold) * 1e3:7.2f} ms   cached {cached * 1e3:6.3f} ms   "
              f"llguidance, bare JSON schema {min(base) * 1e3:7.2f} ms   ratio {min(cold) / min(base):4.2f}x")
    bare_m = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema(0)), log_level=0)
    bare_m.consume_tokens(ENC.encode('{"path": "src/ma'))
    words = np.zeros((201089 + 31) // 32, dtype=np.int32)
    b50, b99 = percentiles(lambda: bare_m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes), 400)
    m = HarmonyMatcher(ENC, request(1))
    for tok in ENC.encode('<|channel|>commentary to=functions.tool_0 json<|message|>{"path": "src/ma',
                          allowed_special="all"):
        m.consume(tok)
    h50, h99 = percentiles(lambda: m.fill_bitmask(words), 400)
    print(f"  mask inside a JSON string: harmonykit {h50 * 1e6:.1f} / {h99 * 1e6:.1f} us, llguidance on the bare "
          f"schema {b50 * 1e6:.1f} / {b99 * 1e6:.1f} us (median / p99; ratio {h50 / b50:.2f}x)")
    print(f"  (grammar text, 50 tools: {len(json.dumps(request(50)))} bytes of request)")


if __name__ == "__main__":
    main()
