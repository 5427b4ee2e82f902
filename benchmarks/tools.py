"""`make bench`, the built-in tools part (issue 23): what the agent loop and the sandbox cost.

In-process, no HTTP (the gateway's HTTP costs are benchmarks/gateway.py's). Reported, as
numbers and ratios from the same run:

- the loop's own cost per tool step, the tool's run excluded: a turn of N python steps whose
  tool answers at once (a stub in the real ``Toolbox``'s place) against the same output tokens
  parsed as one plain turn; per step in microseconds (target: well under a millisecond, nothing a
  user can feel next to an engine step);
- the sandbox: starting a container's interpreter and running its first cell under bubblewrap
  against the same interpreter started as a plain subprocess (``--python-sandbox none``), and
  one cell's round trip in each (target: start within a few times plain; per call the same).

Run alone: ``python benchmarks/tools.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import harmonykit as hk
from harmonykit.agent import Agent, drive
from harmonykit.openai import render_responses_request
from harmonykit.openai.responses import ResponsesStream
from harmonykit.tools import Call, Context, PythonTool, Toolbox, ToolResult
from harmonykit.tools.python import Kernel, Sandbox

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
STEPS = 20
REPEAT = 30


class _Step:
    def __init__(self, ids: list[int]) -> None:
        self.ids, self.finish_reason = ids, "stop"

    async def __aiter__(self) -> Any:
        for i in range(0, len(self.ids), 4):
            yield self.ids[i : i + 4]


class _Instant(PythonTool):
    """The python tool answering at once: what is left is the loop's own work."""

    def __init__(self) -> None:
        super().__init__(Sandbox())

    async def run(self, call: Call, ctx: Context) -> ToolResult:
        return ToolResult("42\n", {"outputs": None, "container_id": ctx.container,
                                   "harmony": {"result": "42\n", "tool": "python"}})


def _texts() -> list[str]:
    step = ("<|channel|>analysis<|message|>Let me compute this one more time, carefully.<|end|><|start|>assistant"
            "<|channel|>analysis to=python code<|message|>x = sum(range(100))\nprint(x)<|call|>")
    return [step] * STEPS + ["<|channel|>final<|message|>The answer is 42.<|return|>"]


async def _loop_turn(box: Toolbox, request: dict[str, Any], steps: list[list[int]]) -> float:
    prompt = render_responses_request(ENC, request, hosted=box.declarations()).tokens
    t0 = time.perf_counter()
    out = ResponsesStream(ENC, request=request, prompt_tokens=len(prompt))
    agent = Agent(box, ENC, request, "bench", prompt)
    agent.attach(out)
    out.feed([])
    rest = iter(steps[1:])

    async def emit(events: list[dict[str, Any]], last: bool) -> None:
        return None

    async def generate(prompt: list[int], limit: int | None) -> _Step:
        return _Step(next(rest))

    await drive(out, agent, _Step(steps[0]), generate, emit)
    return time.perf_counter() - t0


async def _plain_turn(request: dict[str, Any], ids: list[int]) -> float:
    t0 = time.perf_counter()
    out = ResponsesStream(ENC, request=request, prompt_tokens=100)
    out.feed([])
    step = _Step(ids)
    async for batch in step:
        out.feed(batch)
    out.close("stop")
    return time.perf_counter() - t0


def loop_cost() -> None:
    box = Toolbox(ENC)
    box.tools["python"] = _Instant()
    request = {"input": "compute", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}
    steps = [ENC.encode(t, allowed_special="all") for t in _texts()]
    flat = [t for s in steps for t in s]
    looped, plain = [], []
    for _ in range(REPEAT):
        looped.append(asyncio.run(_loop_turn(box, request, steps)))
        plain.append(asyncio.run(_plain_turn(request, flat)))
    lp, pp = statistics.median(looped), statistics.median(plain)
    print(f"agent loop, {STEPS} python steps + answer ({len(flat)} output tokens), tool run excluded:")
    print(f"  the turn: {lp * 1e3:.2f} ms; the same tokens as one plain turn: {pp * 1e3:.2f} ms "
          f"(ratio {lp / pp:.2f}x)")
    print(f"  the loop's own cost per tool step: {(lp - pp) / STEPS * 1e6:.0f} us (target < 1000 us)")


async def _kernel_times(sandbox: Sandbox) -> tuple[float, float]:
    starts, calls = [], []
    for i in range(8):
        k = Kernel(sandbox, 40 + i)
        t0 = time.perf_counter()
        await k.run("pass")
        starts.append(time.perf_counter() - t0)
        for _ in range(20):
            t0 = time.perf_counter()
            await k.run("x = 1")
            calls.append(time.perf_counter() - t0)
        await k.close()
    return statistics.median(starts), statistics.median(calls)


def sandbox_cost() -> None:
    sandboxed = asyncio.run(_kernel_times(Sandbox()))
    plain = asyncio.run(_kernel_times(Sandbox(isolation="none")))
    print("python sandbox (bubblewrap) against the same interpreter as a plain subprocess:")
    print(f"  start + first cell: {sandboxed[0] * 1e3:.1f} ms vs {plain[0] * 1e3:.1f} ms "
          f"(ratio {sandboxed[0] / plain[0]:.2f}x)")
    print(f"  one cell's round trip: {sandboxed[1] * 1e6:.0f} us vs {plain[1] * 1e6:.0f} us "
          f"(ratio {sandboxed[1] / plain[1]:.2f}x)")


if __name__ == "__main__":
    loop_cost()
    sandbox_cost()
