"""Requests and records as real traffic has them, for the benchmarks: an agent loop's growing
conversation, and a function-calling dataset whose records each have their own system prompt
and tools drawn from a catalogue."""

from __future__ import annotations

import json
import random
from typing import Any

WORDS = ("account address amount api cache city code country currency customer data date day device "
         "email event file filter flight format hotel id image item language latitude limit list location "
         "longitude market message name news number order page payment phone price product query rate "
         "region report result search service session size sort status stock symbol text time token "
         "type unit user value weather").split()


def _phrase(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _parameter(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum", "array"])
    description = _phrase(rng, 4, 12).capitalize() + "."
    if kind == "enum":
        return {"type": "string", "description": description, "enum": rng.sample(WORDS, rng.randint(2, 5))}
    if kind == "array":
        return {"type": "array", "description": description, "items": {"type": "string"}}
    return {"type": kind, "description": description}


def catalogue_tool(rng: random.Random, k: int) -> dict[str, Any]:
    """A Chat tool as API catalogues have them: 2-6 described parameters, some enums and arrays."""
    names = rng.sample(WORDS, rng.randint(2, 6))
    return {"type": "function", "function": {
        "name": f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{k}",
        "description": _phrase(rng, 6, 20).capitalize() + ".",
        "parameters": {"type": "object", "properties": {n: _parameter(rng) for n in names},
                       "required": names[: rng.randint(1, len(names))]}}}


def dataset_records(n: int, seed: int = 0, catalogue: int = 500) -> list[dict[str, Any]]:
    """Function-calling records, each with its own system prompt and 1-3 tools of a catalogue;
    a call, its result and the answer."""
    rng = random.Random(seed)
    pool = [catalogue_tool(rng, k) for k in range(catalogue)]
    out = []
    for _ in range(n):
        tools = rng.sample(pool, rng.randint(1, 3))
        fn = tools[0]["function"]
        args = {p: rng.choice(WORDS) for p in fn["parameters"]["required"]}
        out.append({"messages": [
            {"role": "system", "content": f"You are an assistant for {_phrase(rng, 2, 4)}. "
                                          + _phrase(rng, 10, 40).capitalize() + "."},
            {"role": "user", "content": _phrase(rng, 8, 40).capitalize() + "?"},
            {"role": "assistant", "reasoning_content": _phrase(rng, 10, 40).capitalize() + ".", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": fn["name"], "arguments": json.dumps(args)}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"result": _phrase(rng, 10, 60)})},
            {"role": "assistant", "reasoning_content": _phrase(rng, 5, 20).capitalize() + ".",
             "content": _phrase(rng, 15, 60).capitalize() + "."},
        ], "tools": tools})
    return out


def agent_request(turns: int = 40, tools: int = 10, seed: int = 0) -> dict[str, Any]:
    """An agent's Chat request after ``turns`` steps: each step a tool call and a
    3,000-character tool result (40 turns: ~36k tokens)."""
    rng = random.Random(seed)
    declared = [catalogue_tool(rng, k) for k in range(tools)]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a research agent. Use the tools; cite what you find."},
        {"role": "user", "content": "Compile a report on the widget catalogue: sizes, colours, prices."}]
    for i in range(turns):
        fn = rng.choice(declared)["function"]
        args = {p: f"widget {i}" for p in fn["parameters"]["required"]}
        messages.append({"role": "assistant", "content": None, "reasoning_content": f"Step {i}: call {fn['name']}.",
                         "tool_calls": [{"id": f"call_{i}", "type": "function",
                                         "function": {"name": fn["name"], "arguments": json.dumps(args)}}]})
        result = " ".join(f"{_phrase(rng, 3, 8).capitalize()} {rng.randrange(10**6)}: {rng.random():.4f}."
                          for _ in range(72))
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result[:3000]})
    return {"model": "gpt-oss-20b", "messages": messages, "tools": declared}
