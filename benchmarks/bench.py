"""`make bench`: harmonykit against openai_harmony 0.0.8, measured in the same run.

Prints times and ratios (reference time / harmonykit time: above 1 means
harmonykit is faster). Targets from the issues: render >= 5x, batch parse >= 5x,
streaming per token <= 1/4 of the reference's cost, load no slower, and parse
cost linear in the output (1M tokens ~ 10x 100k).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai_harmony as oh
import reference  # noqa: F401 - sets up the reference's vocabulary, offline

import harmonykit as hk


def best(fn: Callable[[], Any], repeat: int = 5, number: int = 1) -> float:
    """Best time of ``repeat`` rounds, per call, in seconds."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return min(times)


def report(name: str, ours: float, theirs: float, unit: str = "ms", scale: float = 1e3) -> None:
    print(f"  {name:<46} harmonykit {ours * scale:9.3f} {unit}   reference {theirs * scale:9.3f} {unit}"
          f"   ratio {theirs / ours:6.2f}x")


def load_time(module: str) -> float:
    code = (f"import time, {module} as m\nt = time.perf_counter()\n"
            "m.load_harmony_encoding(m.HarmonyEncodingName.HARMONY_GPT_OSS)\n"
            "print(time.perf_counter() - t)")
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True, env=os.environ).stdout) for _ in range(3)]
    return min(runs)


def long_conversation(lib: Any, turns: int) -> Any:
    M, R = lib.Message, lib.Role
    dev = lib.DeveloperContent.new().with_instructions("Be brief.").with_function_tools([
        lib.ToolDescription.new("get_weather", "Gets the weather.", {
            "type": "object", "properties": {"location": {"type": "string", "description": "City"},
                                             "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["location"]}),
        lib.ToolDescription.new("search", "Searches the web.", {
            "type": "object", "properties": {"q": {"type": "string"}}}),
    ])
    msgs = [M.from_role_and_content(R.SYSTEM, lib.SystemContent.new().with_browser_tool()),
            M.from_role_and_content(R.DEVELOPER, dev)]
    prose = ("The weather in Paris is mild today, with light winds from the west and a chance of "
             "rain in the evening. Temperatures stay between 12 and 17 degrees. ") * 3
    for i in range(turns):
        msgs += [
            M.from_role_and_content(R.USER, f"Question {i}: what is the weather in Paris? " + prose),
            M.from_role_and_content(R.ASSISTANT, "Need the weather tool. " + prose).with_channel("analysis"),
            M.from_role_and_content(R.ASSISTANT, '{"location": "Paris"}').with_channel("commentary")
            .with_recipient("functions.get_weather").with_content_type("<|constrain|>json"),
            M.from_author_and_content(lib.Author.new(R.TOOL, "functions.get_weather"),
                                      '{"temp": 15, "sky": "cloudy"}').with_channel("commentary")
            .with_recipient("assistant"),
            M.from_role_and_content(R.ASSISTANT, prose).with_channel("final"),
        ]
    return lib.Conversation.from_messages(msgs)


def completion(enc: hk.HarmonyEncoding, n_tokens: int) -> list[int]:
    prose = "Let me think about this step by step, weighing each option with care. 😊 "
    para = prose * max(1, n_tokens // 36)
    text = (f"<|channel|>analysis<|message|>{para}<|end|><|start|>assistant<|channel|>commentary "
            f"to=functions.get_weather <|constrain|>json<|message|>{{\"location\": \"Paris\"}}<|call|>"
            f"<|start|>assistant<|channel|>final<|message|>{para}<|return|>")
    return enc.encode(text, allowed_special="all")[: n_tokens]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def agent_loop(enc: hk.HarmonyEncoding, ref: Any) -> None:
    """#17: an agent's next request re-sends its history; only the new message is new."""
    from workloads import agent_request

    from harmonykit.cache import disabled
    from harmonykit.openai import render_chat_request
    from harmonykit.openai.request import MESSAGE_CACHE

    request = agent_request(40)
    history = request["messages"]
    steps = iter(range(10**9))

    def next_step() -> dict[str, Any]:  # a new message each time, as an agent's next request
        return {**request, "messages": [*history, {"role": "user", "content": f"Step {next(steps)}: go on."}]}

    render_chat_request(enc, request)
    prompt = render_chat_request(enc, next_step())
    conversation = oh.Conversation.from_json(prompt.conversation.to_json())
    assert ref.render_conversation_for_completion(conversation, oh.Role.ASSISTANT) == prompt.tokens

    def cold() -> None:
        with disabled():
            render_chat_request(enc, next_step())

    t_cold = best(cold, repeat=5, number=3)
    t_warm = best(lambda: render_chat_request(enc, next_step()), repeat=5, number=20)
    t_ref = best(lambda: ref.render_conversation_for_completion(conversation, oh.Role.ASSISTANT), repeat=5)
    print(f"\nAgent loop: 40 turns, 10 tools, a call and a 3,000-character result each "
          f"({len(prompt.tokens)} tokens), one new message:")
    report("render_chat_request, history cached vs cold", t_warm, t_cold)
    report("  the same, vs the reference rendering it", t_warm, t_ref)

    # 100k distinct conversations: the message cache stays under its bound.
    MESSAGE_CACHE.clear()
    gc.collect()
    before = _rss_mb()
    for i in range(100_000):
        render_chat_request(enc, {"messages": [
            {"role": "user", "content": f"Question {i}: what is the weather in city {i % 977}?"},
            {"role": "assistant", "reasoning_content": f"Look up city {i}.", "content": f"It is {i % 40} degrees."},
            {"role": "user", "content": f"And tomorrow, for conversation {i}?"}]})
    print(f"  100k distinct conversations: message cache {MESSAGE_CACHE.used / 2**20:.1f} MB of its "
          f"{MESSAGE_CACHE.budget / 2**20:.0f} MB bound ({len(MESSAGE_CACHE)} entries); "
          f"resident size grew {_rss_mb() - before:.0f} MB")


def main() -> None:
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    ref = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    print("harmonykit vs openai_harmony 0.0.8 (ratio = reference time / harmonykit time)\n")

    print("Loading the encoding (fresh process each, best of 3):")
    report("load_harmony_encoding", load_time("harmonykit"), load_time("openai_harmony"))
    report("load again in the same process", best(lambda: hk.load_harmony_encoding("HarmonyGptOss")),
           best(lambda: oh.load_harmony_encoding("HarmonyGptOss"), repeat=3))

    print("\nRendering:")
    ours_convo, ref_convo = long_conversation(hk, 105), long_conversation(oh, 105)
    n = len(enc.render_conversation_for_completion(ours_convo, hk.Role.ASSISTANT))
    assert n == len(ref.render_conversation_for_completion(ref_convo, oh.Role.ASSISTANT))
    t_ours = best(lambda: enc.render_conversation_for_completion(ours_convo, hk.Role.ASSISTANT))
    t_ref = best(lambda: ref.render_conversation_for_completion(ref_convo, oh.Role.ASSISTANT))
    report(f"long conversation, {n} tokens", t_ours, t_ref)
    print(f"  {'':<46} harmonykit {n / t_ours / 1e6:6.2f} M tok/s   reference {n / t_ref / 1e6:6.2f} M tok/s")
    text = enc.decode_utf8(enc.render_conversation_for_completion(ours_convo, hk.Role.ASSISTANT))
    t_bpe = best(lambda: enc.bpe.encode(text, allowed_special="all"))
    print(f"  {'(tiktoken encoding the same text)':<46} {t_bpe * 1e3:9.3f} ms")

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from scenarios import SCENARIOS, render

    t_ours = best(lambda: [render(hk, enc, s) for s in SCENARIOS.values()], number=5)
    t_ref = best(lambda: [render(oh, ref, s) for s in SCENARIOS.values()], number=5)
    report(f"the {len(SCENARIOS)} golden scenarios (build + render)", t_ours, t_ref)

    agent_loop(enc, ref)

    print("\nParsing (batch, parse_messages_from_completion_tokens):")
    for size in (1000, 8000):
        toks = completion(enc, size)
        assert [m.to_dict() for m in enc.parse_messages_from_completion_tokens(toks, hk.Role.ASSISTANT)] == \
            [m.to_dict() for m in ref.parse_messages_from_completion_tokens(toks, oh.Role.ASSISTANT)]
        report(f"{len(toks)}-token completion",
               best(lambda t=toks: enc.parse_messages_from_completion_tokens(t, hk.Role.ASSISTANT), number=5),
               best(lambda t=toks: ref.parse_messages_from_completion_tokens(t, oh.Role.ASSISTANT), number=5))

    print("\nStreaming (process + last_content_delta, per token):")
    for size in (1000, 8000):
        toks = completion(enc, size)

        def ours(t: list[int] = toks) -> None:
            p = hk.StreamableParser(enc, hk.Role.ASSISTANT)
            for tok in t:
                p.process(tok)
                p.last_content_delta  # noqa: B018

        def theirs(t: list[int] = toks) -> None:
            p = oh.StreamableParser(ref, oh.Role.ASSISTANT)
            for tok in t:
                p.process(tok)
                p.last_content_delta  # noqa: B018

        report(f"{len(toks)}-token completion", best(ours, 3) / len(toks), best(theirs, 3) / len(toks),
               unit="us", scale=1e6)
    toks = completion(enc, 8000)
    t_loop = best(lambda: [enc._token_bytes(t).decode("utf-8", "replace") for t in toks], 3) / len(toks)
    print(f"  {'(a plain loop decoding each token)':<46} {t_loop * 1e6:9.3f} us")

    print("\nScaling (tolerant mode, harmonykit only): time for 1M tokens / time for 100k")
    word = enc.encode(" word")
    for name, prefix, suffix in [
        ("header that never ends", [], []),
        ("one long body", enc.encode("<|channel|>final<|message|>", allowed_special="all"), [200002]),
    ]:
        times = []
        for n in (100_000, 1_000_000):
            toks = prefix + word * n + suffix
            times.append(best(lambda t=toks: enc.parse_completion(t), repeat=1))
        print(f"  {name:<46} 100k {times[0] * 1e3:8.1f} ms   1M {times[1] * 1e3:8.1f} ms"
              f"   ratio {times[1] / times[0]:5.1f} (linear: 10)")
        p = hk.StreamableParser(enc, hk.Role.ASSISTANT, strict=False)
        toks = prefix + word * 1_000_000 + suffix
        t = time.perf_counter()
        for tok in toks:
            p.process(tok)
        p.process_eos()
        print(f"  {'  same, streamed token by token (1M)':<46} {(time.perf_counter() - t) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
